"""Measuring clients of the load benchmark (standard library only).

- `timed_posts`: sequential POSTs on one keep-alive connection, wall time of each until the whole
  response is read (used for the large-conversation and compaction measurements).
- `ttfb`: sequential streaming POSTs on one keep-alive connection; time until the response head
  and until the first SSE `data:` byte.
- `chunk_delays`: one stream from the slow mock, whose chunks carry their send time
  (CLOCK_MONOTONIC, shared by all processes of the machine); delay of each chunk at the client.
- `open_streams`: N concurrent streams held open at once (asyncio), for memory under open streams.
"""
import asyncio
import http.client
import json
import re
import resource
import socket
import time
from urllib.parse import urlsplit


def _conn(url, timeout=60):
    u = urlsplit(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    c.connect()
    c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    path = u.path + (("?" + u.query) if u.query else "")
    return c, path


# the one API key of the run (LiteLLM needs a master key; the others pass it on)
BENCH_KEY = "sk-bench-4f1c2a9e7b3d5f8a0c6e1b2d9f7a3c5e"
HEADERS = {"content-type": "application/json", "authorization": "Bearer " + BENCH_KEY}


def timed_posts(url, bodies, headers=None):
    """POST each body in turn on one connection; returns [(seconds, status, headers_dict)]."""
    h = dict(HEADERS, **(headers or {}))
    c, path = _conn(url, timeout=120)
    out = []
    for body in bodies:
        t0 = time.perf_counter()
        c.request("POST", path, body=body, headers=h)
        r = c.getresponse()
        r.read()
        dt = time.perf_counter() - t0
        out.append((dt, r.status, {k.lower(): v for k, v in r.getheaders()}))
        if r.getheader("connection", "").lower() == "close":
            c.close()
            c, path = _conn(url, timeout=120)
    c.close()
    return out


def ttfb(url, body, n, warmup=20, max_seconds=15.0):
    """Returns (head_times, first_data_times, statuses) in seconds over n samples (fewer when
    max_seconds runs out first)."""
    c, path = _conn(url)
    heads, firsts, statuses = [], [], set()
    t_end = time.perf_counter() + max_seconds
    for i in range(n + warmup):
        if time.perf_counter() > t_end and len(firsts) >= 50:
            break
        t0 = time.perf_counter()
        c.request("POST", path, body=body, headers=HEADERS)
        r = c.getresponse()
        t1 = time.perf_counter()
        buf = b""
        t2 = None
        while True:
            data = r.read1(65536)
            if not data:
                break
            if t2 is None:
                buf += data
                if b"data:" in buf:
                    t2 = time.perf_counter()
        r.read()  # completes the response so the connection can be reused
        statuses.add(r.status)
        if i >= warmup:
            heads.append(t1 - t0)
            firsts.append((t2 if t2 is not None else time.perf_counter()) - t0)
        if r.getheader("connection", "").lower() == "close":
            c.close()
            c, path = _conn(url)
    c.close()
    return heads, firsts, statuses


_STAMP = re.compile(rb'"content":\s*"w\d+@([0-9]+\.[0-9]+)')


def chunk_delays(url, body):
    """One stream from the slow mock; returns per-chunk (arrival - sent) delays in seconds."""
    c, path = _conn(url)
    c.request("POST", path, body=body, headers=HEADERS)
    r = c.getresponse()
    delays, buf = [], b""
    while True:
        data = r.read1(65536)
        now = time.monotonic()
        if not data:
            break
        buf += data
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            m = _STAMP.search(ev)
            if m:
                delays.append(now - float(m.group(1)))
    r.read()
    c.close()
    return delays, r.status


async def _one_stream(host, port, path, body, opened, stop, errors):
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError as e:
        errors.append(repr(e))
        return
    try:
        req = (f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
               f"authorization: Bearer {BENCH_KEY}\r\ncontent-length: {len(body)}\r\n\r\n").encode() + body
        writer.write(req)
        await writer.drain()
        buf = b""
        while b"data:" not in buf:
            data = await reader.read(65536)
            if not data:
                errors.append("closed before first chunk: " + buf[:120].decode("latin-1"))
                return
            buf += data
        opened.append(time.monotonic())
        while not stop.is_set():  # keep reading so the stream stays healthy
            try:
                data = await asyncio.wait_for(reader.read(65536), timeout=0.5)
            except asyncio.TimeoutError:
                continue
            if not data:
                break
    except (OSError, asyncio.IncompleteReadError) as e:
        errors.append(repr(e))
    finally:
        writer.close()


async def _open_streams(url, body, n, on_all_open, ramp_s, hold_s, timeout_s):
    u = urlsplit(url)
    stop = asyncio.Event()
    opened, errors = [], []
    tasks = []
    t0 = time.monotonic()
    for i in range(n):
        tasks.append(asyncio.create_task(_one_stream(u.hostname, u.port, u.path, body, opened, stop, errors)))
        if ramp_s and i % 50 == 49:
            await asyncio.sleep(ramp_s * 50 / n)
    while len(opened) + len(errors) < n and time.monotonic() - t0 < timeout_s:
        await asyncio.sleep(0.05)
    t_open = time.monotonic() - t0
    await asyncio.sleep(hold_s)
    measured = on_all_open(len(opened))
    stop.set()
    await asyncio.wait(tasks, timeout=5)
    for t in tasks:
        t.cancel()
    return {"requested": n, "open": len(opened), "errors": len(errors),
            "first_error": errors[0] if errors else None, "seconds_to_open": t_open,
            "measured": measured}


def open_streams(url, body, n, on_all_open, ramp_s=1.0, hold_s=1.0, timeout_s=30):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, 4 * n + 256))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return asyncio.run(_open_streams(url, body, n, on_all_open, ramp_s, hold_s, timeout_s))


def json_body(obj):
    return json.dumps(obj, separators=(",", ":")).encode()
