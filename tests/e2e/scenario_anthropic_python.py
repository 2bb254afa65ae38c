"""Scenario: the Anthropic Python SDK runs a tool loop through Compactor's /v1/messages.

A 0.5B model rarely calls tools, so the loop is synthetic: each turn is a user question, an
assistant step the scenario writes itself (a `thinking` block with a signature, then a
`tool_use` reading a file), the user message with its `tool_result` (the file), and then a real
request to the model, which answers. That request's last three messages are the turn in
progress: the proxy must forward them unmodified. Turns alternate between `messages.stream` and
`messages.with_raw_response.create`. Like Claude Code, the client puts `cache_control` on its
system block and on the last block of the last message only.

The conversation goes on until the history is E2E_HISTORY_FACTOR times the window and
E2E_MIN_COMPACTIONS checkpoints were made. Then every body Compactor forwarded (read from the
recording relay's log, E2E_RELAY_LOG) is checked: the first message is a user's; each
`tool_result` is in the message right after its `tool_use`, results first, and every `tool_use`
has its result; the turn in progress equals what the client sent; at most 4 `cache_control`
breakpoints.

Environment: COMPACTOR_URL (with /v1), E2E_RELAY_LOG, E2E_MODEL, E2E_MAX_TOKENS (default 40),
E2E_MIN_COMPACTIONS (default 3), E2E_HISTORY_FACTOR (default 3), E2E_MAX_TURNS (default 20).
"""

import json
import os
import sys
import time

import anthropic

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import conversation  # noqa: E402

ROOT = os.environ["COMPACTOR_URL"].rstrip("/").removesuffix("/v1")
RELAY_LOG = os.environ["E2E_RELAY_LOG"]
# The request for a summary that closes a summary request continuing the conversation.
SUMMARY_MARKER = "This conversation is about to be replaced by a summary of it."

MODEL = os.environ.get("E2E_MODEL", "qwen2.5-coder-0.5b-instruct")
API_KEY = "sk-e2e-anthropic"
MAX_TOKENS = int(os.environ.get("E2E_MAX_TOKENS", "40"))
MIN_COMPACTIONS = int(os.environ.get("E2E_MIN_COMPACTIONS", "3"))
HISTORY_FACTOR = float(os.environ.get("E2E_HISTORY_FACTOR", "3"))
MAX_TURNS = int(os.environ.get("E2E_MAX_TURNS", "20"))
TOOLS = [{
    "name": "read_file",
    "description": "Read a file of the repository.",
    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
}]
SYSTEM = [{"type": "text", "text": conversation.SYSTEM, "cache_control": {"type": "ephemeral"}}]


def log(msg: str) -> None:
    print(f"[anthropic] {msg}", flush=True)


def turn_in_progress(turn: int) -> list[dict]:
    """The user's question, the assistant's thinking and tool call, and the tool's result."""
    code, question = conversation.source_file(turn)
    path = conversation.MODULES[turn % len(conversation.MODULES)][0]
    call_id = f"toolu_e2e{turn:03d}"
    return [
        {"role": "user", "content": [{"type": "text", "text": f"Turn {turn + 1}. {question}"}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": f"I need {path} before answering.", "signature": f"sig-e2e-{turn:03d}-Zm9v"},
            {"type": "tool_use", "id": call_id, "name": "read_file", "input": {"path": path}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call_id, "content": code,
             "cache_control": {"type": "ephemeral"}},
        ]},
    ]


def without_cache_marker(message: dict) -> dict:
    """The message as re-sent on the next request: its breakpoint moves on."""
    content = [{k: v for k, v in block.items() if k != "cache_control"} for block in message["content"]]
    return {**message, "content": content}


def ask(client, messages, stream: bool):
    # Sampling settings go as extra body fields: this SDK release takes no `temperature` argument.
    kwargs = dict(model=MODEL, max_tokens=MAX_TOKENS, system=SYSTEM, tools=TOOLS, messages=messages,
                  extra_body={"temperature": 0})
    if stream:
        with client.messages.stream(**kwargs) as s:
            message = s.get_final_message()
            return s.response.headers, message
    raw = client.messages.with_raw_response.create(**kwargs)
    return raw.headers, raw.parse()


def count_breakpoints(value) -> int:
    if isinstance(value, dict):
        return ("cache_control" in value) + sum(count_breakpoints(v) for v in value.values())
    if isinstance(value, list):
        return sum(count_breakpoints(v) for v in value)
    return 0


def check_forwarded(body: dict) -> list[str]:
    """What is wrong with one body Compactor sent upstream."""
    problems = []
    messages = body.get("messages", [])
    if not messages or messages[0].get("role") != "user":
        problems.append("the first message is not a user's")
    blocks = [m["content"] if isinstance(m["content"], list) else [] for m in messages]
    for i, content in enumerate(blocks):
        results = [b.get("tool_use_id") for b in content if b.get("type") == "tool_result"]
        calls = [b.get("id") for b in content if b.get("type") == "tool_use"]
        if results:
            previous = blocks[i - 1] if i > 0 else []
            called = {b.get("id") for b in previous if b.get("type") == "tool_use"}
            if messages[i - 1].get("role") != "assistant" or not set(results) <= called:
                problems.append(f"messages[{i}] has a tool_result without its tool_use right before")
            if any(b.get("type") != "tool_result" for b in content[: len(results)]):
                problems.append(f"messages[{i}] does not put its tool results first")
        if calls:
            following = blocks[i + 1] if i + 1 < len(blocks) else []
            answered = {b.get("tool_use_id") for b in following if b.get("type") == "tool_result"}
            if not set(calls) <= answered:
                problems.append(f"messages[{i}] has a tool_use without its result right after")
    breakpoints = count_breakpoints(body.get("system")) + count_breakpoints(body.get("tools")) + count_breakpoints(messages)
    if breakpoints > 4:
        problems.append(f"{breakpoints} cache_control breakpoints")
    return problems


def main() -> int:
    started = time.monotonic()
    relay_mark = sum(1 for _ in open(RELAY_LOG)) if os.path.exists(RELAY_LOG) else 0
    client = anthropic.Anthropic(base_url=ROOT, api_key=API_KEY, timeout=600, max_retries=0)
    messages: list[dict] = []
    in_progress: dict[str, list[dict]] = {}
    progress = conversation.Progress()
    turn = 0
    for turn in range(MAX_TURNS):
        if messages:
            messages[-1] = without_cache_marker(messages[-1])
        current = turn_in_progress(turn)
        messages.extend(current)
        in_progress[current[1]["content"][1]["id"]] = current
        stream = turn % 2 == 1
        t0 = time.monotonic()
        try:
            headers, reply = ask(client, messages, stream)
        except anthropic.APIStatusError as e:
            log(f"turn {turn + 1}: HTTP {e.status_code}: {e.response.text[:500]}")
            return 1
        text = "".join(b.text for b in reply.content if b.type == "text")
        if reply.stop_reason is None:
            log(f"turn {turn + 1}: the reply has no stop_reason")
            return 1
        messages.append({"role": "assistant", "content": [{"type": "text", "text": text or "(no answer)"}]})
        try:
            seen = progress.record(turn, headers)
        except ValueError as e:
            log(str(e))
            return 1
        log(f"turn {turn + 1:>2} {'stream' if stream else 'plain '} {time.monotonic() - t0:5.1f}s "
            f"{conversation.describe(seen)} reply={text[:50]!r}")
        if progress.reached(HISTORY_FACTOR, MIN_COMPACTIONS):
            break
    else:
        log(progress.gave_up(MAX_TURNS))
        return 1

    forwarded = []
    with open(RELAY_LOG) as f:
        for line in list(f)[relay_mark:]:
            record = json.loads(line)
            body = record.get("body")
            # Summary requests left out: a standalone one carries no tools, one that continues
            # the conversation ends with the request for its summary.
            if record["path"].split("?")[0].endswith("/messages") and isinstance(body, dict) \
                    and any(t.get("name") == "read_file" for t in body.get("tools") or []) \
                    and SUMMARY_MARKER not in json.dumps(body):
                forwarded.append(body)
    failures, compacted = 0, 0
    seen_turns = set()
    for n, body in enumerate(forwarded):
        problems = check_forwarded(body)
        tail = body.get("messages", [])[-3:]
        call = tail[1]["content"][-1].get("id") if len(tail) == 3 and isinstance(tail[1]["content"], list) else None
        if call not in in_progress or tail != in_progress[call]:
            problems.append("the turn in progress was not forwarded as sent")
        seen_turns.add(call)
        # Turn t (0-based) holds 4 messages per earlier turn and its own 3.
        if call in in_progress and len(body["messages"]) < 4 * int(call[-3:]) + 3:
            compacted += 1
        for p in problems:
            log(f"forwarded body {n + 1}: {p}")
        failures += bool(problems)
    log(f"{len(forwarded)} bodies forwarded, {compacted} of them compacted, {failures} with problems")
    if failures or len(seen_turns) != turn + 1 or compacted < MIN_COMPACTIONS:
        log(f"FAIL: {failures} bad bodies; turns seen upstream {len(seen_turns)} of {turn + 1}")
        return 1
    result = {
        "scenario": "anthropic-python",
        "turns": turn + 1,
        "compactions": len(progress.checkpoints),
        "history_tokens": progress.max_before,
        "window": progress.window,
        "seconds": round(time.monotonic() - started, 1),
    }
    print("E2E_RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
