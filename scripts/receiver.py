#!/usr/bin/env python3
"""A webhook receiver for trying hookq on one machine: it checks every
request's Standard Webhooks signature, answers 204 when it verifies and 401
when it does not, and prints one line per request.

    python3 scripts/receiver.py PORT SECRET

SECRET is the `whsec_...` secret hookq signs with (delivery.signing_secrets).
The check needs only Python's standard library (HMAC-SHA256 over
`{webhook-id}.{webhook-timestamp}.{body}` with the secret's key, compared in
constant time with each `v1,<base64>` of `webhook-signature`; a timestamp
more than 5 minutes off is refused). When the official `standardwebhooks`
library can be imported (e.g. in a venv: pip install standardwebhooks), every
request is verified by it as well, and must pass both. Each line names the
checks that ran. Listens on 127.0.0.1 only.
"""
import base64
import binascii
import hashlib
import hmac
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

# How far webhook-timestamp may be from this machine's clock, either way
# (the Standard Webhooks libraries' tolerance).
TOLERANCE_SECS = 5 * 60


class Refused(Exception):
    """A request whose signature does not verify; the message says why."""


def secret_key(secret: str) -> bytes:
    """The HMAC key of a `whsec_<base64>` secret."""
    encoded = secret[len("whsec_"):] if secret.startswith("whsec_") else secret
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        sys.exit(f"SECRET is not whsec_ followed by base64: {secret!r}")


def verify_stdlib(key: bytes, headers: dict, body: bytes) -> None:
    """Checks a Standard Webhooks signature with the standard library only;
    raises Refused naming the reason."""
    msg_id = headers.get("webhook-id")
    timestamp = headers.get("webhook-timestamp")
    signatures = headers.get("webhook-signature")
    if not msg_id or not timestamp or not signatures:
        raise Refused("missing webhook-id, webhook-timestamp or webhook-signature")
    try:
        sent_at = int(timestamp)
    except ValueError:
        raise Refused(f"webhook-timestamp is not a number: {timestamp!r}") from None
    if abs(time.time() - sent_at) > TOLERANCE_SECS:
        raise Refused(f"webhook-timestamp {sent_at} is more than 5 minutes off")
    signed = msg_id.encode() + b"." + timestamp.encode() + b"." + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest())
    for signature in signatures.split():
        version, _, value = signature.partition(",")
        if version == "v1" and hmac.compare_digest(value.encode(), expected):
            return
    raise Refused("no v1 signature matches")


def official_verifier(secret: str):
    """The official library's check, or None when it cannot be imported."""
    try:
        from standardwebhooks.webhooks import Webhook, WebhookVerificationError
    except ImportError:
        return None
    webhook = Webhook(secret)

    def verify(headers: dict, body: bytes) -> None:
        try:
            webhook.verify(body, headers)
        except WebhookVerificationError as err:
            raise Refused(f"standardwebhooks: {err}") from None

    return verify


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    try:
        port = int(sys.argv[1])
    except ValueError:
        sys.exit(f"PORT is not a number: {sys.argv[1]!r}")
    secret = sys.argv[2]
    key = secret_key(secret)
    official = official_verifier(secret)
    checks = "stdlib, standardwebhooks" if official else "stdlib"

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            headers = {k.lower(): v for k, v in self.headers.items()}
            try:
                verify_stdlib(key, headers, body)
                if official:
                    official(headers, body)
                verdict, status = f"verified ({checks})", 204
            except Refused as err:
                verdict, status = f"REFUSED ({err})", 401
            print(f"{verdict}: webhook-id {headers.get('webhook-id')} "
                  f"attempt {headers.get('hookq-attempt')} body {body.decode(errors='replace')}",
                  flush=True)
            self.send_response(status)
            self.end_headers()

        do_PUT = do_POST
        do_PATCH = do_POST

        def log_message(self, *args) -> None:
            pass

    # Bound before it says it listens: a job sent on that line must find it.
    server = HTTPServer(("127.0.0.1", port), Handler)
    print(f"receiver listening on http://127.0.0.1:{port}/, checking signatures with: {checks}",
          flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
