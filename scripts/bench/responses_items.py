#!/usr/bin/env python3
"""Responses bodies before and after a change: two Compactor builds side by side, in one run.

Each build is started in front of the same mock (scripts/bench/slow_mock.py, which answers any
POST at once and summary requests without delay), with a memory store. For each build, one
compaction is asked for (an input ending in `compaction_trigger`), and its sealed `compaction`
item is used in the bodies measured:

- `plain`: a conversation of --turns turns and a new user message;
- `word`: the same, with the word "compaction" in one user message (the text alone, no item);
- `item`: what Codex sends after a compaction: the user messages, the item, then --turns more
  turns and a new user message.

Requests are sent one at a time on a kept-alive connection (http.client), --requests per body and
build per round, the builds in rotating order each round; the mock itself, called directly, is the
floor. Prints a markdown table of median latencies and of the added median (build minus direct),
and writes it to --out.

usage: responses_items.py --before BIN --after BIN [--before-name N] [--after-name N]
                          [--rounds 5] [--requests 200] [--turns 40] [--out FILE]
"""
import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = "gpt-4.1"  # a 1M-token window: measured and forwarded, never compacted here


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port, proc, what):
    deadline = time.time() + 30
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{what} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"{what} is not listening on {port}")


def words(seed, n):
    return " ".join(f"w{seed}x{i}" for i in range(n))


def user(text):
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def assistant(text):
    return {"type": "message", "role": "assistant",
            "content": [{"type": "output_text", "text": text}]}


def turns(first, count, size):
    items = []
    for t in range(first, first + count):
        items.append(user(f"turn {t}: {words(t, size)}"))
        items.append({"type": "function_call", "call_id": f"call_{t}", "name": "shell",
                      "arguments": json.dumps({"command": ["cat", f"src/file_{t}.rs"]})})
        items.append({"type": "function_call_output", "call_id": f"call_{t}",
                      "output": words(t + 1000, size)})
        items.append(assistant(f"done with turn {t}"))
    return items


HEAD = [{"type": "message", "role": "developer",
         "content": [{"type": "input_text", "text": "You are a careful coding agent."}]}]


def body(items):
    return json.dumps({"model": MODEL, "stream": False, "store": False, "input": items}).encode()


class Client:
    """One kept-alive connection."""

    def __init__(self, port):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def post(self, path, data):
        started = time.perf_counter()
        self.conn.request("POST", path, body=data, headers={
            "content-type": "application/json", "authorization": "Bearer sk-bench"})
        response = self.conn.getresponse()
        payload = response.read()
        elapsed = time.perf_counter() - started
        if response.status != 200:
            sys.exit(f"{path}: {response.status} {payload[:300]!r}")
        return elapsed, payload


def start_compactor(binary, mock_port, name):
    port = free_port()
    # The mock answers summaries as chat completions: the summarizer is named so.
    env = dict(os.environ, COMPACTOR_LOG="warn",
               COMPACTOR_SUMMARIZER__UPSTREAM=f"http://127.0.0.1:{mock_port}/v1")
    proc = subprocess.Popen(
        [binary, "serve", "--listen", f"127.0.0.1:{port}",
         "--upstream", f"http://127.0.0.1:{mock_port}/v1", "--store", "memory"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_listening(port, proc, name)
    return proc, port


def bodies_for(port, args):
    """The three bodies, with a compaction item this build minted for this client."""
    conversation = HEAD + turns(0, args.turns, args.size)
    trigger = conversation + [{"type": "compaction_trigger"}]
    _, answer = Client(port).post("/v1/responses", body(trigger))
    output = json.loads(answer)["output"]
    item = next(i for i in output if i.get("type") == "compaction")
    with_word = list(conversation)
    with_word[1] = user("keep the compaction notes short: " + words(0, args.size))
    after = (HEAD + [i for i in conversation if i.get("role") == "user"] + [item]
             + turns(args.turns, args.turns, args.size) + [user("and now?")])
    return {
        "plain": body(conversation + [user("and now?")]),
        "word": body(with_word + [user("and now?")]),
        "item": body(after),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", required=True)
    ap.add_argument("--before-name", default="before")
    ap.add_argument("--after-name", default="after")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--turns", type=int, default=40)
    ap.add_argument("--size", type=int, default=60, help="words per message")
    ap.add_argument("--out")
    args = ap.parse_args()

    mock_port = free_port()
    mock = subprocess.Popen([sys.executable, os.path.join(HERE, "slow_mock.py"),
                             "--port", str(mock_port), "--summary-delay", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs = [mock]
    try:
        wait_listening(mock_port, mock, "the mock")
        builds = {}
        for name, binary in ((args.before_name, args.before), (args.after_name, args.after)):
            proc, port = start_compactor(binary, mock_port, name)
            procs.append(proc)
            builds[name] = (port, bodies_for(port, args))
        kinds = ["plain", "word", "item"]
        sizes = {kind: len(builds[args.after_name][1][kind]) for kind in kinds}
        # name -> kind -> per-round medians (seconds)
        medians = {name: {k: [] for k in kinds} for name in ["direct", *builds]}
        order = ["direct", *builds]
        load = [os.getloadavg()[0]]
        for r in range(args.rounds):
            rotated = order[r % len(order):] + order[:r % len(order)]
            for name in rotated:
                for kind in kinds:
                    if name == "direct":
                        port = mock_port
                        data = builds[args.after_name][1][kind]
                        path = "/v1/responses"
                    else:
                        port, bodies = builds[name]
                        data = bodies[kind]
                        path = "/v1/responses"
                    client = Client(port)
                    client.post(path, data)  # warm: counts cached, connection open
                    times = [client.post(path, data)[0] for _ in range(args.requests)]
                    medians[name][kind].append(statistics.median(times))
            load.append(os.getloadavg()[0])
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()

    def ms(x):
        return f"{x * 1000:.3f}"

    lines = [
        "# Responses bodies before and after, " + time.strftime("%Y-%m-%d %H:%M"),
        "",
        f"- Machine: {os.cpu_count()} cores; load average (1 min) at start / end / highest: "
        f"{load[0]:.2f} / {load[-1]:.2f} / {max(load):.2f}"
        + (" — other work was running: compare the builds' ratio, not absolute figures"
           if max(load) > 1.5 else ""),
        f"- Command: `scripts/bench/responses_items.py {' '.join(sys.argv[1:])}`",
        f"- Bodies ({args.turns} turns of {args.size}-word messages): "
        + ", ".join(f"`{k}` {sizes[k] / 1024:.0f} KB" for k in kinds)
        + "; model `gpt-4.1` (1M window: measured and forwarded, never compacted).",
        f"- {args.rounds} rounds × {args.requests} sequential requests per body and build, on one "
        "kept-alive connection; the builds' order rotates each round; figures are the median "
        "over rounds of each round's median latency. Added = build minus direct (the mock alone).",
        "",
        f"| body | direct p50 (ms) | {args.before_name} p50 / added (ms) | "
        f"{args.after_name} p50 / added (ms) | added, {args.after_name} ÷ {args.before_name} |",
        "|---|---|---|---|---|",
    ]
    for kind in kinds:
        direct = statistics.median(medians["direct"][kind])
        before = statistics.median(medians[args.before_name][kind])
        after = statistics.median(medians[args.after_name][kind])
        added_before, added_after = before - direct, after - direct
        ratio = added_after / added_before if added_before > 0 else float("nan")
        lines.append(f"| `{kind}` | {ms(direct)} | {ms(before)} / +{ms(added_before)} | "
                     f"{ms(after)} / +{ms(added_after)} | {ratio:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
