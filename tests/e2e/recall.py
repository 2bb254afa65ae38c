"""Facts an agent's session sets in its first turn, and the recall turn that asks for them after
the compactions.

The agent scenarios (Pi, aider, Claude Code, Codex, OpenCode) open their first prompt with
`FACTS` and end with `QUESTION`, which names none of the facts. Whether the 0.5B model answers
well is reported, not asserted; what is asserted is that the facts reached it: the body
Compactor forwarded for the recall turn (recorded by `recording_relay.py`) holds every one of
`EXPECTED`, and at least --min-compactions summaries were written before that turn.

  recall.py facts                  print the sentence that sets the facts
  recall.py question               print the recall question
  recall.py check --scenario NAME --relay LOG --relay-since LINE --log COMPACTOR_LOG \
                  --since OFFSET --until OFFSET [--min-compactions 2] [--answer TEXT]
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compactor_probe import read_events  # noqa: E402

FACTS = (
    "Rules for this whole session: the retry helper is compute_backoff_ms in "
    "src/inventory/retry.py, and you must never change the constant RETRY_BUDGET_MS = 4500."
)
EXPECTED = ["compute_backoff_ms", "src/inventory/retry.py", "RETRY_BUDGET_MS = 4500"]
QUESTION = (
    "Recall check, answer from memory and run no tool: which constant did I say must never "
    "change, and its value? Which helper function handles retries, and in which file?"
)
# Words of the question that only the recall turn's request holds.
MARKER = "Recall check, answer from memory"
# Compactor's own summary requests hold the transcript they summarize, or continue the
# conversation with a request for its summary; they are not the turn.
SUMMARY_MARKERS = ("<transcript>", "This conversation is about to be replaced by a summary of it.")


def recall_bodies(relay_log: str, since_line: int) -> list[str]:
    """The bodies forwarded upstream for the recall turn, as text, oldest first."""
    found = []
    with open(relay_log, encoding="utf-8") as f:
        lines = f.read().splitlines()[since_line:]
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        body = entry.get("body")
        text = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False)
        if MARKER in text and not any(m in text for m in SUMMARY_MARKERS):
            found.append(text)
    return found


def check(args) -> int:
    name = args.scenario
    compactions = [e for e in read_events(args.log, args.since, args.until)
                   if e.get("message") == "Compacted a conversation."]
    bodies = recall_bodies(args.relay, args.relay_since)
    ok = True
    print(f"[{name}] recall turn after {len(compactions)} compactions; "
          f"answer: {args.answer[:160]!r}", flush=True)
    if len(compactions) < args.min_compactions:
        print(f"[{name}] FAIL: the recall turn came after {len(compactions)} compactions, "
              f"wanted {args.min_compactions}")
        ok = False
    if not bodies:
        print(f"[{name}] FAIL: no forwarded request holds the recall question")
        return 1
    # The last attempt is what the model answered (a client may retry).
    forwarded = bodies[-1].replace(QUESTION, "")
    present = [fact for fact in EXPECTED if fact in forwarded]
    missing = [fact for fact in EXPECTED if fact not in forwarded]
    print(f"[{name}] facts in the request the model got for the recall turn: "
          f"{len(present)}/{len(EXPECTED)}" + (f", missing {missing}" if missing else ""),
          flush=True)
    if missing:
        ok = False
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("facts")
    sub.add_parser("question")
    c = sub.add_parser("check")
    c.add_argument("--scenario", required=True)
    c.add_argument("--relay", required=True)
    c.add_argument("--relay-since", type=int, default=0)
    c.add_argument("--log", required=True)
    c.add_argument("--since", type=int, required=True)
    c.add_argument("--until", type=int, required=True)
    c.add_argument("--min-compactions", type=int, default=2)
    c.add_argument("--answer", default="")
    args = parser.parse_args()
    if args.cmd == "facts":
        print(FACTS)
        return 0
    if args.cmd == "question":
        print(QUESTION)
        return 0
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
