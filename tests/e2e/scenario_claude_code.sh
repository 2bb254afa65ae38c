#!/usr/bin/env bash
# Scenario: Claude Code (@anthropic-ai/claude-code, headless `claude -p`) runs one session of
# several turns through Compactor's /v1/messages, past the model's window at least twice, with
# its own compaction off (DISABLE_AUTO_COMPACT=1: any compaction seen is Compactor's).
#
# Each turn pastes two source files of the shared conversation (about 1,100 tokens) and asks
# one short question; turn 1 starts the session with --session-id, later turns --resume it, so
# every request carries the whole history. Claude Code runs with a throwaway HOME, a
# placeholder key, a short system prompt and only the Bash tool (--bare), which brings its own
# prompt down to about 550 tokens. The first turn also sets three facts, and a last turn asks
# for them back after the compactions (tests/e2e/recall.py): they must be in what Compactor
# forwarded for it.
#
# Passes when every turn exits 0 with a result, Compactor's log shows the history reaching
# twice the window, at least 2 compactions and a checkpoint re-applied without a new summary,
# and no body forwarded upstream carries Claude Code's own compaction prompt.
#
# Baseline: with E2E_CLAUDE_DIRECT_URL set (llama-server's root URL), the same turns go straight
# to the model; the scenario stops at the first failed turn and prints how many turns survived.
#
# Environment: COMPACTOR_URL (with /v1), E2E_COMPACTOR_LOG (Compactor's JSON log), CLAUDE_BIN,
# E2E_WINDOW, E2E_MODEL, E2E_CLAUDE_TURNS (default 8), E2E_CLAUDE_MAX_TOKENS (default 256:
# Claude Code ends a turn with an error when an answer reaches it, and the model rambled past 64),
# E2E_RELAY_LOG (bodies Compactor forwarded, optional), E2E_PYTHON, E2E_ADMIN_TOKEN, E2E_LOG_DIR.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=recall.sh
source "$here/recall.sh"
: "${CLAUDE_BIN:?}" "${E2E_WINDOW:?}"
model="${E2E_MODEL:-qwen2.5-coder-0.5b-instruct}"
turns="${E2E_CLAUDE_TURNS:-8}"
py="${E2E_PYTHON:-python3}"
direct="${E2E_CLAUDE_DIRECT_URL:-}"
started=$SECONDS
if [[ -n "$direct" ]]; then
  base_url="$direct"
else
  : "${COMPACTOR_URL:?}" "${E2E_COMPACTOR_LOG:?}"
  base_url="${COMPACTOR_URL%/v1}"
fi

work="$(mktemp -d)"
keep="${E2E_LOG_DIR:-}"
trap '[[ -n "$keep" ]] && cp "$work"/claude-*.json "$work"/claude-*.err "$keep"/ 2>/dev/null; rm -rf "$work"' EXIT
mkdir -p "$work/home" "$work/project"
session="$("$py" -c 'import uuid; print(uuid.uuid4())')"

prompt_of() { # turn number (1-based): two files of the shared conversation and a question
  "$py" - "$1" <<EOF
import sys
sys.path.insert(0, "$here")
import conversation, recall
turn = int(sys.argv[1])
first, question = conversation.source_file(2 * turn - 2)
second, _ = conversation.source_file(2 * turn - 1)
facts = recall.FACTS + " " if turn == 1 else ""
print(f"{facts}Turn {turn}. Two files of the project:\n\n{first}\n\n{second}\n\n{question} One sentence, no tools.")
EOF
}

if [[ -z "$direct" ]]; then
  mark="$("$py" "$here/compactor_probe.py" mark "$E2E_COMPACTOR_LOG")"
fi
relay_mark=0
[[ -n "${E2E_RELAY_LOG:-}" && -f "$E2E_RELAY_LOG" ]] && relay_mark="$(wc -l <"$E2E_RELAY_LOG")"

cd "$work/project"
survived=0
# The turns, then (through Compactor) the recall turn, number turns + 1.
last=$turns
[[ -z "$direct" ]] && last=$((turns + 1))
for i in $(seq 1 "$last"); do
  if [[ $i -eq 1 ]]; then resume=(--session-id "$session"); else resume=(--resume "$session"); fi
  if [[ $i -gt $turns ]]; then
    recall_begin
    prompt="$("$py" "$here/recall.py" question)"
  else
    prompt="$(prompt_of "$i")"
  fi
  t0=$SECONDS
  rc=0
  env HOME="$work/home" ANTHROPIC_BASE_URL="$base_url" ANTHROPIC_API_KEY=sk-e2e-claude \
    ANTHROPIC_MODEL="$model" ANTHROPIC_SMALL_FAST_MODEL="$model" \
    CLAUDE_CODE_MAX_OUTPUT_TOKENS="${E2E_CLAUDE_MAX_TOKENS:-256}" DISABLE_AUTO_COMPACT=1 \
    DISABLE_TELEMETRY=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_AUTOUPDATER=1 \
    "$CLAUDE_BIN" --bare -p "$prompt" --output-format json \
    --system-prompt "You are a coding agent. Be brief." --tools Bash --allowedTools Bash \
    --max-turns 2 "${resume[@]}" </dev/null >"$work/claude-$i.json" 2>"$work/claude-$i.err" || rc=$?
  verdict="$("$py" - "$work/claude-$i.json" <<'EOF'
import json, sys
try:
    out = json.load(open(sys.argv[1]))
except ValueError:
    print(json.dumps({"ok": False, "error": "no JSON result"}))
    sys.exit()
ok = out.get("is_error") is False and out.get("subtype") == "success"
print(json.dumps({"ok": ok, "reason": out.get("terminal_reason"), "input_tokens": out.get("usage", {}).get("input_tokens"), "result": str(out.get("result", ""))[:80]}))
EOF
)"
  echo "[claude] turn $i $((SECONDS - t0))s rc=$rc $verdict"
  if [[ $rc -ne 0 || "$verdict" != *'"ok": true'* ]]; then
    if [[ -n "$direct" ]]; then break; fi
    echo "[claude] FAIL on turn $i; Claude Code's stderr:" >&2
    tail -20 "$work/claude-$i.err" >&2
    exit 1
  fi
  survived=$i
done
if [[ -z "$direct" ]]; then recall_end claude "$verdict"; fi

if [[ -n "$direct" ]]; then
  echo "[claude] direct to the model: $survived of $turns turns survived"
  echo "E2E_RESULT {\"scenario\": \"claude-direct\", \"turns_survived\": $survived, \"turns\": $turns}"
  exit 0
fi

if [[ -n "${E2E_RELAY_LOG:-}" ]]; then
  "$py" - "$E2E_RELAY_LOG" "$relay_mark" <<'EOF'
import json, sys
lines = open(sys.argv[1]).read().splitlines()[int(sys.argv[2]):]
own = [l for l in lines if "continued from a previous conversation" in l or "CRITICAL: Respond with TEXT ONLY" in l]
print(f"[claude] {len(lines)} bodies forwarded upstream, {len(own)} with Claude Code's own compaction")
sys.exit(1 if own else 0)
EOF
fi

"$py" "$here/compactor_probe.py" check --scenario claude --log "$E2E_COMPACTOR_LOG" --since "$mark" \
  --url "$base_url" --window "$E2E_WINDOW" --min-requests "$turns" \
  --min-window-factor 2 --min-compactions 2 --min-reused 1 --seconds "$((SECONDS - started))"
