"""A scripted OpenAI Responses upstream that records what a client sends.

Used to record the Codex request sequences in `tests/fixtures/codex/` (see `record_codex.sh`):
every request (path, the headers that matter, body) is appended to a JSON-lines file, and
`POST /v1/responses` is answered with a valid, minimal SSE stream:

- an `input` that ends in `{"type":"compaction_trigger"}` gets exactly one `compaction`
  output item (what Codex's remote compaction requires);
- with `--tool-call`, a turn whose last item is a user message gets one `function_call`
  (`exec_command`, `seq 1 60`), and the turn's next request (ending in its output) gets text;
- anything else gets a one-line text answer.

`usage.input_tokens` reports `--input-tokens` (default 100), so a client's own compaction can
be provoked by reporting a large figure; once the client sends a `compaction` item back, usage
drops to 100, so the client does not compact again and again.

    python3 responses_stub.py --port 19501 --log requests.jsonl [--tool-call] [--input-tokens N]
"""

import argparse
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# Headers worth recording; credentials and machine-specific ones are left out.
KEPT_HEADERS = (
    "content-type",
    "accept",
    "originator",
    "session-id",
    "thread-id",
    "x-client-request-id",
    "x-codex-window-id",
    "x-codex-beta-features",
    "x-codex-turn-metadata",
    "openai-beta",
)


class Counter:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.n = 0

    def next(self) -> int:
        with self.lock:
            self.n += 1
            return self.n


def sse(event: dict) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


def answer_items(body: dict, n: int, tool_call: bool) -> list[dict]:
    items = body.get("input") or []
    last = items[-1] if items and isinstance(items[-1], dict) else {}
    if last.get("type") == "compaction_trigger":
        return [{"type": "compaction", "id": f"cmp_{n}", "encrypted_content": f"stub-compaction-{n}"}]
    if tool_call and last.get("type") == "message" and last.get("role") == "user":
        return [
            {
                "type": "function_call",
                "id": f"fc_{n}",
                "status": "completed",
                "name": "exec_command",
                "arguments": json.dumps({"cmd": "seq 1 60"}),
                "call_id": f"call_{n}",
            }
        ]
    return [
        {
            "type": "message",
            "id": f"msg_{n}",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": f"stub answer {n}", "annotations": []}],
        }
    ]


def stream_events(body: dict, n: int, tool_call: bool, input_tokens: int) -> list[dict]:
    items = answer_items(body, n, tool_call)
    compacted = any(isinstance(i, dict) and i.get("type") == "compaction" for i in body.get("input") or [])
    if compacted:
        input_tokens = 100
    response = {
        "id": f"resp_{n}",
        "object": "response",
        "status": "in_progress",
        "model": body.get("model", "stub"),
        "output": [],
    }
    events = [{"type": "response.created", "response": dict(response)}]
    for index, item in enumerate(items):
        events.append({"type": "response.output_item.added", "output_index": index, "item": item})
        if item["type"] == "message":
            events.append(
                {
                    "type": "response.output_text.delta",
                    "item_id": item["id"],
                    "output_index": index,
                    "content_index": 0,
                    "delta": item["content"][0]["text"],
                }
            )
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    done = dict(response, status="completed", output=items)
    done["usage"] = {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + 5,
    }
    events.append({"type": "response.completed", "response": done})
    return events


def make_handler(args, counter: Counter, log_lock: threading.Lock):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *rest):  # quiet: the JSON-lines file is the record
            pass

        def record(self, body) -> int:
            n = counter.next()
            entry = {
                "n": n,
                "method": self.command,
                "path": self.path,
                "headers": {k: self.headers[k] for k in KEPT_HEADERS if k in self.headers},
                "body": body,
            }
            with log_lock, open(args.log, "a", encoding="utf-8") as f:
                f.write(json.dumps(entry) + "\n")
            return n

        def reply(self, status: int, payload: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_GET(self):
            self.record(None)
            # Websocket upgrades and model listings: not offered, the client falls back to POST.
            self.reply(404, b'{"error":{"message":"not here","type":"invalid_request_error"}}',
                       "application/json")

        def do_POST(self):
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length)
            try:
                body = json.loads(raw)
            except ValueError:
                body = {"unparsed": raw.decode("utf-8", "replace")}
            n = self.record(body)
            if not self.path.rstrip("/").endswith("/responses"):
                self.reply(404, b'{"error":{"message":"not here","type":"invalid_request_error"}}',
                           "application/json")
                return
            payload = b"".join(
                sse(e) for e in stream_events(body, n, args.tool_call, args.input_tokens)
            )
            self.reply(200, payload, "text/event-stream")

    return Handler


class QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # clients that drop their websocket attempts reset connections; not an error here


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--tool-call", action="store_true")
    parser.add_argument("--input-tokens", type=int, default=100)
    args = parser.parse_args()
    server = QuietServer(
        ("127.0.0.1", args.port), make_handler(args, Counter(), threading.Lock())
    )
    print(f"stub listening on {args.port}", file=sys.stderr, flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
