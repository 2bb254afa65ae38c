"""Test-only stub provider for the container smoke test (see README.md).

Answers GET /v1/models, and POST /v1/chat/completions with a fixed reply, or a summary when the
request is Compactor's own summary request (header x-compactor-purpose: summary). GET
/stub/counts reports how many of each it answered, so a test can tell whether a replica wrote a
new summary or reused a stored one. Nothing is forwarded anywhere. `--health` checks that a
running stub answers.

With STUB_REQUIRED_KEY set, /v1/ requests that do not carry `Bearer <that key>` are refused
with 401, which shows that a sidecar replaced the agent's key with the one it holds.
"""

import json
import os
import sys
import urllib.request
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REQUIRED_KEY = os.environ.get("STUB_REQUIRED_KEY", "")
counts = {"chats": 0, "summaries": 0}
lock = threading.Lock()


def completion(text):
    return {
        "id": "stub",
        "object": "chat.completion",
        "model": "stub-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def refused(self):
        if REQUIRED_KEY and self.path.startswith("/v1/"):
            if self.headers.get("authorization") != f"Bearer {REQUIRED_KEY}":
                self.reply(401, {"error": {"message": "wrong key", "type": "invalid_request_error"}})
                return True
        return False

    def do_GET(self):
        if self.refused():
            return
        if self.path == "/v1/models":
            self.reply(200, {"object": "list", "data": [{"id": "stub-model", "object": "model"}]})
        elif self.path == "/stub/counts":
            with lock:
                self.reply(200, dict(counts))
        else:
            self.reply(404, {"error": {"message": "not found", "type": "invalid_request_error"}})

    def do_POST(self):
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        if self.refused():
            return
        if self.path != "/v1/chat/completions":
            self.reply(404, {"error": {"message": "not found", "type": "invalid_request_error"}})
            return
        summary = self.headers.get("x-compactor-purpose") == "summary"
        with lock:
            counts["summaries" if summary else "chats"] += 1
            n = counts["summaries"]
        if summary:
            text = (
                f"## Goal\nStub summary {n}.\n## Progress\nsteps taken\n"
                "## Next steps\ncontinue\n## Critical context\nnone"
            )
        else:
            text = "Hello from the stub."
        self.reply(200, completion(text))

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    if sys.argv[1:] == ["--health"]:
        # The container's health check: the stub answers.
        urllib.request.urlopen("http://127.0.0.1:8080/stub/counts", timeout=2)
        sys.exit(0)
    ThreadingHTTPServer(("0.0.0.0", 8080), Handler).serve_forever()
