#!/usr/bin/env python3
"""A small OpenAI-shaped upstream for the parts of the load benchmark that nginx cannot serve.

Standard library only (asyncio), HTTP/1.1 with keep-alive.

- A request carrying the header `x-compactor-purpose: summary` is answered with a fixed
  non-streaming summary completion after SUMMARY_DELAY seconds (default 2 s): the slow summarizer.
- A streaming POST (`"stream": true`) to a path containing `slow-sse` gets an SSE stream that sends
  one chunk every `--chunk-interval` seconds, `--chunks` chunks, then `[DONE]`; each chunk's
  content carries its send time (`w<i>@<CLOCK_MONOTONIC seconds>`), so a client sees held-back chunks.
  A body field `"user": "slow:<ms>ms:<n>"`, or a path containing `slow-sse-<ms>ms-<n>`, sets
  interval and count for that one stream.
- Any other POST gets a fixed chat completion at once (or, when the JSON body says
  `"stream": true`, the fixed SSE stream at once).
- `GET /stats` returns counters as JSON (summary requests seen, streams open, ...).

Usage: slow_mock.py --port 18090 [--summary-delay 2] [--chunk-interval 1.0] [--chunks 20]
"""
import argparse
import asyncio
import json
import re
import time

STATS = {"requests": 0, "summary_requests": 0, "streams_open": 0, "streams_max": 0,
         "slow_streams_started": 0}

COMPLETION = {
    "id": "chatcmpl-mock", "object": "chat.completion", "created": 1700000000,
    "model": "mock", "system_fingerprint": "fp_mock",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello from the mock."},
                 "logprobs": None, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 0, "completion_tokens": 5, "total_tokens": 5},
}

SUMMARY_TEXT = (
    "## Goal\nBenchmark summary produced by the slow mock summarizer.\n\n"
    "## Constraints and preferences\n- none\n\n## Progress\n### Done\n- earlier turns\n"
    "### In progress\n- the current task\n### Blocked\n- nothing\n\n"
    "## Key decisions\n- none recorded (mock)\n\n## Next steps\n- continue\n\n"
    "## Critical context\n- mock summary\n"
)
SUMMARY = dict(COMPLETION, id="chatcmpl-mock-summary",
               choices=[{"index": 0, "message": {"role": "assistant", "content": SUMMARY_TEXT},
                         "logprobs": None, "finish_reason": "stop"}],
               usage={"prompt_tokens": 0, "completion_tokens": 120, "total_tokens": 120})


def chunk(i, content=None, finish=None):
    delta = {} if content is None else {"content": content}
    if i == 0:
        delta["role"] = "assistant"
    return {"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 1700000000,
            "model": "mock", "system_fingerprint": "fp_mock",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}


def sse_event(obj):
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


FAST_SSE = (b"".join(sse_event(chunk(i, w)) for i, w in enumerate(["Hello", " from", " the", " mock."]))
            + sse_event(chunk(4, None, "stop")) + b"data: [DONE]\n\n")


def head(status, ctype, length=None, extra=b""):
    h = b"HTTP/1.1 " + status + b"\r\ncontent-type: " + ctype + b"\r\n"
    if length is None:
        h += b"transfer-encoding: chunked\r\ncache-control: no-cache\r\n"
    else:
        h += b"content-length: " + str(length).encode() + b"\r\n"
    return h + extra + b"\r\n"


def chunked(data):
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def read_request(reader):
    line = await reader.readline()
    if not line:
        return None
    method, target, _ = line.decode("latin-1").split(" ", 2)
    headers = {}
    while True:
        h = await reader.readline()
        if h in (b"\r\n", b"\n", b""):
            break
        k, _, v = h.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    body = b""
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        parts = []
        while True:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
                break
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
        body = b"".join(parts)
    return method, target, headers, body


def wants_stream(body):
    if b'"stream"' not in body:
        return False
    try:
        return bool(json.loads(body).get("stream"))
    except ValueError:
        return False


async def handle(reader, writer, args):
    try:
        while True:
            req = await read_request(reader)
            if req is None:
                break
            method, target, headers, body = req
            STATS["requests"] += 1
            if method == "GET" and target.startswith("/stats"):
                data = json.dumps(STATS).encode()
                writer.write(head(b"200 OK", b"application/json", len(data)) + data)
            elif headers.get("x-compactor-purpose", "").lower() == "summary":
                STATS["summary_requests"] += 1
                await asyncio.sleep(args.summary_delay)
                data = json.dumps(SUMMARY).encode()
                writer.write(head(b"200 OK", b"application/json", len(data)) + data)
            elif "slow-sse" in target and wants_stream(body):
                STATS["slow_streams_started"] += 1
                STATS["streams_open"] += 1
                STATS["streams_max"] = max(STATS["streams_max"], STATS["streams_open"])
                interval, chunks = args.chunk_interval, args.chunks
                m = (re.search(rb'"user"\s*:\s*"slow:(\d+)ms:(\d+)"', body)
                     or re.search(r"slow-sse-(\d+)ms-(\d+)", target))
                if m:
                    interval, chunks = int(m.group(1)) / 1000, int(m.group(2))
                try:
                    writer.write(head(b"200 OK", b"text/event-stream"))
                    for i in range(chunks):
                        ev = sse_event(chunk(i, f"w{i}@{time.monotonic():.6f} "))
                        writer.write(chunked(ev))
                        await writer.drain()
                        await asyncio.sleep(interval)
                    writer.write(chunked(sse_event(chunk(chunks, None, "stop"))))
                    writer.write(chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n")
                finally:
                    STATS["streams_open"] -= 1
            elif wants_stream(body):
                writer.write(head(b"200 OK", b"text/event-stream", len(FAST_SSE)) + FAST_SSE)
            else:
                data = json.dumps(COMPLETION).encode()
                writer.write(head(b"200 OK", b"application/json", len(data)) + data)
            await writer.drain()
            if headers.get("connection", "").lower() == "close":
                break
    except (ConnectionError, asyncio.IncompleteReadError, ValueError):
        pass
    finally:
        try:
            writer.close()
        except Exception:
            pass


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--summary-delay", type=float, default=2.0)
    ap.add_argument("--chunk-interval", type=float, default=1.0)
    ap.add_argument("--chunks", type=int, default=20)
    args = ap.parse_args()
    server = await asyncio.start_server(lambda r, w: handle(r, w, args), "127.0.0.1", args.port,
                                        backlog=4096, limit=1 << 24)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
