#!/usr/bin/env bash
# Scenario: Pi (@mariozechner/pi-coding-agent) runs one session of several prompts through
# Compactor, past the model's window, with Pi's own compaction turned off.
#
# Pi runs with a throwaway HOME and agent dir (nothing leaks into the user's ~/.pi), a provider
# "compactor" in models.json (api openai-completions, baseUrl = Compactor) and
# {"compaction":{"enabled":false}} in settings.json. Each prompt is one `pi --mode json` call;
# the second and later ones `--continue` the same session, so every request carries the whole
# history. Each prompt attaches a source file (@file), so the session grows by a few hundred
# tokens a prompt. Only read-only tools are enabled, in case the model does call one. The first
# prompt also sets three facts, and a last prompt asks for them back after the compactions
# (tests/e2e/recall.py): they must be in what Compactor forwarded for it.
#
# Environment: COMPACTOR_URL (with /v1), E2E_COMPACTOR_LOG (Compactor's JSON log), PI_BIN,
# E2E_WINDOW (the model's window), E2E_MODEL, E2E_PI_PROMPTS (default 6),
# E2E_PI_MAX_TOKENS (default 64), E2E_PYTHON, E2E_ADMIN_TOKEN, E2E_LOG_DIR (Pi's event
# stream of each prompt is kept there), E2E_RELAY_LOG (bodies Compactor forwarded).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=recall.sh
source "$here/recall.sh"
: "${COMPACTOR_URL:?}" "${E2E_COMPACTOR_LOG:?}" "${PI_BIN:?}" "${E2E_WINDOW:?}"
model="${E2E_MODEL:-qwen2.5-coder-0.5b-instruct}"
prompts="${E2E_PI_PROMPTS:-6}"
py="${E2E_PYTHON:-python3}"
started=$SECONDS

work="$(mktemp -d)"
keep="${E2E_LOG_DIR:-}"
trap '[[ -n "$keep" ]] && cp "$work"/pi-*.jsonl "$work"/pi-*.err "$keep"/ 2>/dev/null; rm -rf "$work"' EXIT
export HOME="$work/home"
export PI_CODING_AGENT_DIR="$HOME/.pi/agent"
export PI_OFFLINE=1 PI_TELEMETRY=0
mkdir -p "$PI_CODING_AGENT_DIR" "$work/project/src" "$work/sessions"

cat >"$PI_CODING_AGENT_DIR/settings.json" <<'EOF'
{
  "compaction": { "enabled": false },
  "quietStartup": true
}
EOF
cat >"$PI_CODING_AGENT_DIR/models.json" <<EOF
{
  "providers": {
    "compactor": {
      "baseUrl": "$COMPACTOR_URL",
      "api": "openai-completions",
      "apiKey": "sk-e2e-pi",
      "compat": {
        "supportsDeveloperRole": false,
        "supportsReasoningEffort": false,
        "supportsStore": false,
        "maxTokensField": "max_tokens"
      },
      "models": [
        {
          "id": "$model",
          "name": "Qwen2.5 Coder 0.5B via Compactor",
          "contextWindow": 128000,
          "maxTokens": ${E2E_PI_MAX_TOKENS:-64}
        }
      ]
    }
  }
}
EOF

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
    args=("@src/module_$i.py" "$facts Prompt $i. In one sentence: what does this file do?")
  else
    args=("@src/module_$i.py" "Prompt $i. In one sentence: what does this file do?")
  fi
  t0=$SECONDS
  out="$work/pi-$i.jsonl"
  rc=0
  "$PI_BIN" --provider compactor --model "$model" --mode json --session-dir "$work/sessions" \
    --tools read,grep,find,ls --no-extensions --no-skills --no-prompt-templates \
    --no-context-files "${cont[@]}" "${args[@]}" \
    </dev/null >"$out" 2>"$work/pi-$i.err" || rc=$?
  # The assistant's final message of this prompt, and any error Pi reports.
  verdict="$("$py" - "$out" <<'EOF'
import json, sys
last, errors = None, []
for line in open(sys.argv[1], encoding="utf-8"):
    try:
        ev = json.loads(line)
    except ValueError:
        continue
    msg = ev.get("message") if isinstance(ev.get("message"), dict) else None
    if ev.get("type") == "message_end" and msg and msg.get("role") == "assistant":
        last = msg
        if msg.get("stopReason") in ("error", "aborted") or msg.get("errorMessage"):
            errors.append(msg.get("errorMessage") or msg.get("stopReason"))
    if ev.get("type") in ("auto_retry_start", "compaction_start"):
        errors.append(f"pi event {ev.get('type')}: {ev.get('errorMessage') or ev.get('reason')}")
if last is None:
    errors.append("no assistant message")
text = ""
if last:
    text = " ".join(c.get("text", "") for c in last.get("content", []) if c.get("type") == "text")
print(json.dumps({"errors": errors, "text": text[:80]}))
EOF
)"
  echo "[pi] prompt $i $((SECONDS - t0))s rc=$rc $verdict"
  if [[ $rc -ne 0 || "$verdict" != *'"errors": []'* ]]; then
    echo "[pi] FAIL on prompt $i; Pi's stderr:" >&2
    tail -20 "$work/pi-$i.err" >&2
    exit 1
  fi
done
recall_end pi "$verdict"

"$py" "$here/compactor_probe.py" check --scenario pi --log "$E2E_COMPACTOR_LOG" --since "$mark" \
  --url "${COMPACTOR_URL%/v1}" --window "$E2E_WINDOW" --min-requests "$prompts" \
  --min-window-factor 1 --min-compactions 1 --seconds "$((SECONDS - started))"
