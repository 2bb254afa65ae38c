"""The real-SDK row of the load benchmark: the OpenAI Python SDK as applications use it.

One `OpenAI` client per system and kind (httpx underneath, connections kept alive between
requests), sequential chat completions, non-streaming and streaming. The systems are measured
interleaved, request by request, in an order that rotates at every step: the host's slow and
quick moments fall on every system alike, so the difference between two systems' medians is the
difference they make, not when each happened to run. Prints one JSON object: per system, the
wall time of each request in seconds (a streaming request ends when its last event has been
read) and, for streams, the time until the SDK yields the first event (`sse_first`).
Run with an interpreter that has `openai` installed (scripts/bench.sh makes one).
"""
import argparse
import json
import time

from openai import OpenAI

MESSAGES = [{"role": "user", "content": "Say hello."}]


def interleaved(systems, n, warmup, call):
    """Runs `call(system)` n + warmup times for each system, one system after another in an
    order rotated by one at every step; returns each system's timings after the warm-up."""
    times = {name: [] for name, _ in systems}
    for i in range(n + warmup):
        shift = i % len(systems)
        for name, client in systems[shift:] + systems[:shift]:
            started = time.perf_counter()
            extra = call(client)
            if i >= warmup:
                times[name].append((time.perf_counter() - started, extra))
    return times


def complete(client, model):
    client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=16)


def stream(client, model):
    """Reads a whole stream; returns the time until the first event."""
    started = time.perf_counter()
    first = None
    for _ in client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=16,
                                            stream=True):
        if first is None:
            first = time.perf_counter() - started
    return first


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--system", action="append", required=True, metavar="NAME=BASE,SSE_BASE",
                    help="a system to measure: its name, the base URL answering JSON "
                         "completions and the one answering SSE streams (repeatable)")
    ap.add_argument("--api-key", default="sk-bench")
    ap.add_argument("--model", default="mock")
    ap.add_argument("-n", type=int, default=300, help="requests per system and kind")
    ap.add_argument("--warmup", type=int, default=20)
    a = ap.parse_args()

    plain, streaming = [], []
    for spec in a.system:
        name, urls = spec.split("=", 1)
        base, sse_base = urls.split(",", 1)
        plain.append((name, OpenAI(base_url=base, api_key=a.api_key, max_retries=0)))
        streaming.append((name, OpenAI(base_url=sse_base, api_key=a.api_key, max_retries=0)))

    json_times = interleaved(plain, a.n, a.warmup, lambda c: complete(c, a.model))
    sse_times = interleaved(streaming, a.n, a.warmup, lambda c: stream(c, a.model))
    out = {name: {"json": [t for t, _ in json_times[name]],
                  "sse": [t for t, _ in sse_times[name]],
                  "sse_first": [first for _, first in sse_times[name]]}
           for name, _ in plain}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
