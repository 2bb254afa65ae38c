#!/usr/bin/env bash
# Scenario: OpenCode (`opencode-ai`) runs one session of several prompts through Compactor, past
# the model's window, with OpenCode's own compaction and pruning turned off.
#
# OpenCode runs with a throwaway HOME (nothing leaks into the user's ~/.config/opencode), its
# configuration given inline (OPENCODE_CONFIG_CONTENT): a provider "compactor" through the
# `@ai-sdk/openai-compatible` adapter whose baseURL is Compactor, and a `build` agent with a short
# prompt and only the `read` tool. OpenCode's default prompt and ten tools take about 8,700
# tokens, more than the 4,096-token model of this test holds. Each prompt is one
# `opencode run --format json` call with a source file attached (`-f`); the second and later ones
# `--continue` the session, so every request carries the whole history. The first prompt also
# sets three facts, and a last prompt asks for them back after the compactions
# (tests/e2e/recall.py): they must be in what Compactor forwarded for it.
#
# Environment: COMPACTOR_URL (with /v1), E2E_COMPACTOR_LOG (Compactor's JSON log), OPENCODE_BIN,
# E2E_WINDOW (the model's window), E2E_MODEL, E2E_OPENCODE_PROMPTS (default 6),
# E2E_OPENCODE_MAX_TOKENS (default 64), E2E_PYTHON, E2E_ADMIN_TOKEN, E2E_LOG_DIR (OpenCode's
# event stream of each prompt is kept there), E2E_RELAY_LOG (bodies Compactor forwarded).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=recall.sh
source "$here/recall.sh"
: "${COMPACTOR_URL:?}" "${E2E_COMPACTOR_LOG:?}" "${OPENCODE_BIN:?}" "${E2E_WINDOW:?}"
model="${E2E_MODEL:-qwen2.5-coder-0.5b-instruct}"
prompts="${E2E_OPENCODE_PROMPTS:-6}"
py="${E2E_PYTHON:-python3}"
started=$SECONDS

work="$(mktemp -d)"
keep="${E2E_LOG_DIR:-}"
trap '[[ -n "$keep" ]] && cp "$work"/opencode-*.jsonl "$work"/opencode-*.err "$keep"/ 2>/dev/null; rm -rf "$work"' EXIT
export HOME="$work/home"
export XDG_CONFIG_HOME="$HOME/.config" XDG_DATA_HOME="$HOME/.local/share" XDG_CACHE_HOME="$HOME/.cache"
# No update checks, no model catalogue fetched, no sharing; OpenCode's own compaction and its
# pruning of old tool output off, so that the history it sends is the whole session.
export OPENCODE_DISABLE_AUTOUPDATE=1 OPENCODE_DISABLE_MODELS_FETCH=1 OPENCODE_DISABLE_SHARE=1
export OPENCODE_DISABLE_AUTOCOMPACT=1 OPENCODE_DISABLE_PRUNE=1
export OPENCODE_DISABLE_CLAUDE_CODE=1 OPENCODE_DISABLE_DEFAULT_PLUGINS=1
export OPENCODE_DISABLE_EXTERNAL_SKILLS=1 OPENCODE_DISABLE_LSP_DOWNLOAD=1
mkdir -p "$HOME" "$work/project/src"

OPENCODE_CONFIG_CONTENT="$("$py" - "$COMPACTOR_URL" "$model" "${E2E_OPENCODE_MAX_TOKENS:-64}" <<'EOF'
import json, sys
url, model, max_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
off = ["bash", "edit", "glob", "grep", "skill", "task", "todowrite", "webfetch", "write"]
print(json.dumps({
    "provider": {"compactor": {
        "npm": "@ai-sdk/openai-compatible",
        "name": "Compactor",
        "options": {"baseURL": url, "apiKey": "sk-e2e-opencode"},
        # The window OpenCode believes in only decides when it would compact by itself (off).
        "models": {model: {"name": model, "limit": {"context": 128000, "output": max_tokens}}},
    }},
    "model": f"compactor/{model}",
    "small_model": f"compactor/{model}",
    "agent": {"build": {"prompt": "You are a coding agent. Be brief."}},
    "tools": {name: False for name in off},
}))
EOF
)"
export OPENCODE_CONFIG_CONTENT

# The project the session talks about: one file per prompt, from the shared conversation.
"$py" - "$work/project" "$prompts" <<EOF
import pathlib, sys
sys.path.insert(0, "$here")
import conversation
root = pathlib.Path(sys.argv[1])
for i in range(int(sys.argv[2])):
    code, _ = conversation.source_file(i)
    (root / "src" / f"module_{i + 1}.py").write_text(code)
EOF

mark="$("$py" "$here/compactor_probe.py" mark "$E2E_COMPACTOR_LOG")"
facts="$("$py" "$here/recall.py" facts)"
cd "$work/project"
# The prompts, then the recall prompt (number prompts + 1), which attaches nothing.
for i in $(seq 1 $((prompts + 1))); do
  cont=()
  [[ $i -gt 1 ]] && cont=(--continue)
  if [[ $i -gt $prompts ]]; then
    recall_begin
    args=("$("$py" "$here/recall.py" question)")
  elif [[ $i -eq 1 ]]; then
    args=("$facts Prompt $i. In one sentence: what does this file do?" -f "src/module_$i.py")
  else
    args=("Prompt $i. In one sentence: what does this file do?" -f "src/module_$i.py")
  fi
  t0=$SECONDS
  out="$work/opencode-$i.jsonl"
  rc=0
  "$OPENCODE_BIN" run --format json "${cont[@]}" "${args[@]}" \
    </dev/null >"$out" 2>"$work/opencode-$i.err" || rc=$?
  # The answer's text, and any error OpenCode reports (an `error` event, or a step that did not
  # finish).
  verdict="$("$py" - "$out" <<'EOF'
import json, sys
text, errors, finished = [], [], False
for line in open(sys.argv[1], encoding="utf-8"):
    try:
        ev = json.loads(line)
    except ValueError:
        continue
    part = ev.get("part") if isinstance(ev.get("part"), dict) else {}
    if ev.get("type") == "error":
        err = ev.get("error")
        errors.append(json.dumps(err)[:300] if err is not None else "error event")
    if ev.get("type") == "text":
        text.append(part.get("text", ""))
    if ev.get("type") == "step_finish":
        finished = True
if not finished:
    errors.append("no finished step")
print(json.dumps({"errors": errors, "text": " ".join(text)[:80]}))
EOF
)"
  echo "[opencode] prompt $i $((SECONDS - t0))s rc=$rc $verdict"
  if [[ $rc -ne 0 || "$verdict" != *'"errors": []'* ]]; then
    echo "[opencode] FAIL on prompt $i; OpenCode's stderr:" >&2
    tail -20 "$work/opencode-$i.err" >&2
    exit 1
  fi
done
recall_end opencode "$verdict"

"$py" "$here/compactor_probe.py" check --scenario opencode --log "$E2E_COMPACTOR_LOG" \
  --since "$mark" --url "${COMPACTOR_URL%/v1}" --window "$E2E_WINDOW" --min-requests "$prompts" \
  --min-window-factor 1 --min-compactions 1 --seconds "$((SECONDS - started))"
