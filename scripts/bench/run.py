#!/usr/bin/env python3
"""Load benchmark: the same fast mock upstream reached directly, through nginx, through LiteLLM's
proxy and through Compactor, measured in one run on this machine. Started by scripts/bench.sh,
which installs the tools; see `--help` and the header of scripts/bench.sh.

Writes benches/results/YYYY-MM-DD.md and prints it.
"""
import argparse
import datetime
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import clients  # noqa: E402
import conversation  # noqa: E402

# model name of the compaction test: an OpenAI family name (exact token counts) plus a suffix that
# the benchmark gives its own window in [windows]
COMPACT_MODEL = "gpt-4o-bench-compact"
# the chunk-timing stream: CHUNKS chunks, CHUNK_MS apart
CHUNK_MS, CHUNKS = 20, 30
SMALL = {"model": "mock", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16}

# ----------------------------------------------------------------------------------------------
# processes


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Proc:
    """A process this run started (in its own session, so that it and its children can be
    stopped together by its process-group id)."""
    live = []
    server_prefix = []  # e.g. ["chrt", "-r", "1"] for --realtime

    def __init__(self, name, cmd, cpus=None, env=None, log_dir=None, server=True):
        self.name = name
        if server:
            cmd = Proc.server_prefix + cmd
        if cpus is not None:
            cmd = ["taskset", "-c", cpus] + cmd
        self.log = open(os.path.join(log_dir, f"{name}.log"), "wb") if log_dir else subprocess.DEVNULL
        self.p = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                  start_new_session=True)
        self.pid = self.p.pid
        Proc.live.append(self)

    def alive(self):
        return self.p.poll() is None

    def stop(self):
        if self.p.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.pid, signal.SIGKILL)
                self.p.wait()
        if self in Proc.live:
            Proc.live.remove(self)

    def tree(self):
        """pids of the process and all its descendants."""
        children = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d))
        out, todo = [], [self.pid]
        while todo:
            p = todo.pop()
            out.append(p)
            todo.extend(children.get(p, []))
        return out

    def rss_kb(self):
        total = 0
        for pid in self.tree():
            try:
                with open(f"/proc/{pid}/status") as f:
                    for line in f:
                        if line.startswith("VmRSS:"):
                            total += int(line.split()[1])
            except OSError:
                pass
        return total


def stop_all():
    for p in list(reversed(Proc.live)):
        p.stop()


def wait_http(url, body=None, timeout=60, proc=None, expect=200):
    t0 = time.time()
    last = None
    while time.time() - t0 < timeout:
        if proc is not None and not proc.alive():
            raise RuntimeError(f"{proc.name} exited during start-up (see its log)")
        try:
            req = urllib.request.Request(url, data=body, headers=clients.HEADERS if body else {})
            with urllib.request.urlopen(req, timeout=5) as r:
                r.read()
                if r.status == expect:
                    return
        except Exception as e:  # noqa: BLE001
            last = e
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready after {timeout}s: {last}")


class RssSampler:
    """Samples a process tree's RSS in a background thread; keeps the maximum."""

    def __init__(self, procs):
        import threading
        self.procs = procs
        self.max = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.max = max(self.max, sum(p.rss_kb() for p in self.procs))
            self._stop.wait(0.25)

    def __enter__(self):
        if self.procs:
            self._t.start()
        return self

    def __exit__(self, *a):
        self._stop.set()
        if self.procs:
            self._t.join()


# ----------------------------------------------------------------------------------------------
# load generators


def run_oha(oha, url, body_file, rate, seconds, conns, cpus):
    cmd = [oha, "-z", f"{seconds}s", "-q", str(rate), "-c", str(conns), "--latency-correction",
           "--no-tui", "--output-format", "json", "-m", "POST", "-T", "application/json",
           "-H", "authorization: Bearer " + clients.BENCH_KEY, "-D", body_file, url]
    if cpus is not None:
        cmd = ["taskset", "-c", cpus] + cmd
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    if r.returncode != 0:
        raise RuntimeError(f"oha failed: {r.stderr[-500:]}")
    j = json.loads(r.stdout)
    s = j["summary"]
    pct = j.get("latencyPercentiles") or {}
    codes = j.get("statusCodeDistribution") or {}
    ok = int(codes.get("200", 0))
    total = sum(int(v) for v in codes.values()) + sum(int(v) for v in (j.get("errorDistribution") or {}).values())
    return {"rps": s.get("requestsPerSec"), "success": s.get("successRate"),
            "ok": ok, "total": total,
            "p50": pct.get("p50"), "p90": pct.get("p90"), "p99": pct.get("p99"),
            "errors": j.get("errorDistribution") or {}, "codes": codes}


def run_wrk_paced(url, body_file, rate, seconds, conns, cpus):
    """The fixed-rate run without oha: wrk, each connection waiting conns/rate seconds on average
    (exponentially distributed, so the connections do not fall into step and arrive as bursts)
    after each answer before its next request (post.lua's `delay`). A closed loop: a slow answer
    delays the requests behind it instead of being charged for them as oha's latency correction
    does, so its tail figures understate what oha would report."""
    j = run_wrk(url, body_file, seconds, conns, 1, cpus, delay_ms=max(1, round(conns * 1000 / rate)))
    total = j["requests"] + j["connect_errors"] + j["read_errors"] + j["write_errors"] + j["timeouts"]
    ok = j["requests"] - j["status_errors"]
    return {"rps": j["rps"], "success": ok / total if total else 0, "ok": ok, "total": total,
            "p50": j["p50_us"] / 1e6, "p90": j["p90_us"] / 1e6, "p99": j["p99_us"] / 1e6,
            "errors": j["errors"]}


def run_fixed_rate(env, url, body_file, rate, seconds, conns):
    if env.oha:
        return run_oha(env.oha, url, body_file, rate, seconds, conns, env.load_cpus)
    return run_wrk_paced(url, body_file, rate, seconds, conns, env.load_cpus)


def run_wrk(url, body_file, seconds, conns, threads, cpus, delay_ms=None):
    env = dict(os.environ, BENCH_BODY_FILE=body_file, BENCH_KEY=clients.BENCH_KEY)
    if delay_ms is not None:
        env["BENCH_DELAY_MS"] = str(delay_ms)
    cmd = ["wrk", "-t", str(threads), "-c", str(conns), "-d", f"{seconds}s", "--timeout", "5s",
           "-s", os.path.join(HERE, "post.lua"), url]
    if cpus is not None:
        cmd = ["taskset", "-c", cpus] + cmd
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=seconds + 60)
    m = re.search(r"^WRKJSON (.*)$", r.stdout, re.M)
    if not m:
        raise RuntimeError(f"wrk failed: {r.stdout[-300:]} {r.stderr[-300:]}")
    j = json.loads(m.group(1))
    errors = j["connect_errors"] + j["read_errors"] + j["write_errors"] + j["status_errors"] + j["timeouts"]
    good = j["requests"] - j["status_errors"]
    j["rps"] = good / (j["duration_us"] / 1e6)
    j["errors"] = errors
    return j


# ----------------------------------------------------------------------------------------------
# configuration files

# The fixed answers report `usage.prompt_tokens: 0`: the same figure for every request would
# mis-calibrate a proxy that learns its token counts from `usage` (Compactor does); 0 is "unknown".
JSON_COMPLETION = json.dumps({
    "id": "chatcmpl-mock", "object": "chat.completion", "created": 1700000000, "model": "mock",
    "system_fingerprint": "fp_mock",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello from the mock."},
                 "logprobs": None, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 0, "completion_tokens": 5, "total_tokens": 5}},
    separators=(",", ":"))


def _sse_chunk(i, content, finish=None):
    delta = {} if content is None else {"content": content}
    if i == 0:
        delta["role"] = "assistant"
    return "data: " + json.dumps({
        "id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 1700000000,
        "model": "mock", "system_fingerprint": "fp_mock",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]},
        separators=(",", ":")) + "\n\n"


SSE_STREAM = ("".join(_sse_chunk(i, w) for i, w in enumerate(["Hello", " from", " the", " mock."]))
              + _sse_chunk(4, None, "stop") + "data: [DONE]\n\n")


def nginx_str(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("$", "${dollar}") + '"'


def nginx_common(tmp, name, workers=1):
    user = "user root;\n" if os.geteuid() == 0 else ""
    return f"""{user}worker_processes {workers};
daemon off;
master_process on;
pid {tmp}/{name}.pid;
error_log {tmp}/{name}.error.log warn;
worker_rlimit_nofile 65536;
events {{ worker_connections 16384; multi_accept on; }}
"""


def nginx_http_common(tmp, name, access_log=False):
    log = f"access_log {tmp}/{name}.access.log" if access_log else "access_log off"
    return f"""  {log};
  keepalive_requests 10000000;
  keepalive_timeout 300s;
  client_max_body_size 0;
  client_body_buffer_size 1m;
  client_body_temp_path {tmp}/{name}-body;
  proxy_temp_path {tmp}/{name}-proxy;
  fastcgi_temp_path {tmp}/{name}-fcgi;
  uwsgi_temp_path {tmp}/{name}-uwsgi;
  scgi_temp_path {tmp}/{name}-scgi;
"""


def write_mock_conf(tmp, port, workers=1):
    """The fast mock: nginx answering every POST from memory. `/sse/...` gives the SSE stream,
    anything else the JSON completion."""
    conf = nginx_common(tmp, "mock", workers) + f"""http {{
{nginx_http_common(tmp, "mock")}  geo $dollar {{ default "$"; }}
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    location /sse/ {{
      default_type text/event-stream;
      add_header cache-control no-cache;
      return 200 {nginx_str(SSE_STREAM)};
    }}
    location / {{
      default_type application/json;
      return 200 {nginx_str(JSON_COMPLETION)};
    }}
  }}
}}
"""
    path = os.path.join(tmp, "mock.conf")
    with open(path, "w") as f:
        f.write(conf)
    return path


def write_nginx_proxy_conf(tmp, port, mock_port, slow_port, workers=1, name="proxy",
                           access_log=False):
    conf = nginx_common(tmp, name, workers) + f"""http {{
{nginx_http_common(tmp, name, access_log)}  upstream mock {{ server 127.0.0.1:{mock_port}; keepalive 512; }}
  upstream slowmock {{ server 127.0.0.1:{slow_port}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_buffering off;
    proxy_read_timeout 300s;
    location /slow-sse/ {{ proxy_pass http://slowmock; }}
    location / {{ proxy_pass http://mock; }}
  }}
}}
"""
    path = os.path.join(tmp, f"{name}.conf")
    with open(path, "w") as f:
        f.write(conf)
    return path


def write_litellm_conf(tmp, mock_port, slow_port):
    models = [("mock", f"http://127.0.0.1:{mock_port}/v1"),
              ("mock-sse", f"http://127.0.0.1:{mock_port}/sse/v1"),
              ("mock-slow", f"http://127.0.0.1:{slow_port}/slow-sse/v1"),
              ("mock-slow-chunks", f"http://127.0.0.1:{slow_port}/slow-sse-{CHUNK_MS}ms-{CHUNKS}/v1")]
    lines = ["model_list:"]
    for name, base in models:
        lines += [f"  - model_name: {name}", "    litellm_params:", "      model: openai/mock",
                  f"      api_base: {base}", "      api_key: sk-mock"]
    lines += ["litellm_settings:", "  drop_params: true", "  telemetry: false",
              "  set_verbose: false", "  json_logs: false",
              "general_settings:", "  master_key: " + clients.BENCH_KEY, "  disable_spend_logs: true"]
    path = os.path.join(tmp, "litellm.yaml")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def compactor_config_text(base_file, overrides_top, windows=None):
    """The project's config/compactor.toml with some top-level keys replaced (and a [windows]
    table extended), so that the benchmark runs with the real keys and defaults."""
    if base_file and os.path.exists(base_file):
        with open(base_file) as f:
            text = f.read()
    else:
        text = ""
    lines = text.splitlines()
    first_table = next((i for i, l in enumerate(lines) if l.strip().startswith("[")), len(lines))
    top, rest = lines[:first_table], lines[first_table:]
    for key, val in overrides_top.items():
        pat = re.compile(rf"^\s*{re.escape(key)}\s*=")
        rendered = f"{key} = {json.dumps(val)}"
        for i, l in enumerate(top):
            if pat.match(l):
                top[i] = rendered
                break
        else:
            top.append(rendered)
    if windows:
        extra = [f"{json.dumps(k)} = {v}" for k, v in windows.items()]
        idx = next((i for i, l in enumerate(rest) if l.strip() == "[windows]"), None)
        if idx is None:
            rest = ["[windows]"] + extra + [""] + rest
        else:
            rest[idx + 1:idx + 1] = extra
    out = "\n".join(top + rest) + "\n"
    tomllib.loads(out)  # must stay valid TOML
    return out


# ----------------------------------------------------------------------------------------------
# systems


class System:
    """One way of reaching the mock. json_url/sse_url/slow_url are full chat-completions URLs;
    body() builds the request for a model role ('json', 'sse', 'slow')."""
    name = "?"
    procs = []           # processes whose RSS is the system's
    sse_procs = None     # processes serving the streaming URLs (default: procs)
    slow_procs = None    # processes serving the slow-stream URLs (default: procs)

    def model(self, role):
        return "mock"

    def small_body(self, role="json", **extra):
        obj = dict(SMALL, model=self.model(role), **extra)
        if role in ("sse", "slow", "chunks"):
            obj["stream"] = True
        return clients.json_body(obj)

    def stop(self):
        for p in self.all_procs():
            p.stop()

    def all_procs(self):
        seen = []
        for p in (self.procs or []) + (self.sse_procs or []) + (self.slow_procs or []):
            if p not in seen:
                seen.append(p)
        return seen


class Direct(System):
    name = "direct"

    def __init__(self, env):
        self.json_url = f"http://127.0.0.1:{env.mock_port}/v1/chat/completions"
        self.sse_url = f"http://127.0.0.1:{env.mock_port}/sse/v1/chat/completions"
        self.slow_url = f"http://127.0.0.1:{env.slow_port}/slow-sse/v1/chat/completions"
        self.procs = []

    def start(self):
        pass


LOG_ON = " +log"  # the name suffix of a system's twin measured with its request log on


class Nginx(System):
    """nginx as a plain reverse proxy; `log_on`: with `access_log` (the default combined format,
    unbuffered, to a file), else `access_log off`."""
    name = "nginx"

    def __init__(self, env, log_on=False):
        self.env = env
        self.log_on = log_on
        if log_on:
            self.name = self.name + LOG_ON
        self.port = free_port()
        base = f"http://127.0.0.1:{self.port}"
        self.json_url = base + "/v1/chat/completions"
        self.sse_url = base + "/sse/v1/chat/completions"
        self.slow_url = base + "/slow-sse/v1/chat/completions"

    def start(self):
        e = self.env
        name = "proxylog" if self.log_on else "proxy"
        conf = write_nginx_proxy_conf(e.tmp, self.port, e.mock_port, e.slow_port, e.server_ncpu,
                                      name=name, access_log=self.log_on)
        p = Proc(f"nginx-{name}", ["nginx", "-p", e.tmp, "-e", f"{e.tmp}/{name}.error.log", "-c", conf],
                 cpus=e.server_cpus, log_dir=e.tmp)
        self.procs = [p]
        wait_http(self.json_url, self.small_body(), proc=p)


class LiteLLM(System):
    name = "LiteLLM"

    def __init__(self, env):
        self.env = env
        self.port = free_port()
        base = f"http://127.0.0.1:{self.port}"
        self.json_url = self.sse_url = self.slow_url = base + "/v1/chat/completions"

    def model(self, role):
        return {"json": "mock", "sse": "mock-sse", "slow": "mock-slow", "chunks": "mock-slow-chunks"}[role]

    def start(self):
        e = self.env
        conf = write_litellm_conf(e.tmp, e.mock_port, e.slow_port)
        env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_LOG="ERROR",
                   LITELLM_TELEMETRY="False", DISABLE_SCHEMA_UPDATE="true", NO_DOCS="True")
        env.pop("DATABASE_URL", None)
        cmd = [e.litellm, "--config", conf, "--host", "127.0.0.1", "--port", str(self.port),
               "--num_workers", str(e.litellm_workers)]
        p = Proc("litellm", cmd, cpus=e.server_cpus, env=env, log_dir=e.tmp)
        self.procs = [p]
        wait_http(self.json_url, self.small_body(), proc=p, timeout=120)


class Compactor(System):
    """Three instances of the same binary and config, one per upstream path of the mocks (the
    proxy has one upstream base URL; the nginx mock picks JSON or SSE by path): `main` for plain
    requests, `sse` for the fast stream, `slow` (the slow mock) for open streams and chunk timing."""
    name = "Compactor"

    def __init__(self, env, log_on=False):
        """`log_on`: `COMPACTOR_LOG=info` (the default: a line per request, to stderr, which the
        run sends to a file), else BENCH_COMPACTOR_LOG (default warn: no line per request)."""
        self.env = env
        self.log_on = log_on
        if log_on:
            self.name = self.name + LOG_ON
        self.ports = {k: free_port() for k in ("main", "sse", "slow")}
        self.json_url = f"http://127.0.0.1:{self.ports['main']}/v1/chat/completions"
        self.sse_url = f"http://127.0.0.1:{self.ports['sse']}/v1/chat/completions"
        self.slow_url = f"http://127.0.0.1:{self.ports['slow']}/v1/chat/completions"

    def start_instance(self, key, port, upstream, config_text):
        e = self.env
        cfg = os.path.join(e.tmp, f"compactor-{key}.toml")
        with open(cfg, "w") as f:
            f.write(config_text)
        cmd = [e.compactor, "serve", "--listen", f"127.0.0.1:{port}", "--upstream", upstream,
               "--config", cfg]
        level = "info" if self.log_on else os.environ.get("BENCH_COMPACTOR_LOG", "warn")
        env = dict(os.environ, COMPACTOR_LOG=level)
        if self.log_on:
            key = f"log-{key}"
        return Proc(f"compactor-{key}", cmd, cpus=e.server_cpus, env=env, log_dir=e.tmp)

    def config_file(self):
        return self.env.compactor_config

    def start(self):
        e = self.env
        text = compactor_config_text(self.config_file(), {"store": "memory", "log_format": "text"})
        ups = {"main": f"http://127.0.0.1:{e.mock_port}/v1",
               "sse": f"http://127.0.0.1:{e.mock_port}/sse/v1",
               "slow": f"http://127.0.0.1:{e.slow_port}/slow-sse/v1"}
        inst = {k: self.start_instance(k, self.ports[k], ups[k], text) for k in ups}
        self.procs, self.sse_procs, self.slow_procs = [inst["main"]], [inst["sse"]], [inst["slow"]]
        wait_http(self.json_url, self.small_body(), proc=inst["main"])
        wait_http(self.sse_url, self.small_body("sse"), proc=inst["sse"])
        wait_http(self.slow_url, self.small_body(), proc=inst["slow"])


class BaselineCompactor(Compactor):
    """Another build of Compactor (--baseline-compactor), measured beside the current one in the
    same run: same config, same mocks, interleaved in every round."""

    def __init__(self, env, log_on=False):
        super().__init__(env, log_on)
        self.name = f"Compactor {env.baseline_name}" + (LOG_ON if log_on else "")

    def config_file(self):
        """The config/compactor.toml of the tree the binary was built in (an older build may not
        know keys added since), else --compactor-config."""
        tree = subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(self.env.baseline_compactor)),
                               "rev-parse", "--show-toplevel"], capture_output=True, text=True).stdout.strip()
        own = os.path.join(tree, "config", "compactor.toml") if tree else ""
        return own if own and os.path.exists(own) else self.env.compactor_config

    def start_instance(self, key, port, upstream, config_text):
        binary = self.env.compactor
        self.env.compactor = self.env.baseline_compactor
        try:
            return super().start_instance(f"baseline-{key}", port, upstream, config_text)
        finally:
            self.env.compactor = binary


def is_compactor(name):
    return name.startswith("Compactor")


def is_log_twin(name):
    """A system's twin with its request log on: measured in the load rounds only."""
    return name.endswith(LOG_ON)


# ----------------------------------------------------------------------------------------------
# measurements


def pct(values, q):
    if not values:
        return None
    v = sorted(values)
    k = (len(v) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


LOADS = []  # the 1-minute load average at each log line, for the report


def log(msg):
    LOADS.append(os.getloadavg()[0])
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def sched_seconds(procs):
    """(CPU time, time spent runnable but waiting for a CPU) so far, summed over the processes'
    trees and their threads, from /proc/PID/task/TID/schedstat (nanoseconds; /proc/PID/stat
    counts only whole clock ticks)."""
    run_ns = wait_ns = 0
    for p in procs:
        for pid in p.tree():
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                try:
                    with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                        fields = f.read().split()
                    run_ns += int(fields[0])
                    wait_ns += int(fields[1])
                except (OSError, IndexError, ValueError):
                    pass
    return run_ns / 1e9, wait_ns / 1e9


def cpu_seconds(procs):
    return sched_seconds(procs)[0]


def wait_idle(procs, limit=0.05, timeout=60):
    """Waits until the processes use less than `limit` of a core (a slow system may still be
    working off requests that the load generator gave up on), so that the next measurement does
    not pay for them."""
    if not procs:
        return
    t0 = time.time()
    while time.time() - t0 < timeout:
        c0 = cpu_seconds(procs)
        time.sleep(0.5)
        if (cpu_seconds(procs) - c0) / 0.5 < limit:
            return


def prepare_system(sys_, env, res):
    """Warm-up, then RSS at idle."""
    sys_.body_file = os.path.join(env.tmp, f"small-{sys_.name}.json")
    with open(sys_.body_file, "wb") as f:
        f.write(sys_.small_body())
    run_fixed_rate(env, sys_.json_url, sys_.body_file, 200, 1, 8)
    wait_idle(sys_.procs)
    time.sleep(0.5)
    res["rss_idle_kb"] = sum(p.rss_kb() for p in sys_.procs) if sys_.procs else None


def load_rounds(systems, env, results):
    """Fixed rates and saturation, interleaved: each round runs every system once, in a rotating
    order, so that all systems share the same moments of the machine; the figures are medians
    over the rounds."""
    samplers = {s.name: RssSampler(s.procs) for s in systems}
    for smp in samplers.values():
        smp.__enter__()
    try:
        phases = [("rate", r) for r in env.rates] + [("sat", None)]
        for kind, rate in phases:
            for rnd in range(env.rounds):
                order = systems[rnd % len(systems):] + systems[:rnd % len(systems)]
                for s in order:
                    c0 = cpu_seconds(s.procs)
                    if kind == "rate":
                        log(f"{s.name}: {rate} req/s for {env.seconds}s (round {rnd + 1}/{env.rounds})")
                        r = run_fixed_rate(env, s.json_url, s.body_file, rate, env.seconds,
                                           env.oha_conns)
                        results[s.name].setdefault(f"rate{rate}_rounds", []).append(r)
                    else:
                        log(f"{s.name}: saturation, wrk -c{env.wrk_conns} for {env.seconds}s "
                            f"(round {rnd + 1}/{env.rounds})")
                        r = run_wrk(s.json_url, s.body_file, env.seconds, env.wrk_conns,
                                    env.wrk_threads, env.load_cpus)
                        results[s.name].setdefault("sat_rounds", []).append(r)
                    wait_idle(s.procs)
                    # CPU of the system's processes for this run (including requests it was
                    # still working off afterwards), per request answered
                    done = r.get("ok") if kind == "rate" else r["requests"]
                    r["cpu_us_per_req"] = (1e6 * (cpu_seconds(s.procs) - c0) / done
                                           if s.procs and done else None)
    finally:
        for smp in samplers.values():
            smp.__exit__()
    for s in systems:
        res = results[s.name]
        res["rss_load_kb"] = samplers[s.name].max if s.procs else None
        for rate in env.rates:
            rounds = res[f"rate{rate}_rounds"]
            res[f"rate{rate}"] = {
                **{k: statistics.median(r[k] for r in rounds) for k in ("p50", "p90", "p99", "rps")},
                "cpu_us_per_req": (statistics.median(r["cpu_us_per_req"] for r in rounds)
                                   if s.procs else None),
                "success": min(r["success"] or 0 for r in rounds),
                "p99_rounds": [r["p99"] for r in rounds],
            }
        rounds = res["sat_rounds"]
        res["sat"] = {"rps": statistics.median(r["rps"] for r in rounds),
                      "errors": sum(r["errors"] for r in rounds),
                      "p50_us": statistics.median(r["p50_us"] for r in rounds),
                      "p99_us": statistics.median(r["p99_us"] for r in rounds),
                      "cpu_us_per_req": (statistics.median(r["cpu_us_per_req"] for r in rounds)
                                         if s.procs else None),
                      "rps_rounds": [r["rps"] for r in rounds]}


def measure_streaming(sys_, env, res):
    """Streaming time to first byte, chunk timing, open streams."""
    log(f"{sys_.name}: streaming time-to-first-byte ({env.ttfb_n} samples)")
    heads, firsts, statuses = clients.ttfb(sys_.sse_url, sys_.small_body("sse"), env.ttfb_n)
    res["ttfb"] = {"p50": pct(firsts, .5), "p99": pct(firsts, .99), "head_p50": pct(heads, .5),
                   "n": len(firsts), "statuses": sorted(statuses)}
    delays, status = clients.chunk_delays(sys_.slow_url,
                                          sys_.small_body("chunks", user=f"slow:{CHUNK_MS}ms:{CHUNKS}"))
    res["chunks"] = {"n": len(delays), "max": max(delays) if delays else None,
                     "p50": pct(delays, .5), "status": status}
    if env.streams:
        log(f"{sys_.name}: {env.streams} concurrent open streams")
        procs = sys_.slow_procs or sys_.procs
        out = clients.open_streams(sys_.slow_url, sys_.small_body("slow"), env.streams,
                                   lambda n: sum(p.rss_kb() for p in procs) if procs else None,
                                   ramp_s=1.0, hold_s=1.0, timeout_s=env.streams_timeout)
        time.sleep(3.0)
        out["mock_streams_after_close"] = env.slow_stats().get("streams_open")
        res["streams"] = out


def sdk_rounds(systems, env, results):
    """The real-SDK row: each round is one SDK process measuring every system interleaved,
    request by request (scripts/bench/sdk_client.py). Added p50 is taken per round against that
    round's direct, and reported as the median over rounds beside the pooled figures."""
    systems = [s for s in systems if s.name != "LiteLLM" and not is_log_twin(s.name)]
    kinds = ("json", "sse", "sse_first")
    times = {s.name: {k: [] for k in kinds} for s in systems}
    per_round = {s.name: {k: [] for k in kinds} for s in systems}
    for rnd in range(env.sdk_rounds):
        log(f"OpenAI Python SDK, {env.sdk_n} requests each way per system, interleaved: "
            + ", ".join(s.name for s in systems) + f" (round {rnd + 1}/{env.sdk_rounds})")
        got = run_sdk_client(systems, env)
        for s in systems:
            for kind in kinds:
                times[s.name][kind] += got[s.name][kind]
                per_round[s.name][kind].append(pct(got[s.name][kind], .5) - pct(got["direct"][kind], .5))
    for s in systems:
        results[s.name]["sdk"] = {
            kind: {"p50": pct(v, .5), "p99": pct(v, .99), "n": len(v),
                   "added_p50_rounds": per_round[s.name][kind],
                   "added_p50_median": statistics.median(per_round[s.name][kind])}
            for kind, v in times[s.name].items()}


def run_sdk_client(systems, env):
    """The OpenAI Python SDK as applications use it (httpx, connections kept alive): wall time
    per request, non-streaming and streaming, sequential, the systems interleaved request by
    request (scripts/bench/sdk_client.py)."""
    cmd = [env.sdk_python, os.path.join(HERE, "sdk_client.py"), "--api-key", clients.BENCH_KEY,
           "-n", str(env.sdk_n)]
    for s in systems:
        base = s.json_url.rsplit("/chat/completions", 1)[0]
        sse_base = s.sse_url.rsplit("/chat/completions", 1)[0]
        cmd += ["--system", f"{s.name}={base},{sse_base}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900 * len(systems))
    if out.returncode != 0:
        raise RuntimeError(f"sdk_client.py failed: {out.stderr.strip()[-400:]}")
    return json.loads(out.stdout)


def measure_large(sys_, env, res, conv):
    """A ~128k-token real conversation plus one new turn: cold (never seen before) and warm (the
    client's next request: the same conversation, which the proxy has seen, plus one turn). Sent
    as --large-model (default gpt-4.1, whose 1M window keeps this a measure-and-forward request),
    or with the conversation's own model name."""
    model = env.large_model or conv["model"]
    msgs, tools = conv["messages"], conv["tools"]
    run_id = f"{os.getpid()}-{sys_.name}"
    # cold: every message differs from anything sent before (a nonce in each), so no cache hits
    cold_bodies = [conversation.body(model, conversation.with_nonce(msgs, f"{run_id}-c{i}")
                                     + conversation.turns(1), tools) for i in range(env.large_cold)]
    # warm: one conversation growing by one turn per request; the first request seeds the cache
    base = conversation.with_nonce(msgs, f"{run_id}-w")
    warm_bodies = [conversation.body(model, base + conversation.turns(i + 1), tools)
                   for i in range(env.large_warm + 1)]
    c0 = sched_seconds(sys_.procs)
    cold = clients.timed_posts(sys_.json_url, cold_bodies)
    wait_idle(sys_.procs)
    c1 = sched_seconds(sys_.procs)
    warm = clients.timed_posts(sys_.json_url, warm_bodies[:1])
    wait_idle(sys_.procs)
    c2 = sched_seconds(sys_.procs)
    warm = clients.timed_posts(sys_.json_url, warm_bodies[1:])
    wait_idle(sys_.procs)
    c3 = sched_seconds(sys_.procs)
    res["large"] = {
        "bytes": len(warm_bodies[0]),
        "cold": [t for t, *_ in cold], "warm": [t for t, *_ in warm],
        "statuses": sorted({s for _, s, _ in cold + warm}),
        "headers": {k: v for k, v in (warm[-1][2] if warm else {}).items() if k.startswith("x-compactor")},
        "cold_headers": {k: v for k, v in (cold[-1][2] if cold else {}).items() if k.startswith("x-compactor")},
        "cold_cpu_ms": 1e3 * (c1[0] - c0[0]) / len(cold) if sys_.procs and cold else None,
        "warm_cpu_ms": 1e3 * (c3[0] - c2[0]) / len(warm) if sys_.procs and warm else None,
        "cold_wait_ms": 1e3 * (c1[1] - c0[1]) / len(cold) if sys_.procs and cold else None,
        "warm_wait_ms": 1e3 * (c3[1] - c2[1]) / len(warm) if sys_.procs and warm else None,
    }


def measure_compaction(env, direct_url, conv_soft, conv_hard):
    """Compaction with a summarizer that answers after 2 s (the slow mock), through a Compactor
    whose model window is set so that conv_soft passes the soft threshold and conv_hard the hard
    one. Returns dict of results (or {'na': reason})."""
    out = {}
    port = free_port()
    c = Compactor(env)
    text = compactor_config_text(env.compactor_config, {"store": "memory"},
                                 windows={COMPACT_MODEL: env.compact_window})
    p = c.start_instance("compaction", port, f"http://127.0.0.1:{env.slow_port}/slow-sse/v1", text)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    try:
        wait_http(url, clients.json_body(dict(SMALL, model=COMPACT_MODEL)), proc=p)

        def bodies(conv, nonce, n):
            """the conversation, then the same growing by one turn per request (n bodies)"""
            msgs = conversation.with_nonce(conv["messages"], nonce)
            return [conversation.body(COMPACT_MODEL, msgs + conversation.turns(i), conv["tools"])
                    for i in range(n)]

        def summaries():
            return env.slow_stats().get("summary_requests", 0)

        # the floor: the same bodies straight to the slow mock
        floor = [t for t, *_ in clients.timed_posts(direct_url, bodies(conv_hard, "floor", 3))]
        out["floor_ms"] = 1e3 * statistics.median(floor)

        # (a) blocking: a conversation first seen already over the hard threshold
        s0 = summaries()
        b = bodies(conv_hard, f"block-{os.getpid()}", 4)
        r = clients.timed_posts(url, b[:1])
        out["blocking_first_ms"] = 1e3 * r[0][0]
        out["blocking_headers"] = {k: v for k, v in r[0][2].items() if k.startswith("x-compactor")}
        out["blocking_status"] = r[0][1]
        time.sleep(0.2)
        after = clients.timed_posts(url, b[1:])
        out["after_checkpoint_ms"] = [1e3 * t for t, *_ in after]
        out["after_headers"] = {k: v for k, v in after[-1][2].items() if k.startswith("x-compactor")}
        out["summary_requests_blocking"] = summaries() - s0

        # (b) ahead of time: first past the soft threshold, then (after the summary is done) past
        # the hard one
        s1 = summaries()
        nonce = f"aot-{os.getpid()}"
        soft = bodies(conv_soft, nonce, 1)  # conv_hard's messages start with conv_soft's
        r = clients.timed_posts(url, soft)
        out["soft_ms"] = 1e3 * r[0][0]
        out["soft_headers"] = {k: v for k, v in r[0][2].items() if k.startswith("x-compactor")}
        time.sleep(env.summary_delay + 1.0)
        hard = bodies(conv_hard, nonce, 1)
        r = clients.timed_posts(url, hard)
        out["hard_after_aot_ms"] = 1e3 * r[0][0]
        out["hard_after_aot_headers"] = {k: v for k, v in r[0][2].items() if k.startswith("x-compactor")}
        out["summary_requests_aot"] = summaries() - s1

        # (c) the crossing request as an agent sends it: the conversation grows from the soft
        # threshold a few messages per request, so only the newest turn is new to the proxy;
        # timed is the first request that the proxy compacts. Once with ahead-of-time
        # compaction (the summary is ready by then), once with a fresh conversation on an
        # instance that has it turned off.
        def crossing(target_url, tag):
            msgs = conversation.with_nonce(conv_hard["messages"], tag)
            n_soft = len(conv_soft["messages"])
            step = max(1, (len(msgs) - n_soft) // 30)
            clients.timed_posts(target_url, [conversation.body(COMPACT_MODEL, msgs[:n_soft], conv_hard["tools"])])
            time.sleep(env.summary_delay + 1.0)
            for k in list(range(n_soft + step, len(msgs), step)) + [len(msgs)]:
                body = conversation.body(COMPACT_MODEL, msgs[:k], conv_hard["tools"])
                (t, status, headers), = clients.timed_posts(target_url, [body])
                if headers.get("x-compactor-compacted") == "true":
                    floor = clients.timed_posts(direct_url, [body] * 3)
                    return {"ms": 1e3 * t, "floor_ms": 1e3 * statistics.median(x for x, *_ in floor),
                            "headers": {k2: v for k2, v in headers.items() if k2.startswith("x-compactor")}}
            return None

        samples_aot = [crossing(url, f"cross-aot-{os.getpid()}-{i}") for i in range(3)]
        off_text = compactor_config_text(env.compactor_config, {"store": "memory"},
                                         windows={COMPACT_MODEL: env.compact_window}) \
            + "\n# measuring the same path without ahead-of-time compaction\n"
        off_text = off_text.replace("ahead_of_time = true", "ahead_of_time = false")
        off_port = free_port()
        off = c.start_instance("compaction-no-aot", off_port, f"http://127.0.0.1:{env.slow_port}/slow-sse/v1", off_text)
        off_url = f"http://127.0.0.1:{off_port}/v1/chat/completions"
        try:
            wait_http(off_url, clients.json_body(dict(SMALL, model=COMPACT_MODEL)), proc=off)
            samples_off = [crossing(off_url, f"cross-off-{os.getpid()}-{i}") for i in range(3)]
        finally:
            off.stop()
        def added(samples):
            ok = [x for x in samples if x]
            return (statistics.median(x["ms"] - x["floor_ms"] for x in ok), ok[-1]["headers"]) if ok else (None, None)
        out["crossing_aot_added_ms"], out["crossing_aot_headers"] = added(samples_aot)
        out["crossing_no_aot_added_ms"], out["crossing_no_aot_headers"] = added(samples_off)
        out["rss_kb"] = p.rss_kb()
    finally:
        p.stop()
    return out


# ----------------------------------------------------------------------------------------------
# report


def ms(v, digits=3):
    return "n/a" if v is None else f"{v * 1e3:.{digits}f}"


def mb(kb):
    return "n/a" if kb is None else f"{kb / 1024:.1f}"


def fmt_added(sysres, base, rate):
    a, b = sysres.get(f"rate{rate}"), base.get(f"rate{rate}")
    if not a or not b or a.get("p50") is None:
        return "n/a", "n/a", "n/a"
    return tuple(f"{(a[k] - b[k]) * 1e3:+.3f}" for k in ("p50", "p90", "p99"))


def report(env, results, extra):
    now = datetime.datetime.now()
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    systems = list(results)  # in the order they were started: direct first
    base = results.get("direct", {})
    L = []
    L.append(f"# Load benchmark, {now:%Y-%m-%d}")
    L.append("")
    L.append(f"- Date: {now:%Y-%m-%d %H:%M} (local time)")
    L.append(f"- Machine: {os.cpu_count()} cores, {cpu}, Linux {platform.release()}")
    L.append(f"- Pinning: {env.pin_note}; all benchmark processes at {env.sched}")
    load_end = os.getloadavg()[0]
    load_max = max(LOADS + [env.load_start, load_end])
    busy = load_max > 1.5
    L.append(f"- Load average (1 min) at start / end / highest seen during the run: "
             f"{env.load_start:.2f} / {load_end:.2f} / {load_max:.2f}"
             + (" — **other work was running on the machine**: tail latencies (p90, p99) and "
                "throughput are inflated by it; medians and CPU per request are the steadier figures "
                "(on a shared machine, `--realtime` shields the servers)"
                if busy else ""))
    L.append(f"- Tools: {env.versions}")
    L.append(f"- Command: `{env.command}`")
    L.append(f"- Mock upstream: nginx answering from memory: a fixed chat completion "
             f"({len(JSON_COMPLETION)} B) and a fixed SSE stream ({len(SSE_STREAM)} B, 6 events); "
             f"slow streams and the 2 s summarizer come from `scripts/bench/slow_mock.py`. The mocks report "
             f"`usage.prompt_tokens: 0` (unknown), so that no fixed figure calibrates Compactor's token counter.")
    L.append(f"- Small request: `{json.dumps(SMALL)}` ({len(clients.json_body(SMALL))} B)")
    fixed = (f"oha `-q RATE -c {env.oha_conns} --latency-correction`" if env.oha else
             f"wrk `-t1 -c{env.oha_conns}`, each connection pausing {env.oha_conns}/RATE s on average "
             f"(exponentially distributed) after each answer (oha was not available: a closed loop "
             f"without latency correction, so its figures are not comparable with oha's open-loop ones)")
    L.append(f"- Fixed rates: {fixed}; saturation: wrk "
             f"`-t{env.wrk_threads} -c{env.wrk_conns}`; each {env.rounds} rounds of {env.seconds} s per "
             f"system, the systems interleaved (every round runs each system once, in rotating order); "
             f"figures are medians over the rounds. Added latency = the system's percentile minus "
             f"direct's percentile at the same rate.")
    if "sdk" in env.phases and env.sdk_python:
        L.append(f"- OpenAI Python SDK rows: {env.sdk_rounds} rounds, each one SDK process sending "
                 f"{env.sdk_n} requests per system and kind, the systems interleaved request by "
                 f"request in an order rotated at every step.")
    L.append("")
    L.append("## Per system")
    L.append("")
    L.append("| | " + " | ".join(systems) + " |")
    L.append("|---|" + "---|" * len(systems))

    def row(label, fn):
        cells = []
        for s in systems:
            try:
                cells.append(fn(results[s]))
            except Exception:  # noqa: BLE001
                cells.append("n/a")
        L.append(f"| {label} | " + " | ".join(cells) + " |")

    for rate in env.rates:
        row(f"{rate} req/s: latency p50 / p90 / p99 (ms)",
            lambda r, rate=rate: " / ".join(ms(r[f"rate{rate}"][k]) for k in ("p50", "p90", "p99")))
        row(f"{rate} req/s: **added** p50 / p90 / p99 (ms)",
            lambda r, rate=rate: "floor" if r is base else " / ".join(fmt_added(r, base, rate)))
        row(f"{rate} req/s: achieved req/s, success",
            lambda r, rate=rate: f"{r[f'rate{rate}']['rps']:.0f}, {100 * (r[f'rate{rate}']['success'] or 0):.1f}%")
    row("CPU per request at 1,000 req/s / at saturation (µs)",
        lambda r: "–" if r["rate1000"]["cpu_us_per_req"] is None else
        f"{r['rate1000']['cpu_us_per_req']:.0f} / {r['sat']['cpu_us_per_req']:.0f}")
    row("max throughput (req/s, wrk)", lambda r: f"{r['sat']['rps']:,.0f}" + (f" ({r['sat']['errors']} errors)" if r['sat']['errors'] else ""))
    row("saturation latency p50 / p99 (ms)", lambda r: f"{r['sat']['p50_us'] / 1e3:.2f} / {r['sat']['p99_us'] / 1e3:.2f}")
    row("RSS idle (MB)", lambda r: "–" if r["rss_idle_kb"] is None else mb(r["rss_idle_kb"]))
    row("RSS under load, max (MB)", lambda r: "–" if r["rss_load_kb"] is None else mb(r["rss_load_kb"]))
    row("stream TTFB p50 / p99 (ms)", lambda r: f"{ms(r['ttfb']['p50'])} / {ms(r['ttfb']['p99'])}")
    row("stream TTFB **added** p50 / p99 (ms)",
        lambda r: "floor" if r is base else
        f"{(r['ttfb']['p50'] - base['ttfb']['p50']) * 1e3:+.3f} / {(r['ttfb']['p99'] - base['ttfb']['p99']) * 1e3:+.3f}")
    for kind, label in (("json", "non-streaming"), ("sse", "streaming, whole stream"),
                        ("sse_first", "streaming, time to first event")):
        row(f"OpenAI Python SDK, kept alive, {label}: p50 / p99 (ms)",
            lambda r, kind=kind: f"{ms(r['sdk'][kind]['p50'])} / {ms(r['sdk'][kind]['p99'])}")
        row(f"OpenAI Python SDK, kept alive, {label}: **added** p50 / p99 (ms), all rounds pooled",
            lambda r, kind=kind: "floor" if r is base else " / ".join(
                f"{(r['sdk'][kind][q] - base['sdk'][kind][q]) * 1e3:+.3f}" for q in ("p50", "p99")))
        row(f"OpenAI Python SDK, kept alive, {label}: **added p50 per round** against the same "
            f"round's direct, median (ms) [each round]",
            lambda r, kind=kind: "floor" if r is base else
            f"{r['sdk'][kind]['added_p50_median'] * 1e3:+.3f} ["
            + ", ".join(f"{x * 1e3:+.2f}" for x in r['sdk'][kind]['added_p50_rounds']) + "]")
    row(f"slow stream ({CHUNKS} chunks {CHUNK_MS} ms apart): chunk delay p50 / max (ms)",
        lambda r: f"{ms(r['chunks']['p50'])} / {ms(r['chunks']['max'])}" + ("" if r['chunks']['n'] == CHUNKS else f" ({r['chunks']['n']} chunks)"))
    if env.streams:
        row(f"{env.streams} open streams: open / RSS (MB)",
            lambda r: f"{r['streams']['open']}/{r['streams']['requested']} / "
                      + ("–" if r['streams']['measured'] is None else mb(r['streams']['measured'])))
        row(f"{env.streams} open streams: upstream streams left 3 s after clients closed",
            lambda r: str(r['streams']['mock_streams_after_close']))
    L.append("")
    L.append("RSS is VmRSS from /proc, summed over the process tree (nginx: master + worker; "
             "LiteLLM: all its processes). For Compactor it is the instance serving that request "
             "kind (see below). \"–\": no process of its own.")
    L.append("")

    L += saturation_table(env, results)
    comp = results.get("Compactor")
    L.append("## Compactor only")
    L.append("")
    if extra.get("large_na"):
        L.append(f"- 128k-token conversation: n/a: {extra['large_na']}")
    elif comp and "large" in comp:
        cl, bl = comp["large"], base.get("large")
        builds = [(name, results[name]["large"]) for name in systems
                  if is_compactor(name) and "large" in results[name]]
        conv = extra["conv"]
        L.append(f"- 128k-token conversation: `{conv['source']}` cut to {len(conv['messages'])} messages, "
                 f"{conv['tokens']:,} tokens ({conv['counter']}), sent as model `{env.large_model or conv['model']}`, "
                 f"{cl['bytes']:,} B body, plus one new turn; statuses {cl['statuses']}. Cold: every "
                 f"message new to the proxy; warm: the conversation the proxy has just seen, one turn "
                 f"longer (each sample one turn more). Sequential requests on one connection.")
        L.append("")
        L.append("| 128k conversation + 1 turn | direct p50 (ms) | Compactor p50 / max (ms) | added p50 (ms) | "
                 "Compactor CPU / waiting for a CPU, per request (ms) |")
        L.append("|---|---|---|---|---|")
        for name, gl in builds:
            for k, label in (("cold", f"cold (first time, {len(gl['cold'])} samples)"),
                             ("warm", f"warm (seen before, {len(gl['warm'])} samples)")):
                if len(builds) > 1:
                    label = f"{name}: {label}"
                d = statistics.median(bl[k]) if bl and bl.get(k) else None
                c = statistics.median(gl[k]) if gl.get(k) else None
                added = f"{(c - d) * 1e3:+.2f}" if c is not None and d is not None else "n/a"
                cpu, wait = gl.get(f"{k}_cpu_ms"), gl.get(f"{k}_wait_ms")
                L.append(f"| {label} | {ms(d, 2)} | {ms(c, 2)} / {ms(max(gl[k]) if gl.get(k) else None, 2)} | "
                         f"{added} | {'n/a' if cpu is None else f'{cpu:.2f}'} / "
                         f"{'n/a' if wait is None else f'{wait:.2f}'} |")
        for key, label in (("cold_headers", "cold"), ("headers", "warm")):
            if cl.get(key):
                L.append("")
                L.append(f"Response headers ({label}): " + ", ".join(f"`{k}: {v}`" for k, v in sorted(cl[key].items())))
    L.append("")
    cr = extra.get("compaction")
    if cr is None:
        pass
    elif "na" in cr:
        L.append(f"- Compaction with a 2 s summarizer: n/a: {cr['na']}")
    else:
        L.append(f"- Compaction with a summarizer that answers after {env.summary_delay:g} s "
                 f"(model window set to {env.compact_window:,} tokens; soft request "
                 f"{extra['conv_soft']['tokens']:,} tokens, hard request {extra['conv_hard']['tokens']:,} tokens). "
                 f"Direct floor for the hard request: {cr['floor_ms']:.2f} ms.")
        L.append("")
        L.append("| compaction path | latency (ms) | summary requests | headers |")
        L.append("|---|---|---|---|")

        def hdr(h):
            return ", ".join(f"`{k.removeprefix('x-compactor-')}: {v}`" for k, v in sorted(h.items())) or "none"
        L.append(f"| blocking: first request already over the window | {cr['blocking_first_ms']:.1f} "
                 f"(status {cr['blocking_status']}) | {cr['summary_requests_blocking']} | {hdr(cr['blocking_headers'])} |")
        L.append(f"| next turns, checkpoint applied (median of {len(cr['after_checkpoint_ms'])}) | "
                 f"{statistics.median(cr['after_checkpoint_ms']):.2f} | | {hdr(cr['after_headers'])} |")
        L.append(f"| ahead of time: request past the soft threshold | {cr['soft_ms']:.2f} | "
                 f"{cr['summary_requests_aot']} | {hdr(cr['soft_headers'])} |")
        L.append(f"| ahead of time: later request past the window | {cr['hard_after_aot_ms']:.2f} | | "
                 f"{hdr(cr['hard_after_aot_headers'])} |")
        L.append("")
        L.append("The crossing request as an agent sends it (the conversation grows turn by turn from the soft "
                 "threshold; timed is the first request the proxy compacts; added = its latency minus the same "
                 "body sent direct; median of 3 conversations):")
        L.append("")
        L.append("| crossing request | added p50 (ms) | headers |")
        L.append("|---|---|---|")
        for key, label in (("crossing_aot", "with ahead-of-time compaction"),
                           ("crossing_no_aot", "without (ahead_of_time = false)")):
            v = cr.get(f"{key}_added_ms")
            L.append(f"| {label} | {'n/a' if v is None else f'{v:.2f}'} | {hdr(cr.get(f'{key}_headers') or {})} |")
    L.append("")

    # targets
    L.append("## Targets (issue 5)")
    L.append("")
    L.append("| target | measured | |")
    L.append("|---|---|---|")
    for t in targets(env, results, extra):
        L.append(f"| {t[0]} | {t[1]} | {t[2]} |")
    L.append("")
    for n in extra.get("notes", []):
        L.append(f"- {n}")
    return "\n".join(L) + "\n"


def saturation_table(env, results):
    """Saturated throughput beside nginx's at the same connection count, with the request log
    off and on for both, and what the log line costs each (issue 26, points 1 and 2)."""
    n, nl = results.get("nginx"), results.get("nginx" + LOG_ON)
    builds = [k for k in results if is_compactor(k) and not is_log_twin(k)]
    if not n or not builds:
        return []
    L = ["## Saturation beside nginx, request log off and on", "",
         f"wrk `-t{env.wrk_threads} -c{env.wrk_conns}` against every system (same connection count), "
         f"median of {env.rounds} interleaved rounds. Log off: nginx `access_log off`, Compactor "
         f"`COMPACTOR_LOG=warn`. Log on: nginx `access_log` (combined format, unbuffered, to a file), "
         f"Compactor `COMPACTOR_LOG=info` (its default: one line per request, stderr to a file). "
         f"Log cost = 1 − (req/s with log on ÷ req/s with it off).", "",
         "| system | req/s, log off | req/s, log on | log line's cost | ÷ nginx, log off | ÷ nginx, log on | "
         "CPU per request, off / on (µs) |",
         "|---|---|---|---|---|---|---|"]

    def rps(r):
        return r["sat"]["rps"] if r and r.get("sat") else None

    def cpu(r):
        v = r["sat"].get("cpu_us_per_req") if r and r.get("sat") else None
        return "n/a" if v is None else f"{v:.0f}"

    for name in ["nginx"] + builds:
        off, on = results.get(name), results.get(name + LOG_ON)
        a, b = rps(off), rps(on)
        cost = f"{100 * (1 - b / a):.1f} %" if a and b else "n/a"
        r_off = f"{a / rps(n):.2f}×" if a and rps(n) else "n/a"
        r_on = f"{b / rps(nl):.2f}×" if b and rps(nl) else "n/a"
        L.append(f"| {name} | {'n/a' if a is None else f'{a:,.0f}'} | {'n/a' if b is None else f'{b:,.0f}'} | "
                 f"{cost} | {r_off} | {r_on} | {cpu(off)} / {cpu(on)} |")
    L.append("")
    return L


def verdict(ok):
    return "n/a" if ok is None else ("met" if ok else "**not met**")


def targets(env, results, extra):
    out = []
    c, d, n, ll = (results.get(k) for k in ("Compactor", "direct", "nginx", "LiteLLM"))
    if c is None or d is None:
        out.append(("all Compactor targets", "n/a: Compactor not measured", "n/a"))
        return out

    def added(r, k, rate=1000):
        try:
            return r[f"rate{rate}"][k] - d[f"rate{rate}"][k]
        except (KeyError, TypeError):
            return None
    a50, a99 = added(c, "p50"), added(c, "p99")
    out.append(("1,000 req/s: added p50 ≤ 0.1 ms", ms(a50), verdict(None if a50 is None else a50 <= 0.0001)))
    out.append(("1,000 req/s: added p99 ≤ 1 ms", ms(a99), verdict(None if a99 is None else a99 <= 0.001)))
    if n:
        out.append(("(reference) nginx added p50 / p99 at 1,000 req/s", f"{ms(added(n, 'p50'))} / {ms(added(n, 'p99'))}", ""))
    if ll:
        for k in ("p50", "p99"):
            la, ca = added(ll, k), added(c, k)
            if la is None or ca is None:
                out.append((f"≥ 20× less added {k} than LiteLLM", "n/a", "n/a"))
                continue
            ok_rate = ll["rate1000"]["success"] or 0
            ratio = "∞" if ca <= 0 else f"{la / ca:.0f}×"
            note = "" if ok_rate >= 0.999 and abs(ll["rate1000"]["rps"] - 1000) < 50 else \
                f" (LiteLLM kept {ll['rate1000']['rps']:.0f} req/s, {100 * ok_rate:.1f}% ok)"
            out.append((f"≥ 20× less added {k} than LiteLLM at 1,000 req/s",
                        f"LiteLLM {ms(la)} ms vs Compactor {ms(ca)} ms: {ratio}{note}",
                        verdict(ca <= 0 or la / ca >= 20)))
    lg = c.get("large")
    if lg and d.get("large") and lg.get("warm"):
        w = statistics.median(lg["warm"]) - statistics.median(d["large"]["warm"])
        out.append(("128k conversation + 1 turn, warm: ≤ 3 ms added", f"{w * 1e3:+.2f} ms (p50)", verdict(w <= 0.003)))
    else:
        out.append(("128k conversation + 1 turn, warm: ≤ 3 ms added", "n/a: " + (extra.get("large_na") or "not measured"), "n/a"))
    if c.get("ttfb") and d.get("ttfb"):
        t50 = c["ttfb"]["p50"] - d["ttfb"]["p50"]
        t99 = c["ttfb"]["p99"] - d["ttfb"]["p99"]
        out.append(("streaming TTFB added ≤ 1 ms", f"p50 {t50 * 1e3:+.3f} ms, p99 {t99 * 1e3:+.3f} ms",
                    verdict(t50 <= 0.001) + (" (p50)" if t50 <= 0.001 < t99 else "")))
    if c.get("chunks") and d.get("chunks"):
        cm, dm = c["chunks"]["max"], d["chunks"]["max"]
        ok = None if cm is None or dm is None or c["chunks"]["n"] < d["chunks"]["n"] else (cm - dm) < CHUNK_MS / 2000
        out.append((f"chunks never held back ({CHUNKS} chunks {CHUNK_MS} ms apart: no chunk later than "
                    f"direct's worst by half an interval)",
                    f"delay p50 {ms(c['chunks']['p50'])} / max {ms(cm)} ms vs direct {ms(d['chunks']['p50'])} / "
                    f"{ms(dm)} ms, {c['chunks']['n']}/{d['chunks']['n']} chunks", verdict(ok)))
    if c.get("sdk") and d.get("sdk"):
        for kind, label, limit in (("json", "non-streaming: added p50 ≤ 0.2 ms", 0.0002),
                                   ("sse", "streaming: added p50 ≤ 0.2 ms", 0.0002),
                                   ("sse_first", "streaming: time to first event added ≤ 0.5 ms", 0.0005)):
            if not c["sdk"].get(kind):
                continue
            a = c["sdk"][kind]["added_p50_median"]
            out.append((f"(issues 16, 26) OpenAI Python SDK, kept alive, {label}",
                        f"{a * 1e3:+.3f} ms (median over {len(c['sdk'][kind]['added_p50_rounds'])} "
                        f"rounds of the round's added p50)", verdict(a <= limit)))
    else:
        out.append(("(issue 16) OpenAI Python SDK: added p50 ≤ 0.2 ms",
                    "n/a: not measured (no --sdk-python)", "n/a"))
    ri = c.get("rss_idle_kb")
    out.append(("RSS idle ≤ 64 MB", f"{mb(ri)} MB", verdict(None if ri is None else ri <= 64 * 1024)))
    st = c.get("streams")
    if st:
        rs = st.get("measured")
        ok = None if rs is None else (rs <= 200 * 1024 and st["open"] == st["requested"])
        out.append((f"RSS ≤ 200 MB with {st['requested']} concurrent streams",
                    f"{mb(rs)} MB with {st['open']} open", verdict(ok)))
    if n and c.get("sat"):
        ratio = c["sat"]["rps"] / n["sat"]["rps"]
        out.append(("throughput ≥ ½ of nginx's", f"{c['sat']['rps']:,.0f} vs nginx {n['sat']['rps']:,.0f} req/s ({ratio:.2f}×)",
                    verdict(ratio >= 0.5)))
    cl, nl = results.get("Compactor" + LOG_ON), results.get("nginx" + LOG_ON)
    if cl and nl and cl.get("sat") and nl.get("sat"):
        ratio = cl["sat"]["rps"] / nl["sat"]["rps"]
        out.append(("(issue 26) throughput ≥ ½ of nginx's, both with the request log on",
                    f"{cl['sat']['rps']:,.0f} vs nginx {nl['sat']['rps']:,.0f} req/s ({ratio:.2f}×)",
                    verdict(ratio >= 0.5)))
        if c.get("sat"):
            cost = 1 - cl["sat"]["rps"] / c["sat"]["rps"]
            out.append(("(issue 26) the per-request log line costs ≤ 3 % of saturated throughput",
                        f"{100 * cost:.1f} %", verdict(cost <= 0.03)))
    a50, a99 = added(c, "p50"), added(c, "p99")
    out.append(("(issue 26) 1,000 req/s: added p50 ≤ 0.05 ms / p99 ≤ 0.5 ms", f"{ms(a50)} / {ms(a99)}",
                verdict(None if a50 is None or a99 is None else a50 <= 0.00005 and a99 <= 0.0005)))
    # The bounds above are in milliseconds, which move with the host; the ratio to nginx's own
    # added latency in the same run moves much less.
    ratios = []
    na50 = added(n, "p50") if n else None
    if a50 is not None and na50 and na50 > 0:
        ratios.append(f"1,000 req/s {a50 / na50:.2f}×")
    for kind, label in (("json", "SDK non-streaming"), ("sse", "SDK streaming")):
        ck = (c.get("sdk") or {}).get(kind)
        nk = ((n or {}).get("sdk") or {}).get(kind)
        if ck and nk and nk["added_p50_median"] > 0:
            ratios.append(f"{label} {ck['added_p50_median'] / nk['added_p50_median']:.2f}×")
    if ratios:
        out.append(("(reference) Compactor's added p50 ÷ nginx's, same run", ", ".join(ratios), ""))
    cr = extra.get("compaction") or {}
    aot, off = cr.get("crossing_aot_added_ms"), cr.get("crossing_no_aot_added_ms")
    if aot is not None:
        without = "n/a" if off is None else f"{off:.1f} ms"
        out.append(("(issue 7) crossing request added p50 with ahead-of-time compaction ≤ 5 ms",
                    f"{aot:.2f} ms (without: {without})", verdict(aot <= 5.0)))
    return out


# ----------------------------------------------------------------------------------------------
# main


class Env:
    pass


def revision_of(binary):
    """The revision of the tree a binary was built in (its target dir's parent: a worktree of its
    own, or this one), marked when src/ had uncommitted changes."""
    tree = os.path.dirname(os.path.abspath(binary))
    rev = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip() or "unknown revision"
    if subprocess.run(["git", "-C", tree, "status", "--porcelain", "--", ":/src",
                       ":/Cargo.toml", ":/Cargo.lock"],
                      capture_output=True, text=True).stdout.strip():
        rev += " with uncommitted changes in src/"
    return rev


def tool_version(cmd):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
        return (r.stdout + r.stderr).strip().splitlines()[0]
    except Exception:  # noqa: BLE001
        return "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", default="direct,nginx,litellm,compactor",
                    help="comma-separated subset of direct,nginx,litellm,compactor (direct is always measured)")
    ap.add_argument("--seconds", type=int, default=4, help="length of each load run")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of load per rate and for saturation (medians are reported)")
    ap.add_argument("--rates", default="200,1000")
    ap.add_argument("--oha", default="oha")
    ap.add_argument("--litellm", default="litellm")
    ap.add_argument("--litellm-workers", type=int, default=0,
                    help="LiteLLM worker processes (default: one per core given to the servers)")
    ap.add_argument("--compactor", default=os.path.join(ROOT, "target", "release", "compactor"))
    ap.add_argument("--compactor-config", default=os.path.join(ROOT, "config", "compactor.toml"))
    ap.add_argument("--data", default=os.path.join(ROOT, "..", "shared", "data", "conversations"))
    ap.add_argument("--streams", type=int, default=1000, help="concurrent open streams (0: skip)")
    ap.add_argument("--streams-timeout", type=int, default=30)
    ap.add_argument("--ttfb-n", type=int, default=1000)
    ap.add_argument("--sdk-python", default="",
                    help="a Python with the `openai` package, for the real-SDK row ('' skips it)")
    ap.add_argument("--sdk-n", type=int, default=300, help="SDK requests per system, kind and round")
    ap.add_argument("--sdk-rounds", type=int, default=3,
                    help="rounds of the real-SDK row: each an SDK process measuring every system, "
                         "interleaved request by request")
    ap.add_argument("--baseline-compactor", default="",
                    help="another Compactor binary (e.g. an earlier revision's release build) measured "
                         "in the same run, interleaved with --compactor")
    ap.add_argument("--baseline-name", default="before",
                    help="how the report names --baseline-compactor (\"Compactor NAME\")")
    ap.add_argument("--phases", default="load,streaming,sdk,large,compaction",
                    help="what to measure: load (fixed rates, saturation), streaming (TTFB, chunk "
                         "timing, open streams), sdk (the real-SDK row, needs --sdk-python), large "
                         "(the 128k conversation), compaction")
    ap.add_argument("--large-tokens", type=int, default=128000)
    ap.add_argument("--large-model", default="gpt-4.1",
                    help="model name for the large conversation (default gpt-4.1: a 1M window, so "
                         "the request is measured and forwarded, not compacted; '' keeps the "
                         "conversation's own model)")
    ap.add_argument("--large-cold", type=int, default=5)
    ap.add_argument("--large-warm", type=int, default=20)
    ap.add_argument("--summary-delay", type=float, default=2.0)
    ap.add_argument("--compact-window", type=int, default=100000)
    ap.add_argument("--pin", choices=["split", "none"], default="split",
                    help="split: load generators and measuring clients on CPU 0, mock and proxies on "
                         "CPU 1 (default on 2+ cores); none: no pinning")
    ap.add_argument("--nice", type=int, default=-10,
                    help="niceness for this run and everything it starts (inherited), so that other "
                         "work on the machine disturbs the measurements less (negative needs root; "
                         "ignored when not allowed)")
    ap.add_argument("--realtime", action="store_true",
                    help="run the servers (mocks and systems under test) under SCHED_RR priority 1 "
                         "(root), so that other work on a shared machine cannot delay them; the load "
                         "generators and clients stay at --nice; the kernel's real-time throttling "
                         "still leaves others 5%% of a core")
    ap.add_argument("--log", choices=["both", "off"], default="both",
                    help="both: nginx and each Compactor build also run as a twin with its request "
                         "log on (nginx access_log, COMPACTOR_LOG=info) in the load rounds")
    ap.add_argument("--oha-conns", type=int, default=32)
    ap.add_argument("--wrk-conns", type=int, default=64)
    ap.add_argument("--wrk-threads", type=int, default=0,
                    help="wrk threads (default: one per core given to the load generator)")
    ap.add_argument("--out", default=os.path.join(ROOT, "benches", "results"))
    ap.add_argument("--keep-tmp", action="store_true")
    ap.add_argument("--label", default="",
                    help="written as benches/results/DATE-LABEL.md (default DATE.md)")
    a = ap.parse_args()

    env = Env()
    env.__dict__.update(seconds=a.seconds, rounds=a.rounds, rates=[int(x) for x in a.rates.split(",") if x],
                        oha=a.oha, litellm=a.litellm, litellm_workers=a.litellm_workers,
                        compactor=a.compactor, compactor_config=a.compactor_config,
                        streams=a.streams, streams_timeout=a.streams_timeout, ttfb_n=a.ttfb_n,
                        sdk_python=a.sdk_python, sdk_n=a.sdk_n, sdk_rounds=a.sdk_rounds,
                        baseline_compactor=a.baseline_compactor, baseline_name=a.baseline_name,
                        phases={x.strip() for x in a.phases.split(",") if x.strip()},
                        large_cold=a.large_cold, large_model=a.large_model, large_warm=a.large_warm,
                        summary_delay=a.summary_delay, compact_window=a.compact_window,
                        oha_conns=a.oha_conns, wrk_conns=a.wrk_conns, wrk_threads=a.wrk_threads)
    env.command = os.environ.get("BENCH_COMMAND") or " ".join(["scripts/bench/run.py"] + sys.argv[1:])
    ncpu = len(os.sched_getaffinity(0))
    if a.pin == "split" and ncpu >= 2:
        cpus = sorted(os.sched_getaffinity(0))
        env.load_cpus, env.server_cpus = str(cpus[0]), ",".join(str(c) for c in cpus[1:])
        env.pin_note = (f"load generators (oha, wrk) and the measuring clients on CPU {env.load_cpus}; "
                        f"the mocks and the system under test on CPU {env.server_cpus} (`taskset`)")
        os.sched_setaffinity(0, {cpus[0]})  # this script's own clients
    else:
        env.load_cpus = env.server_cpus = None
        env.pin_note = "none: everything shares all cores"
    env.server_ncpu = len(env.server_cpus.split(",")) if env.server_cpus else ncpu
    if not env.wrk_threads:
        env.wrk_threads = len(env.load_cpus.split(",")) if env.load_cpus else ncpu
    if not env.litellm_workers:
        env.litellm_workers = env.server_ncpu
    env.load_start = os.getloadavg()[0]
    try:
        os.nice(a.nice - os.nice(0))
    except OSError:
        pass
    env.nice = os.nice(0)
    env.sched = f"niceness {env.nice}"
    if a.realtime:
        if subprocess.run(["chrt", "-r", "1", "true"], capture_output=True).returncode == 0:
            Proc.server_prefix = ["chrt", "-r", "1"]
            env.sched = (f"niceness {env.nice}; the servers (mocks, systems under test) under "
                         f"SCHED_RR priority 1 (`--realtime`)")
        else:
            log(f"--realtime: not allowed; staying at niceness {env.nice}")
    want = {s.strip().lower() for s in a.systems.split(",")} | {"direct"}
    notes = []

    env.tmp = tempfile.mkdtemp(prefix="compactor-bench-")
    for d in ("mock-body", "proxy-body", "mock-proxy", "proxy-proxy", "proxylog-body", "proxylog-proxy"):
        os.makedirs(os.path.join(env.tmp, d), exist_ok=True)
    soft, hard = __import__("resource").getrlimit(__import__("resource").RLIMIT_NOFILE)
    __import__("resource").setrlimit(__import__("resource").RLIMIT_NOFILE, (hard, hard))

    def on_signal(*_):
        stop_all()
        sys.exit(130)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    versions = [tool_version(["nginx", "-v"]), tool_version(["wrk", "-v"]).split(" [")[0]]
    if a.oha:
        versions.append(tool_version([a.oha, "--version"]))
    notes += [
        "Logging: nginx `access_log off`; LiteLLM `LITELLM_LOG=ERROR`; Compactor `COMPACTOR_LOG=warn` "
        "(its default, info, writes a line per request); the systems named \"+log\" are their twins "
        "with the request log on (nginx `access_log` to a file, `COMPACTOR_LOG=info`), measured in the "
        "load rounds only.",
        f"nginx (mock and proxy): {env.server_ncpu} worker process(es), one per core given to the servers. "
        f"LiteLLM: `litellm --config … --num_workers {env.litellm_workers}`, a master key, no database; "
        "its `openai/` provider pointed at the mock.",
        "Compactor: `compactor serve --listen … --upstream … --config …` with config/compactor.toml "
        "and `store = \"memory\"`. It has one upstream base URL and the mock picks JSON or SSE by path, "
        "so the run starts three instances of the same binary and config: one in front of the JSON "
        "path (fixed rates, saturation, RSS idle and under load, 128k conversation), one in front of "
        "the SSE path (time to first byte), one in front of the slow mock (chunk timing, open streams).",
        "Added latency can come out negative by noise: each column is its own run of the load.",
    ]
    results, extra = {}, {"notes": notes}
    try:
        env.mock_port, env.slow_port = free_port(), free_port()
        mock = Proc("mock", ["nginx", "-p", env.tmp, "-e", f"{env.tmp}/mock.error.log", "-c",
                             write_mock_conf(env.tmp, env.mock_port, env.server_ncpu)],
                    cpus=env.server_cpus, log_dir=env.tmp)
        slow = Proc("slow-mock", [sys.executable, os.path.join(HERE, "slow_mock.py"), "--port",
                                  str(env.slow_port), "--summary-delay", str(a.summary_delay),
                                  "--chunk-interval", "1.0", "--chunks", "60"],
                    cpus=env.server_cpus, log_dir=env.tmp)
        wait_http(f"http://127.0.0.1:{env.mock_port}/v1/chat/completions", clients.json_body(SMALL), proc=mock)
        wait_http(f"http://127.0.0.1:{env.slow_port}/stats", proc=slow)
        env.slow_stats = lambda: json.loads(urllib.request.urlopen(
            f"http://127.0.0.1:{env.slow_port}/stats", timeout=5).read())

        conv = conversation.prefix(a.data, a.large_tokens)
        if conv is None:
            extra["large_na"] = f"no conversations in {a.data}"
        extra["conv"] = conv

        systems = [Direct(env)]
        if "nginx" in want:
            systems.append(Nginx(env))
            if a.log in ("both", "on"):
                systems.append(Nginx(env, log_on=True))
        if "litellm" in want:
            if shutil.which(a.litellm) or os.path.exists(a.litellm):
                systems.append(LiteLLM(env))
                versions.append("LiteLLM " + tool_version([sys.executable, "-c",
                                "import importlib.metadata as m; print(m.version('litellm'))"]))
            else:
                notes.append(f"LiteLLM: n/a: `{a.litellm}` not found")
        if "compactor" in want:
            if os.path.exists(a.compactor):
                systems.append(Compactor(env))
                if a.log in ("both", "on"):
                    systems.append(Compactor(env, log_on=True))
                versions.append(f"compactor {revision_of(a.compactor)}")
            else:
                notes.append(f"Compactor: n/a: feature missing (no binary at {a.compactor})")
            if a.baseline_compactor:
                if os.path.exists(a.baseline_compactor):
                    baseline = BaselineCompactor(env)
                    systems.insert(-1, baseline)
                    if a.log in ("both", "on"):
                        systems.insert(-1, BaselineCompactor(env, log_on=True))
                    versions.append(f"{baseline.name}: {revision_of(a.baseline_compactor)}")
                    notes.append(f"{baseline.name}: `{a.baseline_compactor}`, started like Compactor "
                                 f"but with the config file of its own tree (`{baseline.config_file()}`); "
                                 f"it takes part in every interleaved round.")
                else:
                    notes.append(f"Compactor {a.baseline_name}: n/a: no binary at {a.baseline_compactor}")
        env.versions = "; ".join(versions)

        started = []
        for s in systems:
            log(f"starting {s.name}")
            results[s.name] = {}
            try:
                s.start()
                prepare_system(s, env, results[s.name])
                started.append(s)
            except Exception as e:  # noqa: BLE001
                log(f"{s.name}: failed to start: {e!r}")
                notes.append(f"{s.name}: n/a: did not start: {e!r}")
                results.pop(s.name, None)
                s.stop()
        if "load" in env.phases:
            load_rounds(started, env, results)
        if "sdk" in env.phases and env.sdk_python:
            sdk_rounds(started, env, results)
        # one system at a time from here on; LiteLLM last (it leaves upstream streams open)
        for s in sorted(started, key=lambda s: s.name == "LiteLLM"):
            r = results[s.name]
            if is_log_twin(s.name):
                s.stop()
                continue
            try:
                if "streaming" in env.phases:
                    measure_streaming(s, env, r)
                if (s.name == "direct" or is_compactor(s.name)) and conv is not None \
                        and "large" in env.phases:
                    log(f"{s.name}: 128k-token conversation, cold and warm")
                    measure_large(s, env, r, conv)
                    if is_compactor(s.name) and any(st >= 400 for st in r["large"]["statuses"]):
                        extra["large_na"] = f"feature missing: Compactor answered {r['large']['statuses']}"
            except Exception as e:  # noqa: BLE001
                log(f"{s.name}: failed: {e!r}")
                notes.append(f"{s.name}: measurement failed: {e!r}")
            finally:
                s.stop()

        if "Compactor" in results and conv is not None and "compaction" in env.phases:
            log("Compactor: compaction with a 2 s summarizer")
            try:
                window = a.compact_window
                try:
                    with open(a.compactor_config, "rb") as f:
                        comp = tomllib.load(f).get("compaction", {})
                except OSError:
                    comp = {}
                usable = window - comp.get("reserve_output_tokens", 16384) - comp.get("margin_tokens", 1024)
                soft = comp.get("soft_threshold", 0.75)
                # between the soft threshold and the window; then past the window
                conv_soft = conversation.prefix(a.data, int(usable * (soft + 1) / 2))
                conv_hard = conversation.prefix(a.data, int(usable * 1.15))
                extra["conv_soft"], extra["conv_hard"] = conv_soft, conv_hard
                cr = measure_compaction(env, f"http://127.0.0.1:{env.slow_port}/slow-sse/v1/chat/completions",
                                        conv_soft, conv_hard)
                if cr.get("summary_requests_blocking", 0) == 0 and cr.get("summary_requests_aot", 0) == 0:
                    cr = {"na": "feature missing: no summary request reached the summarizer "
                                f"(blocking request took {cr.get('blocking_first_ms', 0):.1f} ms, "
                                f"status {cr.get('blocking_status')})"}
                extra["compaction"] = cr
            except Exception as e:  # noqa: BLE001
                extra["compaction"] = {"na": f"feature missing or failed: {e!r}"}
    finally:
        stop_all()
        if not a.keep_tmp:
            shutil.rmtree(env.tmp, ignore_errors=True)
        else:
            log(f"kept {env.tmp}")

    text = report(env, results, extra)
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, f"{datetime.date.today():%Y-%m-%d}{'-' + a.label if a.label else ''}.md")
    with open(path, "w") as f:
        f.write(text)
    with open(path[:-3] + ".json", "w") as f:
        json.dump({"results": results, "compaction": extra.get("compaction")}, f, indent=1, default=str)
    print(text)
    log(f"written {path}")


if __name__ == "__main__":
    main()
