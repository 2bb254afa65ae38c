"""Scenario: the OpenAI Python SDK's Responses API through Compactor, to a real model.

Part 1, a tool-using history past the window. Every turn adds a user question, then a
synthetic assistant step the client made up (a `reasoning` item with readable content, one
`function_call` or, every third turn, two parallel ones, and their `function_call_output`s
holding a source file), and asks the model to answer; its answer is appended as an assistant
message. Turns alternate `responses.create` and `responses.stream`. Every turn must answer, the
history must reach E2E_HISTORY_FACTOR windows with at least E2E_MIN_COMPACTIONS checkpoints,
and every checkpoint must cover whole units: the first item it leaves verbatim starts a unit
(a user message or an assistant step), never a call's output or what follows a reasoning item.

Part 2 (skipped with E2E_CLIENT_COMPACTION=0), client-requested compaction, answered by Compactor itself
(llama-server has none):
- the history ending in `{"type":"compaction_trigger"}` gets exactly one `compaction` item;
- `responses.compact` gets an output ending in one `compaction` item;
- a request holding that item (head, the user messages, the item, a new question) is served
  from its checkpoint;
- the same item with its seal edited, or sent with another key, is refused with a 400.

Environment: COMPACTOR_URL (with /v1), E2E_MODEL, E2E_API_KEY, E2E_MAX_TOKENS (default 40),
E2E_MIN_COMPACTIONS (default 2), E2E_HISTORY_FACTOR (default 2), E2E_MAX_TURNS (default 16),
E2E_CLIENT_COMPACTION (default 1; 0 skips part 2).
"""

import json
import os
import sys
import time
import urllib.error
import urllib.request

import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import conversation  # noqa: E402

BASE_URL = os.environ["COMPACTOR_URL"].rstrip("/")
MODEL = os.environ.get("E2E_MODEL", "qwen2.5-coder-0.5b-instruct")
API_KEY = os.environ.get("E2E_API_KEY", "sk-e2e-responses")
MAX_TOKENS = int(os.environ.get("E2E_MAX_TOKENS", "40"))
MIN_COMPACTIONS = int(os.environ.get("E2E_MIN_COMPACTIONS", "2"))
HISTORY_FACTOR = float(os.environ.get("E2E_HISTORY_FACTOR", "2"))
CLIENT_COMPACTION = os.environ.get("E2E_CLIENT_COMPACTION", "1") == "1"
MAX_TURNS = int(os.environ.get("E2E_MAX_TURNS", "16"))

HEAD = {
    "type": "message",
    "role": "developer",
    "content": [{"type": "input_text", "text": conversation.SYSTEM}],
}
TOOLS = [
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a file of the repository.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    }
]


class Failed(Exception):
    pass


def log(msg: str) -> None:
    print(f"[responses] {msg}", flush=True)


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def assistant_step(turn: int) -> list[dict]:
    """What an agent's tool step leaves in the history: reasoning, calls, then their outputs."""
    paths = [conversation.MODULES[(turn + k) % len(conversation.MODULES)][0] for k in range(2)]
    calls = paths if turn % 3 == 2 else paths[:1]
    items = [
        {
            "type": "reasoning",
            "id": f"rs_{turn}",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": f"I should read {', '.join(calls)}."}],
        }
    ]
    for k, path in enumerate(calls):
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{turn}_{k}",
                "call_id": f"call_{turn}_{k}",
                "name": "read_file",
                "arguments": json.dumps({"path": path}),
            }
        )
    for k, _ in enumerate(calls):
        code, _ = conversation.source_file(turn + k)
        items.append({"type": "function_call_output", "call_id": f"call_{turn}_{k}", "output": code})
    return items


def unit_starts(items: list[dict]) -> set[int]:
    """Indices where a unit begins: a user message, or an assistant step (its reasoning, else its
    first call or message). Outputs and the item after a reasoning item never begin one."""
    starts = set()
    for i, item in enumerate(items):
        kind = item.get("type")
        after_reasoning = i > 0 and items[i - 1].get("type") == "reasoning"
        if kind == "message" and item.get("role") in ("developer", "system"):
            continue
        if kind in ("function_call_output", "custom_tool_call_output", "tool_search_output"):
            continue
        if after_reasoning:
            continue
        if kind in ("function_call", "custom_tool_call") and i > 0 and items[i - 1].get("type") in (
            "function_call",
            "custom_tool_call",
        ):
            continue  # a parallel call of the same step
        starts.add(i)
    return starts


def root_url() -> str:
    return BASE_URL[: -len("/v1")] if BASE_URL.endswith("/v1") else BASE_URL


def fetch_checkpoint(checkpoint_id: str) -> dict:
    req = urllib.request.Request(
        f"{root_url()}/compactor/v1/checkpoints/{checkpoint_id}",
        headers={"Authorization": f"Bearer {API_KEY}"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.load(resp)


def output_text(output: list[dict]) -> str:
    parts = []
    for item in output:
        if item.get("type") == "message":
            parts += [c.get("text", "") for c in item.get("content", []) if c.get("type") == "output_text"]
    return "".join(parts)


def send(client: openai.OpenAI, history: list[dict], stream: bool):
    """One turn; returns (headers, output items as dicts)."""
    args = dict(
        model=MODEL,
        input=history,
        tools=TOOLS,
        max_output_tokens=MAX_TOKENS,
        temperature=0,
        store=False,
        prompt_cache_key="e2e-responses-thread",
    )
    if stream:
        # The raw event stream, not `responses.stream()`: that helper rebuilds the response from
        # the deltas and needs each delta's `content_index`, which llama-server leaves out.
        raw = client.responses.with_raw_response.create(stream=True, **args)
        output = []
        for event in raw.parse():
            if event.type == "response.output_item.done":
                output.append(event.item.model_dump())
            elif event.type in ("response.failed", "error"):
                raise Failed(f"the stream failed: {json.dumps(event.model_dump())[:300]}")
        return raw.headers, output
    raw = client.responses.with_raw_response.create(**args)
    return raw.headers, json.loads(raw.text)["output"]


def part_one(client: openai.OpenAI) -> tuple[list[dict], dict]:
    history = [HEAD]
    progress = conversation.Progress()
    turn = 0
    for turn in range(MAX_TURNS):
        _, question = conversation.source_file(turn)
        history.append(user(f"Turn {turn + 1}. {question}"))
        history += assistant_step(turn)
        stream = turn % 2 == 1
        t0 = time.monotonic()
        try:
            headers, output = send(client, history, stream)
        except openai.APIStatusError as e:
            raise Failed(f"turn {turn + 1}: HTTP {e.status_code}: {e.response.text[:500]}")
        text = output_text(output)
        history.append(
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
        )
        try:
            seen = progress.record(turn, headers)
        except ValueError as e:
            raise Failed(str(e))
        if seen["new"]:
            sent = history[:-1]  # what this request carried
            covered = fetch_checkpoint(seen["checkpoint"])["covered"]
            if covered < len(sent) and covered not in unit_starts(sent):
                item = sent[covered]
                raise Failed(
                    f"turn {turn + 1}: checkpoint {seen['checkpoint']} leaves a broken unit: the "
                    f"kept part starts at item {covered} ({item.get('type')}), after "
                    f"{sent[covered - 1].get('type')}"
                )
        log(
            f"turn {turn + 1:>2} {'stream' if stream else 'create'} {time.monotonic() - t0:5.1f}s "
            f"items={len(history)} {conversation.describe(seen)} reply={text[:50]!r}"
        )
        if progress.reached(HISTORY_FACTOR, MIN_COMPACTIONS):
            break
    else:
        raise Failed(progress.gave_up(MAX_TURNS))
    return history, {"turns": turn + 1, "compactions": len(progress.checkpoints),
                     "history_tokens": progress.max_before, "window": progress.window}


def post(api_key: str, path: str, body: dict) -> tuple[int, dict, dict]:
    req = urllib.request.Request(
        f"{BASE_URL}{path}",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=600) as resp:
            return resp.status, dict(resp.headers), json.load(resp)
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read() or b"{}")


def one_compaction_item(output: list[dict], what: str) -> dict:
    items = [i for i in output if i.get("type") == "compaction"]
    if len(items) != 1 or not items[0].get("encrypted_content"):
        raise Failed(f"{what}: expected exactly one compaction item, got {output}")
    return items[0]


def part_two(client: openai.OpenAI, history: list[dict]) -> dict:
    users = [i for i in history if i.get("type") == "message" and i.get("role") == "user"]
    results = {}

    raw = client.responses.with_raw_response.create(
        model=MODEL, input=history + [{"type": "compaction_trigger"}], tools=TOOLS, store=False,
        max_output_tokens=MAX_TOKENS,
    )
    triggered = one_compaction_item(json.loads(raw.text)["output"], "compaction_trigger")
    log(f"compaction_trigger answered with one compaction item "
        f"(checkpoint {raw.headers.get('x-compactor-checkpoint')})")

    status, _, body = post(API_KEY, "/responses/compact", {"model": MODEL, "input": history})
    if status != 200 or body.get("object") != "response.compaction":
        raise Failed(f"/responses/compact: HTTP {status}: {json.dumps(body)[:300]}")
    compacted = one_compaction_item(body["output"], "/responses/compact")
    log(f"/responses/compact answered: {len(body['output'])} items, the last a compaction item")

    follow_up = [HEAD] + users + [triggered, user("One more thing: which file did we read first?")]
    raw = client.responses.with_raw_response.create(
        model=MODEL, input=follow_up, tools=TOOLS, store=False, max_output_tokens=MAX_TOKENS
    )
    checkpoint = raw.headers.get("x-compactor-checkpoint")
    if raw.http_response.status_code != 200 or not checkpoint:
        raise Failed(f"the returned compaction item was not expanded: {raw.headers}")
    log(f"a request holding the item was served from checkpoint {checkpoint}: "
        f"{output_text(json.loads(raw.text)['output'])[:60]!r}")
    follow_up[-2] = compacted
    status, _, _ = post(API_KEY, "/responses", {"model": MODEL, "input": follow_up,
                                                "max_output_tokens": MAX_TOKENS})
    if status != 200:
        raise Failed(f"the /responses/compact item was refused: HTTP {status}")

    forged = dict(triggered)
    content = forged["encrypted_content"]
    forged["encrypted_content"] = content[:-1] + ("0" if content[-1] != "0" else "1")
    for name, key, item in [("forged", API_KEY, forged), ("another tenant's", "sk-e2e-other", triggered)]:
        body = {"model": MODEL, "input": [HEAD] + users + [item, user("Go on.")],
                "max_output_tokens": MAX_TOKENS}
        status, _, answer = post(key, "/responses", body)
        error = answer.get("error") or {}
        if status != 400 or not error.get("message"):
            raise Failed(f"a {name} compaction item got HTTP {status}: {json.dumps(answer)[:300]}")
        log(f"a {name} compaction item was refused: 400 {error.get('message')!r}")
    results["client_compactions"] = 2
    return results


def main() -> int:
    started = time.monotonic()
    client = openai.OpenAI(base_url=BASE_URL, api_key=API_KEY, timeout=600, max_retries=0)
    try:
        history, result = part_one(client)
        if CLIENT_COMPACTION:
            result.update(part_two(client, history))
        else:
            log("part 2 (client-requested compaction) skipped: E2E_CLIENT_COMPACTION is not 1")
    except Failed as e:
        log(f"FAIL: {e}")
        return 1
    result = {"scenario": "responses-python", **result,
              "seconds": round(time.monotonic() - started, 1)}
    print("E2E_RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
