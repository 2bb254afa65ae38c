#!/usr/bin/env python3
"""A ~200k-token conversation plus one turn, in all three dialects, cold and warm: what Compactor
adds to a large body beside the mock reached directly.

The conversation is the largest real session in --data, cut to --tokens (scripts/bench/
conversation.py), sent as:

- `chat`: chat completions, as recorded;
- `responses`: the same turns as Responses input items (messages, function calls and outputs);
- `responses+item`: what Codex sends after a compaction: the user messages, a `compaction` item
  this Compactor minted (asked for with a `compaction_trigger`), then the turns;
- `messages`: Anthropic Messages (system apart, tool calls as `tool_use`, results as
  `tool_result`).

The model names carry a suffix given a 1M-token window in the run's config, so the bodies are
measured and forwarded, never compacted. Cold: every message new to the proxy (a nonce in each);
warm: the conversation the proxy has just seen, one turn longer each request. Requests are sent
one at a time on a kept-alive connection (http.client); direct and Compactor alternate per
request, so both see the same moments of the machine. Prints a markdown table; --out writes it.

Several builds (`--compactor NAME=PATH`, repeated) are measured in one run, each request sent
to each in an order rotating request by request; the proxy's own count of its time
(`x-compactor-overhead-ms`) is reported beside the added latency. --dump writes each dialect's
first warm body (for `examples/large_stages.rs`).

usage: large_dialects.py --compactor [NAME=]BIN [--compactor NAME=BIN ...] [--tokens 200000]
                         [--cold 5] [--warm 20] [--dump DIR] [--out FILE]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import conversation  # noqa: E402
from responses_items import Client, free_port, wait_listening  # noqa: E402

SUFFIX = "-bench-large"
CHAT_MODEL = "gpt-4.1" + SUFFIX
CLAUDE_MODEL = "claude-sonnet-4-5" + SUFFIX


def text_of(msg):
    c = msg.get("content")
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        return "\n".join(p["text"] for p in c if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def to_responses(messages):
    items = []
    for m in messages:
        role, text = m.get("role"), text_of(m)
        if role in ("system", "developer"):
            items.append({"type": "message", "role": "developer",
                          "content": [{"type": "input_text", "text": text}]})
        elif role == "user":
            items.append({"type": "message", "role": "user",
                          "content": [{"type": "input_text", "text": text}]})
        elif role == "assistant":
            if text:
                items.append({"type": "message", "role": "assistant",
                              "content": [{"type": "output_text", "text": text}]})
            for tc in m.get("tool_calls") or []:
                f = tc.get("function", {})
                items.append({"type": "function_call", "call_id": tc.get("id"),
                              "name": f.get("name"), "arguments": f.get("arguments") or "{}"})
        elif role == "tool":
            items.append({"type": "function_call_output", "call_id": m.get("tool_call_id"),
                          "output": text})
    return items


def to_messages(messages):
    """Anthropic Messages: (system, messages), consecutive blocks of one role merged."""
    system, out = [], []

    def add(role, blocks):
        if out and out[-1]["role"] == role:
            out[-1]["content"] += blocks
        else:
            out.append({"role": role, "content": blocks})

    for m in messages:
        role, text = m.get("role"), text_of(m)
        if role in ("system", "developer"):
            system.append(text)
        elif role == "user":
            add("user", [{"type": "text", "text": text or "."}])
        elif role == "assistant":
            blocks = [{"type": "text", "text": text}] if text else []
            for tc in m.get("tool_calls") or []:
                f = tc.get("function", {})
                try:
                    args = json.loads(f.get("arguments") or "{}")
                except ValueError:
                    args = {"raw": f.get("arguments")}
                blocks.append({"type": "tool_use", "id": tc.get("id"), "name": f.get("name"),
                               "input": args if isinstance(args, dict) else {"value": args}})
            add("assistant", blocks or [{"type": "text", "text": "."}])
        elif role == "tool":
            add("user", [{"type": "tool_result", "tool_use_id": m.get("tool_call_id"),
                          "content": text}])
    return "\n\n".join(system), out


def dump(obj):
    return json.dumps(obj, separators=(",", ":")).encode()


def bodies(dialect, msgs, tools, item=None):
    """(path, body) of the conversation `msgs` (chat-shaped) in `dialect`."""
    if dialect == "chat":
        return "/v1/chat/completions", conversation.body(CHAT_MODEL, msgs, tools)
    if dialect.startswith("responses"):
        items = to_responses(msgs)
        if item is not None:
            users = [i for i in items[:len(items) // 2] if i.get("role") == "user"]
            items = users + [item] + items[len(items) // 2:]
        rtools = [{"type": "function", **t["function"]} for t in tools if t.get("function")]
        return "/v1/responses", dump({"model": CHAT_MODEL, "input": items, "tools": rtools,
                                      "store": False, "stream": False})
    system, messages = to_messages(msgs)
    atools = [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
               "input_schema": t["function"].get("parameters") or {"type": "object"}}
              for t in tools if t.get("function")]
    return "/v1/messages", dump({"model": CLAUDE_MODEL, "max_tokens": 1024, "system": system,
                                 "messages": messages, "tools": atools})


def mint_item(port):
    """A compaction item minted by the Compactor on `port` for a small Responses conversation."""
    trigger = [{"type": "message", "role": "user",
                "content": [{"type": "input_text", "text": "hello " * 50}]},
               {"type": "compaction_trigger"}]
    _, answer = Client(port).post("/v1/responses", dump({"model": CHAT_MODEL, "input": trigger,
                                                         "store": False}))
    return next(i for i in json.loads(answer)["output"] if i.get("type") == "compaction")


class Timed(Client):
    """A kept-alive connection that also keeps the proxy's own count of its time
    (`x-compactor-overhead-ms`: upstream and summaries excluded)."""

    def post(self, path, data):
        started = time.perf_counter()
        self.conn.request("POST", path, body=data, headers={
            "content-type": "application/json", "authorization": "Bearer sk-bench"})
        response = self.conn.getresponse()
        payload = response.read()
        elapsed = time.perf_counter() - started
        if response.status != 200:
            sys.exit(f"{path}: {response.status} {payload[:300]!r}")
        overhead = response.getheader("x-compactor-overhead-ms")
        return elapsed, (float(overhead) / 1e3 if overhead else None)


def start(binary, mock_port, tmp, name):
    port = free_port()
    cfg = os.path.join(tmp, f"{name}.toml")
    with open(cfg, "w") as f:
        f.write(f'store = "memory"\nanthropic_upstream = "http://127.0.0.1:{mock_port}"\n'
                f'[windows]\n"{SUFFIX}" = 1048576\n'
                f'[summarizer]\nupstream = "http://127.0.0.1:{mock_port}/v1"\n')
    proc = subprocess.Popen([binary, "serve", "--listen", f"127.0.0.1:{port}", "--upstream",
                             f"http://127.0.0.1:{mock_port}/v1", "--config", cfg],
                            env=dict(os.environ, COMPACTOR_LOG="warn"), stdout=subprocess.DEVNULL,
                            stderr=open(os.path.join(tmp, f"{name}.log"), "wb"))
    return proc, port


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compactor", required=True, action="append",
                    help="a build; NAME=PATH names it (repeat to compare builds in one run)")
    ap.add_argument("--data", default=os.path.join(HERE, "..", "..", "..", "shared", "data", "conversations"))
    ap.add_argument("--tokens", type=int, default=200_000)
    ap.add_argument("--cold", type=int, default=5)
    ap.add_argument("--warm", type=int, default=20)
    ap.add_argument("--dump", help="write each dialect's first warm body to this directory")
    ap.add_argument("--out")
    a = ap.parse_args()
    builds = [c.split("=", 1) if "=" in c else (os.path.basename(c), c) for c in a.compactor]

    conv = conversation.prefix(a.data, a.tokens)
    if conv is None:
        sys.exit(f"no conversations in {a.data}")
    tmp = tempfile.mkdtemp(prefix="large-dialects-")
    mock_port = free_port()
    mock = subprocess.Popen([sys.executable, os.path.join(HERE, "slow_mock.py"), "--port", str(mock_port),
                             "--summary-delay", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs = []
    rows, load = [], [os.getloadavg()[0]]
    try:
        wait_listening(mock_port, mock, "the mock")
        ports = []
        for name, binary in builds:
            proc, port = start(binary, mock_port, tmp, name)
            procs.append(proc)
            wait_listening(port, proc, name)
            ports.append(port)
        items = [mint_item(port) for port in ports]
        direct = Timed(mock_port)
        through = [Timed(port) for port in ports]
        msgs, tools = conv["messages"], conv["tools"]
        for dialect in ("chat", "responses", "responses+item", "messages"):
            run = f"{os.getpid()}-{dialect}"
            # per build: its own compaction item (each build seals its own)
            per_build = []
            for b, item in enumerate(items):
                extra = item if dialect == "responses+item" else None
                cold = [bodies(dialect, conversation.with_nonce(msgs, f"{run}-{b}-c{i}")
                               + conversation.turns(1), tools, extra) for i in range(a.cold)]
                base = conversation.with_nonce(msgs, f"{run}-w")
                warm = [bodies(dialect, base + conversation.turns(i + 1), tools, extra)
                        for i in range(a.warm + 1)]
                through[b].post(*warm[0])  # the proxy's first sight of the warm conversation
                per_build.append({"cold": cold, "warm": warm[1:]})
            if a.dump:
                os.makedirs(a.dump, exist_ok=True)
                with open(os.path.join(a.dump, f"{dialect}.json"), "wb") as f:
                    f.write(per_build[0]["warm"][0][1])
            # times[kind] = (direct, [per build], [per build overhead header])
            times = {k: ([], [[] for _ in builds], [[] for _ in builds]) for k in ("cold", "warm")}
            for kind in ("cold", "warm"):
                for i in range(len(per_build[0][kind])):
                    # direct first, then the builds in an order rotating request by request
                    path, data = per_build[0][kind][i]
                    times[kind][0].append(direct.post(path, data)[0])
                    for k in range(len(builds)):
                        b = (i + k) % len(builds)
                        took, own = through[b].post(*per_build[b][kind][i])
                        times[kind][1][b].append(took)
                        times[kind][2][b].append(own)
            rows.append((dialect, len(per_build[0]["warm"][0][1]), times))
            load.append(os.getloadavg()[0])
    finally:
        for p in procs + [mock]:
            p.terminate()
            p.wait(timeout=10)

    def ms(x):
        return f"{x * 1e3:.2f}"

    def own(values):
        values = [v for v in values if v is not None]
        return ms(statistics.median(values)) if values else "–"

    names = ", ".join(f"`{n}` = `{p}`" for n, p in builds)
    lines = [f"# A {conv['tokens']:,}-token conversation + one turn, in three dialects, "
             + time.strftime("%Y-%m-%d %H:%M"), "",
             f"- Machine: {os.cpu_count()} cores; load average (1 min) at start / end / highest: "
             f"{load[0]:.2f} / {load[-1]:.2f} / {max(load):.2f}",
             f"- Conversation: `{conv['source']}` cut to {len(conv['messages'])} messages, "
             f"{conv['tokens']:,} tokens ({conv['counter']}); compaction item minted by each build.",
             f"- Command: `scripts/bench/large_dialects.py {' '.join(sys.argv[1:])}`",
             f"- Builds: {names}; memory store, the models given a 1M window (measured and "
             "forwarded, not compacted). Sequential requests on a kept-alive connection each, direct "
             "first, then the builds in rotating order, request by request.",
             "- added = Compactor p50 − direct p50 (the mock called directly in the same round); "
             "own = median of the proxy's `x-compactor-overhead-ms` (its time, upstream excluded).", "",
             "| dialect | body | build | cold: direct / Compactor p50 (ms), added | cold own (ms) "
             "| warm: direct / Compactor p50 (ms), added | warm own (ms) | warm added max (ms) |",
             "|---|---|---|---|---|---|---|---|"]
    for dialect, size, t in rows:
        for b, (name, _) in enumerate(builds):
            cells = []
            for kind in ("cold", "warm"):
                d, c = statistics.median(t[kind][0]), statistics.median(t[kind][1][b])
                cells.append(f"{ms(d)} / {ms(c)}, **{(c - d) * 1e3:+.2f}** ({len(t[kind][0])} samples)")
                cells.append(own(t[kind][2][b]))
            worst = max(c - d for d, c in zip(t["warm"][0], t["warm"][1][b]))
            lines.append(f"| `{dialect}` | {size / 1024:,.0f} KB | {name} | " + " | ".join(cells)
                         + f" | {worst * 1e3:+.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "a") as f:
            f.write("\n" + text)


if __name__ == "__main__":
    main()
