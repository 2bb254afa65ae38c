"""Test-only client for the container smoke test (see README.md), run inside the gateway's
compose network, where each replica can be asked by name:

  gateway_check.py checkpoint       a checkpoint made on one replica is used by the other
  gateway_check.py requests         how many passed-through requests each replica answered
  gateway_check.py readyz STATUS    wait (up to 30 s) until both replicas report STATUS on /readyz
  gateway_check.py resolve          how long each service's name takes to resolve

`checkpoint`: the first request goes to compactor-1 with a conversation past the window the override sets for
the stub model, so it is compacted and a checkpoint is stored; the same conversation one turn
later goes to compactor-2, which must apply that checkpoint without asking for a new summary,
and serve it to the same tenant from its checkpoint endpoint. Exits non-zero on any failure.
"""

import json
import socket
import sys
import time
import urllib.error
import urllib.request

KEY = "Bearer smoke-tenant"
REPLICAS = ("compactor-1", "compactor-2")


def call(url, body=None):
    req = urllib.request.Request(url, headers={"authorization": KEY})
    if body is not None:
        req.data = json.dumps(body).encode()
        req.add_header("content-type", "application/json")
    with urllib.request.urlopen(req, timeout=60) as resp:
        return resp.status, resp.headers, json.load(resp)


def summaries():
    return call("http://upstream:8080/stub/counts")[2]["summaries"]


def conversation(turns):
    messages = [{"role": "system", "content": "You are a coding agent."}]
    for t in range(turns):
        messages.append({"role": "user", "content": f"step {t}: " + "explain the design " * 40})
        messages.append({"role": "assistant", "content": f"answer {t}: " + "because of the tradeoffs " * 40})
    messages.append({"role": "user", "content": "what next?"})
    return {"model": "stub-model", "max_tokens": 200, "messages": messages}


def check(ok, what):
    print(("ok:   " if ok else "FAIL: ") + what)
    if not ok:
        sys.exit(1)


def checkpoint():
    body = conversation(14)
    before = summaries()
    status, headers, _ = call("http://compactor-1:8787/v1/chat/completions", body)
    checkpoint = headers.get("x-compactor-checkpoint")
    check(status == 200 and headers.get("x-compactor-compacted") == "true" and checkpoint is not None,
          f"compactor-1 compacted the conversation (checkpoint {checkpoint})")
    made = summaries()
    check(made > before, f"compactor-1 asked the upstream for a summary ({made - before})")

    body["messages"] += [{"role": "assistant", "content": "Working on it."},
                         {"role": "user", "content": "and then?"}]
    status, headers, _ = call("http://compactor-2:8787/v1/chat/completions", body)
    check(status == 200 and headers.get("x-compactor-checkpoint") == checkpoint,
          f"compactor-2 applied the same checkpoint ({headers.get('x-compactor-checkpoint')})")
    check(summaries() == made, "compactor-2 wrote no summary of its own")

    status, _, stored = call(f"http://compactor-2:8787/compactor/v1/checkpoints/{checkpoint}")
    check(status == 200 and "Stub summary" in json.dumps(stored),
          "compactor-2 serves the checkpoint to the tenant that made it")


def requests():
    """Sum of the replica's request counter for passed-through routes (/v1/models)."""
    for name in REPLICAS:
        with urllib.request.urlopen(f"http://{name}:8787/metrics", timeout=10) as resp:
            text = resp.read().decode()
        total = sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("compactor_requests_total{") and 'route="Passthrough"' in line
        )
        print(name, int(total))


def resolve():
    """How long each service's name takes to resolve here (for a failure's explanation)."""
    for name in ("upstream", "redis", "nginx") + REPLICAS:
        started = time.monotonic()
        try:
            found = sorted({info[4][0] for info in socket.getaddrinfo(name, 80)})
        except OSError as err:
            found = f"unresolved ({err})"
        print(f"resolve {name}: {time.monotonic() - started:.3f} s {found}")


def readyz(expected):
    # Long enough for the network's DNS server: after a container starts (Redis, here) podman's
    # has been seen silent for up to about 50 s, and the replicas find Redis by name as this
    # script finds them.
    started = time.monotonic()
    deadline = started + 150
    while True:
        seen = {}
        for name in REPLICAS:
            try:
                with urllib.request.urlopen(f"http://{name}:8787/readyz", timeout=5) as resp:
                    seen[name] = json.load(resp).get("status")
            except urllib.error.HTTPError as err:
                seen[name] = json.load(err).get("status")
            except OSError as err:
                seen[name] = f"unreachable ({err})"
        if all(status == expected for status in seen.values()):
            took = time.monotonic() - started
            check(True, f"both replicas report {expected} on /readyz (after {took:.0f} s)")
            return
        if time.monotonic() > deadline:
            check(False, f"both replicas report {expected} on /readyz (seen: {seen})")
        time.sleep(0.5)


if __name__ == "__main__":
    command = sys.argv[1:2]
    if command == ["checkpoint"]:
        checkpoint()
    elif command == ["requests"]:
        requests()
    elif command == ["resolve"]:
        resolve()
    elif command == ["readyz"] and len(sys.argv) == 3:
        readyz(sys.argv[2])
    else:
        sys.exit("usage: gateway_check.py checkpoint | requests | resolve | readyz STATUS")
