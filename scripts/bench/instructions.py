#!/usr/bin/env python3
"""Instructions per request: the request path's cost counted, not timed.

Each system runs under valgrind's callgrind in front of the bench's nginx mock; one client sends
small chat requests on a kept-alive connection (`--kind json`: answered with a JSON completion;
`--kind sse`: streamed, six events), about `--rate` a second (so the server parks
between requests, as it does at a low rate), and callgrind counts the instructions the server
executed for `--requests` of them after a warm-up. The count barely moves with the host's load
or speed, where a latency or a rate measured on a shared machine moves by tens of percent between
runs: it compares builds, and Compactor with nginx, on any machine. It does not see what a cold
cache or a wake-up costs, which a count of instructions cannot show; the load bench measures
those (scripts/bench.sh).

    scripts/bench/instructions.py                       # nginx and target/release/compactor
    scripts/bench/instructions.py --compactor A --compactor B=path/to/other/build
    scripts/bench/instructions.py --top 25              # and where Compactor's instructions go
    scripts/bench/instructions.py --floor target/release/examples/floor_proxy

Needs valgrind and nginx (Debian: valgrind, nginx). Prints a markdown table.
"""
import argparse
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
from run import SMALL, wait_http, write_mock_conf, write_nginx_proxy_conf  # noqa: E402

MOCK_PORT, SERVER_PORT = 18731, 18732
BODIES = {"json": json.dumps(SMALL).encode(),
          "sse": json.dumps({**SMALL, "stream": True}).encode()}
# Where each kind is answered: the mock streams under /sse/.
MOCK_PREFIX = {"json": "", "sse": "/sse"}


def send(conn, n, rate, kind, path):
    """Sends n requests on one kept-alive connection, about `rate` a second; all must be 200."""
    gap = 1.0 / rate if rate else 0
    for _ in range(n):
        started = time.perf_counter()
        conn.request("POST", path, body=BODIES[kind],
                     headers={"content-type": "application/json",
                              "authorization": "Bearer sk-bench"})
        answer = conn.getresponse()
        answer.read()
        if answer.status != 200:
            raise SystemExit(f"answered {answer.status}")
        left = gap - (time.perf_counter() - started)
        if left > 0:
            time.sleep(left)


def control(pid, *args):
    subprocess.run(["callgrind_control", *args, str(pid)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def count(name, argv, env, tmp, a, path):
    """Runs argv under callgrind while `path` is asked; returns (instructions per request, the
    profile's path)."""
    out = os.path.join(tmp, f"callgrind.{re.sub(r'[^A-Za-z0-9]+', '-', name)}")
    with open(f"{out}.log", "w") as log:
        proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p",
             "--instr-atstart=no", *argv],
            env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=log,
            start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{SERVER_PORT}/healthz")
        conn = http.client.HTTPConnection("127.0.0.1", SERVER_PORT, timeout=60)
        control(proc.pid, "-i", "on")
        send(conn, a.warmup, a.rate, a.kind, path)
        control(proc.pid, "-z")
        send(conn, a.requests, a.rate, a.kind, path)
        control(proc.pid, "-d")
        conn.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            # The profile is dumped above; a server slow to stop under valgrind on a busy
            # machine (nginx) is not waited for.
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    dumps = sorted(p for p in os.listdir(tmp)
                   if p.startswith(os.path.basename(out) + ".") and p.endswith(".1"))
    if not dumps:
        raise SystemExit(f"{name}: callgrind wrote no profile (see {out}.log)")
    path = os.path.join(tmp, dumps[-1])
    with open(path) as f:
        total = next(int(line.split()[1]) for line in f if line.startswith("summary:"))
    return total / a.requests, path


def top_functions(path, n):
    """The n functions with the most instructions of their own, with their share."""
    text = subprocess.run(["callgrind_annotate", "--threshold=100", path],
                          capture_output=True, text=True, check=True).stdout
    rows = []
    for line in text.splitlines():
        m = re.match(r"\s*([\d,]+) \(\s*([\d.]+)%\)\s+(\S.*?)\s*(\[.*\])?$", line)
        if m and "PROGRAM TOTALS" not in line:
            name = m.group(3).split(":", 1)[-1]
            rows.append((int(m.group(1).replace(",", "")), float(m.group(2)), name))
    return rows[:n]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compactor", action="append", metavar="[NAME=]PATH",
                    help="a Compactor build to count (repeatable); "
                         "default target/release/compactor")
    ap.add_argument("--floor", metavar="PATH",
                    help="also count examples/floor_proxy.rs (hyper's server and pooled client "
                         "with nothing else), built with `cargo build --release --example "
                         "floor_proxy`")
    ap.add_argument("--kind", choices=sorted(BODIES), default="json",
                    help="the answer the mock gives: a JSON completion or an SSE stream")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--rate", type=float, default=100, help="requests a second (0: back to back)")
    ap.add_argument("--top", type=int, default=0,
                    help="list the first build's N most costly functions")
    a = ap.parse_args()
    for tool in ("valgrind", "callgrind_control", "callgrind_annotate", "nginx"):
        if not shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin"):
            raise SystemExit(f"{tool} is missing (Debian: apt-get install valgrind nginx)")
    builds = []
    for spec in a.compactor or [os.path.join(ROOT, "target/release/compactor")]:
        name, _, path = spec.rpartition("=")
        builds.append((name or "Compactor", os.path.abspath(path)))

    tmp = tempfile.mkdtemp(prefix="compactor-instructions-")
    nginx = shutil.which("nginx", path=os.environ.get("PATH", "") + ":/usr/sbin")
    mock = subprocess.Popen([nginx, "-c", write_mock_conf(tmp, MOCK_PORT), "-p", tmp],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    rows = []
    try:
        wait_http(f"http://127.0.0.1:{MOCK_PORT}/healthz")
        for log_on in (False, True):
            conf = write_nginx_proxy_conf(tmp, SERVER_PORT, MOCK_PORT, MOCK_PORT,
                                          name=f"proxy-log-{log_on}", access_log=log_on)
            # One process, so that callgrind sees the worker's instructions.
            with open(conf) as f:
                text = f.read().replace("master_process on;", "master_process off;")
            with open(conf, "w") as f:
                f.write(text)
            per, _ = count(f"nginx log {log_on}", [nginx, "-c", conf, "-p", tmp], {}, tmp, a,
                           f"{MOCK_PREFIX[a.kind]}/v1/chat/completions")
            rows.append(("nginx", log_on, per, None))
        if a.floor:
            argv = [os.path.abspath(a.floor), "hyper", f"127.0.0.1:{SERVER_PORT}",
                    f"127.0.0.1:{MOCK_PORT}"]
            per, _ = count("floor", argv, {}, tmp, a, f"{MOCK_PREFIX[a.kind]}/v1/chat/completions")
            rows.append(("hyper alone (the floor)", False, per, None))
        for name, path in builds:
            for log_on in (False, True):
                env = {"COMPACTOR_LOG": "info" if log_on else "warn"}
                argv = [path, "serve", "--listen", f"127.0.0.1:{SERVER_PORT}", "--upstream",
                        f"http://127.0.0.1:{MOCK_PORT}{MOCK_PREFIX[a.kind]}/v1",
                        "--store", "memory"]
                per, profile = count(f"{name} log {log_on}", argv, env, tmp, a,
                                     "/v1/chat/completions")
                rows.append((name, log_on, per, profile))
    finally:
        os.killpg(mock.pid, signal.SIGTERM)
        mock.wait(timeout=30)

    nginx_per = {log_on: per for name, log_on, per, _ in rows if name == "nginx"}
    answer = "a JSON completion" if a.kind == "json" else "an SSE stream of six events"
    print(f"Instructions per small chat request answered with {answer} (callgrind), "
          f"{a.requests} requests at "
          f"{a.rate:g}/s on one kept-alive connection after {a.warmup} of warm-up.\n")
    print("| system | request log | instructions per request | ÷ nginx, same log |")
    print("|---|---|---|---|")
    for name, log_on, per, _ in rows:
        print(f"| {name} | {'on' if log_on else 'off'} | {per:,.0f} | "
              f"{per / nginx_per[log_on]:.2f}× |")
    if a.top:
        name, _, _, profile = [r for r in rows if r[3] and r[1]][-1]
        print(f"\n{name}, log on: the {a.top} functions with the most instructions of their "
              "own, per request\n")
        print("| instructions | share | function |")
        print("|---|---|---|")
        for total, share, function in top_functions(profile, a.top):
            print(f"| {total / a.requests:,.0f} | {share:.1f} % | `{function[:110]}` |")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
