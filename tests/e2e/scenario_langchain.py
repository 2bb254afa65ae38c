"""Scenario: LangChain's `ChatOpenAI` (langchain-openai) talks to a real model through Compactor.

Two legs, each one conversation carried past the model's window:
  1. Chat Completions: `invoke` and `stream` alternating, until the history is at least
     E2E_HISTORY_FACTOR windows and E2E_MIN_COMPACTIONS checkpoints were made.
  2. The Responses API (`use_responses_api=True`, the whole history sent each turn, no
     `previous_response_id`): the same, until one window and one checkpoint.
Every turn must succeed. `include_response_headers=True` puts Compactor's `x-compactor-*`
headers in each answer's `response_metadata["headers"]` (of the first chunk when streamed), and
the scenario reads them there, as a LangChain user would.

Environment:
  COMPACTOR_URL        base URL of the proxy, with /v1 (required)
  E2E_MODEL            model name (default qwen2.5-coder-0.5b-instruct)
  E2E_API_KEY          key sent as Authorization (default sk-e2e-langchain)
  E2E_MAX_TOKENS       max_tokens of each reply (default 40)
  E2E_MIN_COMPACTIONS  for the Chat Completions leg (default 2)
  E2E_HISTORY_FACTOR   for the Chat Completions leg (default 2)
  E2E_MAX_TURNS        give up a leg after this many turns (default 20)
"""

import json
import os
import sys
import time

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import conversation  # noqa: E402

BASE_URL = os.environ["COMPACTOR_URL"].rstrip("/")
MODEL = os.environ.get("E2E_MODEL", "qwen2.5-coder-0.5b-instruct")
API_KEY = os.environ.get("E2E_API_KEY", "sk-e2e-langchain")
MAX_TOKENS = int(os.environ.get("E2E_MAX_TOKENS", "40"))
MIN_COMPACTIONS = int(os.environ.get("E2E_MIN_COMPACTIONS", "2"))
HISTORY_FACTOR = float(os.environ.get("E2E_HISTORY_FACTOR", "2"))
MAX_TURNS = int(os.environ.get("E2E_MAX_TURNS", "20"))


def log(msg: str) -> None:
    print(f"[langchain] {msg}", flush=True)


def answer_text(message) -> str:
    """The text of an answer: a string on Chat Completions, content blocks on Responses."""
    content = message.content
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content if isinstance(b, dict))


def run_leg(name: str, llm: ChatOpenAI, first_turn: int, factor: float, compactions: int):
    """One conversation carried until `factor` windows and `compactions` checkpoints; returns
    (turns, progress) or raises RuntimeError with what went wrong."""
    messages = [SystemMessage(conversation.SYSTEM)]
    progress = conversation.Progress()
    for turn in range(MAX_TURNS):
        messages.append(HumanMessage(conversation.user_turn(first_turn + turn)))
        stream = turn % 2 == 1
        t0 = time.monotonic()
        if stream:
            chunks = list(llm.stream(messages))
            if not chunks:
                raise RuntimeError(f"{name} turn {turn + 1}: the stream had no chunks")
            headers = next((c.response_metadata.get("headers") for c in chunks
                            if c.response_metadata.get("headers")), None)
            reply = chunks[0]
            for chunk in chunks[1:]:
                reply = reply + chunk
        else:
            reply = llm.invoke(messages)
            headers = reply.response_metadata.get("headers")
        if not headers:
            raise RuntimeError(f"{name} turn {turn + 1}: no response headers in response_metadata")
        text = answer_text(reply)
        if not text.strip():
            raise RuntimeError(f"{name} turn {turn + 1}: an empty answer")
        messages.append(AIMessage(text))
        try:
            seen = progress.record(turn, {k.lower(): v for k, v in headers.items()})
        except ValueError as e:
            raise RuntimeError(f"{name}: {e}") from e
        log(f"{name} turn {turn + 1:>2} {'stream' if stream else 'invoke'} "
            f"{time.monotonic() - t0:5.1f}s {conversation.describe(seen)} reply={text[:50]!r}")
        if progress.reached(factor, compactions):
            return turn + 1, progress
    raise RuntimeError(f"{name}: {progress.gave_up(MAX_TURNS)}")


def main() -> int:
    started = time.monotonic()
    common = dict(model=MODEL, base_url=BASE_URL, api_key=API_KEY, max_tokens=MAX_TOKENS,
                  temperature=0, timeout=600, max_retries=0, include_response_headers=True)
    try:
        chat_turns, chat = run_leg("chat", ChatOpenAI(**common, stream_usage=True), 0,
                                   HISTORY_FACTOR, MIN_COMPACTIONS)
        # Another project file each turn, so that the second conversation is not the first's
        # prefix (it would be found through the first one's checkpoints).
        responses_turns, responses = run_leg(
            "responses", ChatOpenAI(**common, use_responses_api=True), 5, 1.0, 1)
    except Exception as e:  # an HTTP error from the SDK, or a failed check above
        log(f"FAIL: {type(e).__name__}: {e}")
        return 1
    result = {
        "scenario": "langchain",
        "turns": chat_turns + responses_turns,
        "compactions": len(chat.checkpoints) + len(responses.checkpoints),
        "history_tokens": max(chat.max_before, responses.max_before),
        "window": chat.window,
        "seconds": round(time.monotonic() - started, 1),
    }
    print("E2E_RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
