#!/usr/bin/env bash
# Scenario: aider (aider-chat) holds a conversation through Compactor, past the model's window.
#
# aider runs with --openai-api-base at Compactor and the model "openai/<name>" (litellm's
# OpenAI-compatible route), in ask mode, without git or a repo map, in a throwaway HOME and
# project. Each message is one `aider --message` call with --restore-chat-history, so the
# whole conversation so far goes with every request; aider's own history summarization is kept
# out of the way with a large --max-chat-history-tokens (the proxy does that job here). The first
# message also sets three facts, and a last message asks for them back after the compactions
# (tests/e2e/recall.py): they must be in what Compactor forwarded for it.
#
# Environment: COMPACTOR_URL (with /v1), E2E_COMPACTOR_LOG (Compactor's JSON log), AIDER_BIN,
# E2E_WINDOW, E2E_MODEL, E2E_AIDER_MESSAGES (default 5), E2E_AIDER_MAX_TOKENS (default 96),
# E2E_LOG_DIR (aider's output of each message is kept there),
# E2E_PYTHON, E2E_ADMIN_TOKEN, E2E_RELAY_LOG (bodies Compactor forwarded).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=recall.sh
source "$here/recall.sh"
: "${COMPACTOR_URL:?}" "${E2E_COMPACTOR_LOG:?}" "${AIDER_BIN:?}" "${E2E_WINDOW:?}"
model="${E2E_MODEL:-qwen2.5-coder-0.5b-instruct}"
messages="${E2E_AIDER_MESSAGES:-5}"
py="${E2E_PYTHON:-python3}"
started=$SECONDS

work="$(mktemp -d)"
keep="${E2E_LOG_DIR:-}"
trap '[[ -n "$keep" ]] && cp "$work"/aider-*.out "$keep"/ 2>/dev/null; rm -rf "$work"' EXIT
export HOME="$work/home"
# litellm would otherwise try to fetch its model price list from the internet at import.
export LITELLM_LOCAL_MODEL_COST_MAP=True
export AIDER_CHECK_UPDATE=false AIDER_ANALYTICS=false
mkdir -p "$HOME" "$work/project"

# Short replies, and a model entry so aider does not warn about an unknown model.
cat >"$work/model-settings.yml" <<EOF
- name: openai/$model
  edit_format: whole
  use_repo_map: false
  extra_params:
    max_tokens: ${E2E_AIDER_MAX_TOKENS:-96}
    temperature: 0
EOF
cat >"$work/model-metadata.json" <<EOF
{
  "openai/$model": {
    "max_input_tokens": 131072,
    "max_output_tokens": 4096,
    "input_cost_per_token": 0,
    "output_cost_per_token": 0,
    "litellm_provider": "openai",
    "mode": "chat"
  }
}
EOF

mark="$("$py" "$here/compactor_probe.py" mark "$E2E_COMPACTOR_LOG")"
cd "$work/project"
# The messages, then the recall message (number messages + 1).
for i in $(seq 1 $((messages + 1))); do
  if [[ $i -gt $messages ]]; then
    recall_begin
    msg="$("$py" "$here/recall.py" question)"
  else
    msg="$("$py" -c "import sys; sys.path.insert(0, '$here'); import conversation; print(conversation.user_turn($i - 1))")"
    [[ $i -eq 1 ]] && msg="$("$py" "$here/recall.py" facts) $msg"
  fi
  t0=$SECONDS
  rc=0
  "$AIDER_BIN" --model "openai/$model" --openai-api-base "$COMPACTOR_URL" \
    --openai-api-key sk-e2e-aider \
    --model-settings-file "$work/model-settings.yml" \
    --model-metadata-file "$work/model-metadata.json" \
    --chat-mode ask --no-git --map-tokens 0 --yes-always --no-pretty --no-fancy-input \
    --no-show-model-warnings --no-check-update --analytics-disable --no-detect-urls \
    --max-chat-history-tokens 1000000 --restore-chat-history \
    --chat-history-file "$work/chat.history.md" \
    --input-history-file "$work/input.history" \
    --message "$msg" </dev/null >"$work/aider-$i.out" 2>&1 || rc=$?
  reply="$(tail -n 3 "$work/aider-$i.out" | tr '\n' ' ' | cut -c1-100)"
  # The small model sometimes recites the file until max_tokens; aider then says the reply "hit a
  # token limit" (finish_reason "length"), which is about the reply, not the context window.
  if grep -q 'has hit a token limit' "$work/aider-$i.out"; then
    reply="(the reply was cut at max_tokens; aider reports that as a token limit)"
  fi
  echo "[aider] message $i $((SECONDS - t0))s rc=$rc reply: $reply"
  # aider prints provider errors and keeps a 0 exit status; look for them too.
  if [[ $rc -ne 0 ]] || grep -q -E 'litellm\.[A-Za-z]*Error|BadRequestError|APIError|exceeds the available context|Retrying in' "$work/aider-$i.out"; then
    echo "[aider] FAIL on message $i; aider's output:" >&2
    tail -40 "$work/aider-$i.out" >&2
    exit 1
  fi
done
recall_end aider "$reply"

"$py" "$here/compactor_probe.py" check --scenario aider --log "$E2E_COMPACTOR_LOG" --since "$mark" \
  --url "${COMPACTOR_URL%/v1}" --window "$E2E_WINDOW" --min-requests "$messages" \
  --min-window-factor 1 --min-compactions 1 --seconds "$((SECONDS - started))"
