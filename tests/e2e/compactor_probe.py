"""What Compactor did during a scenario whose client does not show response headers (Pi, aider).

It reads Compactor's JSON log (`log_format = "json"`) from a byte offset taken before the
scenario and its Prometheus `/metrics`, and checks:
  - every chat request was answered 200 (none failed, none was a proxy error);
  - the largest request the client sent (the proxy's count, `prompt_tokens`) was at least
    --min-window-factor times the model's window: the client really went past the window;
  - at least --min-compactions summaries were written ("Compacted a conversation." lines), and
    none failed;
and prints the newest summary, read with the admin token from /compactor/v1/checkpoints/{id}.

  compactor_probe.py mark LOG                 print the current end of LOG (an offset)
  compactor_probe.py check --log LOG --since OFFSET --url URL --window W [options]
"""

import argparse
import json
import os
import re
import sys
import time
import urllib.request


# Compactor writes its log in batches, at most 20 ms after a line is logged: a reader waits out
# a batch or two before taking an offset or reading, so that the lines logged just before are in.
LOG_BATCH_SECONDS = 0.1


def settle_log() -> None:
    time.sleep(LOG_BATCH_SECONDS)


def read_events(path: str, since: int, until: int | None = None) -> list[dict]:
    """The log's events from byte offset `since` (up to `until`, when given)."""
    settle_log()
    events = []
    with open(path, "rb") as f:
        f.seek(since)
        data = f.read() if until is None else f.read(max(0, until - since))
        for raw in data.splitlines():
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            if isinstance(event.get("fields"), dict):  # non-flattened tracing JSON
                event = {**event, **event["fields"]}
            events.append(event)
    return events


def fetch_checkpoint(root: str, checkpoint_id: str, token: str) -> dict:
    req = urllib.request.Request(
        f"{root}/compactor/v1/checkpoints/{checkpoint_id}",
        headers={"Authorization": f"Bearer {token}"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.load(resp)


def main() -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    mark = sub.add_parser("mark")
    mark.add_argument("log")
    check = sub.add_parser("check")
    check.add_argument("--log", required=True)
    check.add_argument("--since", type=int, required=True)
    check.add_argument("--url", required=True, help="Compactor base URL, without /v1")
    check.add_argument("--window", type=int, required=True)
    check.add_argument("--scenario", required=True)
    check.add_argument("--min-requests", type=int, default=2)
    check.add_argument("--min-window-factor", type=float, default=1.0)
    check.add_argument("--min-compactions", type=int, default=1)
    check.add_argument("--min-reused", type=int, default=0,
                       help="requests sent compacted through a stored checkpoint, waiting for no summary")
    check.add_argument("--admin-token", default=os.environ.get("E2E_ADMIN_TOKEN", ""))
    check.add_argument("--seconds", type=float, default=0.0)
    args = parser.parse_args()

    if args.cmd == "mark":
        settle_log()
        print(os.path.getsize(args.log) if os.path.exists(args.log) else 0)
        return 0

    events = read_events(args.log, args.since)
    served = [e for e in events if re.fullmatch(r"Served a \w+ request\.", e.get("message", ""))]
    compactions = [e for e in events if e.get("message") == "Compacted a conversation."]
    failures = [e for e in events if e.get("message", "").startswith("Compaction failed")]
    bad = [e for e in served if int(e.get("status", 0)) != 200]
    max_prompt = max((int(e.get("prompt_tokens", 0)) for e in served), default=0)
    compacted = [e for e in served if e.get("compacted") in (True, "true")]
    # Sent through a stored checkpoint without waiting for a summary of its own (one made
    # earlier for another request, or ahead of time).
    reused = sum(1 for e in compacted if int(e.get("summary_ms", 0)) == 0)
    name = args.scenario
    print(
        f"[{name}] {len(served)} chat requests, statuses "
        f"{sorted({int(e.get('status', 0)) for e in served})}, largest request {max_prompt} "
        f"tokens (window {args.window}), {len(compactions)} compactions, "
        f"{len(failures)} compaction failures, "
        f"{len(compacted)} requests sent compacted ({reused} through a stored checkpoint)",
        flush=True,
    )
    overheads = sorted(float(e["overhead_ms"]) for e in served if "overhead_ms" in e)
    summaries = [int(e["summary_ms"]) for e in served if int(e.get("summary_ms", 0)) > 0]
    if overheads:
        print(f"[{name}] overhead per request: median {overheads[len(overheads) // 2]:.1f} ms, "
              f"max {overheads[-1]:.1f} ms; summary waits: {summaries} ms", flush=True)
    ok = True
    if len(served) < args.min_requests:
        print(f"[{name}] FAIL: only {len(served)} chat requests reached Compactor")
        ok = False
    if bad:
        print(f"[{name}] FAIL: {len(bad)} requests were not answered 200: {bad[:3]}")
        ok = False
    if max_prompt < args.min_window_factor * args.window:
        print(f"[{name}] FAIL: the conversation never went past "
              f"{args.min_window_factor} x the window ({max_prompt} < "
              f"{args.min_window_factor * args.window:.0f} tokens)")
        ok = False
    if failures:
        print(f"[{name}] FAIL: {len(failures)} compactions failed: {failures[:3]}")
        ok = False
    if len(compactions) < args.min_compactions:
        print(f"[{name}] FAIL: {len(compactions)} compactions, wanted {args.min_compactions}")
        ok = False
    if reused < args.min_reused:
        print(f"[{name}] FAIL: {reused} requests went through a stored checkpoint, wanted {args.min_reused}")
        ok = False
    if compactions and args.admin_token:
        cid = compactions[-1].get("checkpoint")
        try:
            cp = fetch_checkpoint(args.url.rstrip("/"), cid, args.admin_token)
            print(f"[{name}] summary of checkpoint {cid} (covers {cp.get('covered')} messages, "
                  f"{cp.get('tokens_before')} -> {cp.get('tokens_after')} tokens):")
            for line in cp.get("summary", "").splitlines():
                print(f"    {line}")
        except Exception as e:  # the summary is informative; its absence is a failure too
            print(f"[{name}] FAIL: could not read checkpoint {cid}: {e}")
            ok = False
    result = {
        "scenario": name,
        "requests": len(served),
        "compactions": len(compactions),
        "reused": reused,
        "history_tokens": max_prompt,
        "window": args.window,
        "seconds": args.seconds,
        "summary_waits_ms": summaries,
        "overhead_median_ms": round(overheads[len(overheads) // 2], 1) if overheads else None,
    }
    if ok:
        print("E2E_RESULT " + json.dumps(result), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
