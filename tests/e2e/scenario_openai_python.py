"""Scenario: the official OpenAI Python SDK talks to a real model through Compactor.

The conversation alternates non-streaming and streaming turns and goes on until the full
history the client holds is at least E2E_HISTORY_FACTOR times the model's window and at least
E2E_MIN_COMPACTIONS distinct checkpoints (summaries) were made. Every turn must succeed. At the
end a body over the proxy's size limit must come back as the SDK's 413 error (not a broken pipe),
and the newest summary is fetched from `GET /compactor/v1/checkpoints/{id}` and printed.

Environment:
  COMPACTOR_URL        base URL of the proxy, with /v1 (required)
  E2E_MODEL            model name (default qwen2.5-coder-0.5b-instruct)
  E2E_API_KEY          key sent as Authorization (default sk-e2e-python; llama-server ignores it)
  E2E_MAX_TOKENS       max_tokens of each reply (default 40)
  E2E_MIN_COMPACTIONS  default 3
  E2E_HISTORY_FACTOR   default 3
  E2E_MAX_TURNS        give up after this many turns (default 20)
"""

import json
import os
import sys
import time
import urllib.request

import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import conversation  # noqa: E402

BASE_URL = os.environ["COMPACTOR_URL"].rstrip("/")
MODEL = os.environ.get("E2E_MODEL", "qwen2.5-coder-0.5b-instruct")
API_KEY = os.environ.get("E2E_API_KEY", "sk-e2e-python")
MAX_TOKENS = int(os.environ.get("E2E_MAX_TOKENS", "40"))
MIN_COMPACTIONS = int(os.environ.get("E2E_MIN_COMPACTIONS", "3"))
HISTORY_FACTOR = float(os.environ.get("E2E_HISTORY_FACTOR", "3"))
MAX_TURNS = int(os.environ.get("E2E_MAX_TURNS", "20"))


def log(msg: str) -> None:
    print(f"[python] {msg}", flush=True)


def fetch_checkpoint(checkpoint_id: str) -> dict:
    root = BASE_URL[: -len("/v1")] if BASE_URL.endswith("/v1") else BASE_URL
    req = urllib.request.Request(
        f"{root}/compactor/v1/checkpoints/{checkpoint_id}",
        headers={"Authorization": f"Bearer {API_KEY}"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.load(resp)


def main() -> int:
    started = time.monotonic()
    client = openai.OpenAI(base_url=BASE_URL, api_key=API_KEY, timeout=600, max_retries=0)
    messages = [{"role": "system", "content": conversation.SYSTEM}]
    progress = conversation.Progress()
    turn = 0
    for turn in range(MAX_TURNS):
        messages.append({"role": "user", "content": conversation.user_turn(turn)})
        stream = turn % 2 == 1
        t0 = time.monotonic()
        try:
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL,
                messages=messages,
                max_tokens=MAX_TOKENS,
                temperature=0,
                stream=stream,
            )
        except openai.APIStatusError as e:
            log(f"turn {turn + 1}: HTTP {e.status_code}: {e.response.text[:500]}")
            return 1
        headers = raw.headers
        if stream:
            text_parts = []
            finish = None
            for chunk in raw.parse():
                if chunk.choices:
                    text_parts.append(chunk.choices[0].delta.content or "")
                    finish = chunk.choices[0].finish_reason or finish
            text = "".join(text_parts)
        else:
            completion = raw.parse()
            text = completion.choices[0].message.content or ""
            finish = completion.choices[0].finish_reason
        if finish is None:
            log(f"turn {turn + 1}: the reply has no finish_reason")
            return 1
        messages.append({"role": "assistant", "content": text})

        try:
            seen = progress.record(turn, headers)
        except ValueError as e:
            log(str(e))
            return 1
        log(f"turn {turn + 1:>2} {'stream' if stream else 'plain '} {time.monotonic() - t0:5.1f}s "
            f"{conversation.describe(seen)} reply={text[:60]!r}")
        if progress.reached(HISTORY_FACTOR, MIN_COMPACTIONS):
            break
    else:
        log(progress.gave_up(MAX_TURNS))
        return 1

    # A body over the proxy's limit (32 MiB by default): the SDK writes it whole before it reads
    # the answer, and must then read the 413 rather than fail on a broken pipe.
    try:
        client.chat.completions.create(
            model=MODEL, max_tokens=1,
            messages=[{"role": "user", "content": " " * (33 * 1024 * 1024)}])
        log("a body over the limit was accepted")
        return 1
    except openai.APIStatusError as e:
        if e.status_code != 413:
            log(f"a body over the limit got {e.status_code}, not 413: {e.response.text[:200]}")
            return 1
        log(f"a body over the limit: the SDK read the 413 ({e.message[:80]})")
    except openai.APIConnectionError as e:
        log(f"a body over the limit: the SDK saw no answer ({e!r}), not the 413")
        return 1

    checkpoints = progress.checkpoints
    checkpoint = fetch_checkpoint(checkpoints[-1])
    summary = checkpoint.get("summary", "")
    if len(summary.strip()) < 40:
        log(f"summary of checkpoint {checkpoints[-1]} is too short: {summary!r}")
        return 1
    if checkpoint.get("model") != MODEL:
        log(f"checkpoint {checkpoints[-1]} names model {checkpoint.get('model')!r}, not {MODEL!r}")
        return 1
    log(f"summary of checkpoint {checkpoints[-1]} (covers {checkpoint.get('covered')} messages, "
        f"{checkpoint.get('tokens_before')} -> {checkpoint.get('tokens_after')} tokens):")
    for line in summary.splitlines():
        print(f"    {line}", flush=True)
    result = {
        "scenario": "openai-python",
        "turns": turn + 1,
        "compactions": len(checkpoints),
        "history_tokens": progress.max_before,
        "window": progress.window,
        "seconds": round(time.monotonic() - started, 1),
    }
    print("E2E_RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
