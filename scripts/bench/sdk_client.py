"""The real-SDK row of the load benchmark: the OpenAI Python SDK as applications use it.

One `OpenAI` client per base URL (httpx underneath, connections kept alive between requests),
sequential chat completions, non-streaming and streaming; prints one JSON object with the wall
time of each request in seconds (a streaming request ends when its last event has been read) and,
for streams, the time until the SDK yields the first event (`sse_first`).
Run with an interpreter that has `openai` installed (scripts/bench.sh makes one).
"""
import argparse
import json
import time

from openai import OpenAI


def timed(n, warmup, call):
    times = []
    for i in range(n + warmup):
        started = time.perf_counter()
        call()
        if i >= warmup:
            times.append(time.perf_counter() - started)
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--base-url", required=True, help="base URL answering JSON completions")
    ap.add_argument("--sse-base-url", required=True, help="base URL answering SSE streams")
    ap.add_argument("--api-key", default="sk-bench")
    ap.add_argument("--model", default="mock")
    ap.add_argument("-n", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    a = ap.parse_args()

    messages = [{"role": "user", "content": "Say hello."}]
    plain = OpenAI(base_url=a.base_url, api_key=a.api_key, max_retries=0)
    streaming = OpenAI(base_url=a.sse_base_url, api_key=a.api_key, max_retries=0)

    def complete():
        plain.chat.completions.create(model=a.model, messages=messages, max_tokens=16)

    firsts = []

    def stream():
        started = time.perf_counter()
        first = None
        for _ in streaming.chat.completions.create(model=a.model, messages=messages,
                                                  max_tokens=16, stream=True):
            if first is None:
                first = time.perf_counter() - started
        firsts.append(first)

    out = {"json": timed(a.n, a.warmup, complete), "sse": timed(a.n, a.warmup, stream)}
    out["sse_first"] = firsts[a.warmup:]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
