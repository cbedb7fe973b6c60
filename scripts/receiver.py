#!/usr/bin/env python3
"""A webhook receiver for trying hookq on one machine: it checks every
request's Standard Webhooks signature with the official `standardwebhooks`
library (pip install standardwebhooks), answers 204 when it verifies and 401
when it does not, and prints one line per request.

    python3 scripts/receiver.py PORT SECRET

SECRET is the `whsec_...` secret hookq signs with (delivery.signing_secrets).
Listens on 127.0.0.1 only.
"""
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

try:
    from standardwebhooks.webhooks import Webhook, WebhookVerificationError
except ImportError:
    sys.exit("the standardwebhooks library is missing: python3 -m pip install standardwebhooks")


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    port, secret = int(sys.argv[1]), sys.argv[2]
    webhook = Webhook(secret)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            headers = {k.lower(): v for k, v in self.headers.items()}
            try:
                webhook.verify(body, headers)
                verdict, status = "verified", 204
            except WebhookVerificationError as err:
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

    print(f"receiver listening on http://127.0.0.1:{port}/", flush=True)
    HTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
