"""Verifies hookq's signed requests with the official `standardwebhooks` library.

Reads {"secret": "whsec_...", "requests": [{"headers": {...}, "body": "..."}]}
on stdin and prints one line per request: "ok" or "fail: <reason>".
"""
import json
import sys

from standardwebhooks.webhooks import Webhook

payload = json.load(sys.stdin)
webhook = Webhook(payload["secret"])
for request in payload["requests"]:
    try:
        webhook.verify(request["body"].encode(), request["headers"], json_parse=False)
        print("ok")
    except Exception as err:  # the library raises its own verification error
        print(f"fail: {err}")
