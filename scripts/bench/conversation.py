"""Large request bodies for the benchmark, built from the real conversations in
../shared/data/conversations (read in place, never copied into the project).

Token counts use tiktoken's o200k_base when tiktoken and its encoding file are available offline
(the LiteLLM venv carries both: LiteLLM bundles the encoding files, and TIKTOKEN_CACHE_DIR is
pointed there); otherwise a chars/3.3 estimate (the data's README: real counts run 1.3-1.5x chars/4).
"""
import glob
import json
import os

_ENC = None
COUNTER = "chars/3.3 estimate"


def _encoder():
    global _ENC, COUNTER
    if _ENC is None:
        _ENC = False
        try:
            import importlib.util
            spec = importlib.util.find_spec("litellm")
            if spec and spec.origin and "TIKTOKEN_CACHE_DIR" not in os.environ:
                d = os.path.join(os.path.dirname(spec.origin), "litellm_core_utils", "tokenizers")
                if os.path.isdir(d):
                    os.environ["TIKTOKEN_CACHE_DIR"] = d
            import tiktoken
            _ENC = tiktoken.get_encoding("o200k_base")
            COUNTER = "tiktoken o200k_base"
        except Exception:
            _ENC = False
    return _ENC


def _text(msg):
    parts = []
    c = msg.get("content")
    if isinstance(c, str):
        parts.append(c)
    elif isinstance(c, list):
        for p in c:
            if isinstance(p, dict) and isinstance(p.get("text"), str):
                parts.append(p["text"])
    for tc in msg.get("tool_calls") or []:
        f = tc.get("function", {})
        parts.append(f.get("name", ""))
        parts.append(f.get("arguments", ""))
    return "\n".join(parts)


def count(text):
    enc = _encoder()
    if enc:
        return len(enc.encode(text, disallowed_special=()))
    return int(len(text) / 3.3)


def message_tokens(msg):
    return count(_text(msg)) + 4


def largest_conversation(data_dir):
    files = [f for f in glob.glob(os.path.join(data_dir, "*.json")) if not f.endswith("manifest.json")]
    if not files:
        return None
    return max(files, key=os.path.getsize)


def prefix(data_dir, target_tokens):
    """Messages of the largest conversation, cut at the last point that keeps the total at or
    under target_tokens, where a request can end: after a user message or after the last tool
    result of a batch.
    Returns dict(model, tools, messages, tokens, source) or None when the data is missing."""
    path = largest_conversation(data_dir)
    if path is None:
        return None
    with open(path) as f:
        conv = json.load(f)
    msgs = conv["messages"]
    tools = conv.get("tools") or []
    total = count(json.dumps(tools)) if tools else 0
    best = None
    for i, m in enumerate(msgs):
        total += message_tokens(m)
        if total > target_tokens:
            break
        nxt = msgs[i + 1].get("role") if i + 1 < len(msgs) else None
        if m.get("role") == "user" or (m.get("role") == "tool" and nxt != "tool"):
            best = (i + 1, total)
    if best is None:
        return None
    n, tokens = best
    return {"model": conv.get("model", "gpt-4o"), "tools": tools, "messages": msgs[:n],
            "tokens": tokens, "source": os.path.basename(path), "counter": COUNTER}


def new_turn(i):
    """One more exchange: the assistant's answer to the last prompt and a new user prompt."""
    return [
        {"role": "assistant", "content": f"Done with step {i}. The change is committed."},
        {"role": "user", "content": f"Thanks. Now for step {i + 1}: run the tests again and "
                                    f"tell me which ones still fail."},
    ]


def turns(n):
    """n more exchanges, cumulative: what a client sends n turns later."""
    out = []
    for i in range(n):
        out += new_turn(i)
    return out


def with_nonce(messages, nonce):
    """A copy whose every string content differs (so no per-message cache can hit)."""
    out = []
    for m in messages:
        m = dict(m)
        if isinstance(m.get("content"), str):
            m["content"] = f"[{nonce}] " + m["content"]
        out.append(m)
    return out


def body(model, messages, tools, stream=False, **extra):
    obj = {"model": model, "messages": messages}
    if tools:
        obj["tools"] = tools
    if stream:
        obj["stream"] = True
    obj.update(extra)
    return json.dumps(obj, separators=(",", ":")).encode()
