#!/usr/bin/env bash
# Scenario: Codex (`@openai/codex`, its native binary) works through Compactor past the model's
# window, over the Responses API.
#
# Codex runs with a throwaway CODEX_HOME holding a config.toml (codex_config.sh): a custom
# provider whose base_url is Compactor, wire_api "responses", a minimized prompt, and
# model_context_window far above the real window, so Codex never compacts by itself. The first
# prompt is `codex exec --skip-git-repo-check`, every later one `codex exec resume --last`, so
# every request carries the whole thread. Each prompt pastes two source files of the shared
# conversation (about 1,000 tokens), so the thread outgrows a 4,096-token window twice; a last,
# short follow-up pastes nothing, so it fits through the newest checkpoint (a reuse). The first
# prompt also sets three facts, and that follow-up asks for them back (tests/e2e/recall.py):
# they must be in what Compactor forwarded for it.
#
# Passes when every prompt exits 0, Compactor's log shows at least two compactions and requests
# sent compacted beyond those that made a summary (a checkpoint reused), and Codex's own record
# of the thread holds no compaction of its own.
#
# With E2E_CODEX_BASELINE=1 the same prompts go straight to COMPACTOR_URL (point it at
# llama-server): the scenario then reports how many prompts Codex survived without Compactor.
#
# Environment: COMPACTOR_URL (with /v1), E2E_COMPACTOR_LOG, CODEX_BIN, E2E_WINDOW, E2E_MODEL,
# E2E_CODEX_PROMPTS (default 6), E2E_PYTHON, E2E_ADMIN_TOKEN, E2E_LOG_DIR, E2E_RELAY_LOG.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=recall.sh
source "$here/recall.sh"
: "${COMPACTOR_URL:?}" "${CODEX_BIN:?}"
baseline="${E2E_CODEX_BASELINE:-0}"
# Six: Codex's own instructions and tools (about 1,800 tokens) and the output reserve (1,024)
# leave about 1,000 tokens of a 4,096-token window for the conversation, less than one pasting
# prompt, so every prompt after the first is sent through a new summary. Six make five
# compactions in a row and a thread of about two windows (8,097 tokens in one CI run, just under
# two, as the model's answers ran short); more only repeat that. The check asks for 1.5 windows,
# so that short answers do not fail a thread that went well past the window.
prompts="${E2E_CODEX_PROMPTS:-6}"
py="${E2E_PYTHON:-python3}"
logs="${E2E_LOG_DIR:-$PWD}"
started=$SECONDS

# Codex refuses to create its helper binaries under the system temp folder: keep its home in
# the log directory, which also leaves its session record for inspection.
work="$logs/codex-work"
rm -rf "$work"
mkdir -p "$work/project"
home="$work/home"
bash "$here/codex_config.sh" "$home" "compactor=$COMPACTOR_URL" >"$work/config.toml"
mv "$work/config.toml" "$home/config.toml"
export CODEX_HOME="$home" COMPACTOR_KEY="sk-e2e-codex"

mark=0
if [[ "$baseline" != 1 ]]; then
  : "${E2E_COMPACTOR_LOG:?}" "${E2E_WINDOW:?}"
  mark="$("$py" "$here/compactor_probe.py" mark "$E2E_COMPACTOR_LOG")"
fi

prompt_text() { # n: two files of the shared conversation and a one-line question; n = -1: the
  # recall question, a short follow-up that pastes nothing and fits through the newest checkpoint
  if [[ "$1" == -1 ]]; then
    "$py" "$here/recall.py" question
    return
  fi
  "$py" - "$1" <<EOF
import sys
sys.path.insert(0, "$here")
import conversation, recall
n = int(sys.argv[1])
first, _ = conversation.source_file(2 * n)
second, question = conversation.source_file(2 * n + 1)
facts = recall.FACTS + " " if n == 0 else ""
print(f"{facts}Prompt {n + 1}. Two files of the project:\n\n{first}\n\n{second}\n\n"
      f"Do not run any command. In one sentence: {question}")
EOF
}

survived=0
cd "$work/project"
# The pasting prompts, then the follow-up (prompt number prompts + 1).
for i in $(seq 1 $((prompts + 1))); do
  resume=()
  [[ $i -gt 1 ]] && resume=(resume --last)
  [[ $i -gt $prompts && "$baseline" != 1 ]] && recall_begin
  t0=$SECONDS
  rc=0
  "$CODEX_BIN" exec --skip-git-repo-check -s read-only "${resume[@]}" "$(prompt_text $([[ $i -gt $prompts ]] && echo -1 || echo $((i - 1))))" \
    </dev/null >"$work/prompt-$i.out" 2>"$work/prompt-$i.err" || rc=$?
  answer="$(tail -c 200 "$work/prompt-$i.out" | tr '\n' ' ')"
  echo "[codex] prompt $i $((SECONDS - t0))s rc=$rc answer=${answer:0:100}"
  if [[ $rc -ne 0 ]]; then
    echo "[codex] prompt $i failed; Codex's stderr:" >&2
    tail -5 "$work/prompt-$i.err" >&2
    if [[ "$baseline" == 1 ]]; then break; fi
    exit 1
  fi
  survived=$i
done

if [[ "$baseline" == 1 ]]; then
  echo "E2E_RESULT {\"scenario\": \"codex-baseline\", \"prompts\": $prompts, \"survived\": $survived, \"seconds\": $((SECONDS - started))}"
  exit 0
fi

recall_end codex "$answer"

# Codex's own compaction would show in its session record as a `compacted` item.
if grep -rqs '"type":"compacted"' "$home/sessions"; then
  echo "[codex] FAIL: Codex compacted the thread itself" >&2
  exit 1
fi

"$py" "$here/compactor_probe.py" check --scenario codex --log "$E2E_COMPACTOR_LOG" \
  --since "$mark" --url "${COMPACTOR_URL%/v1}" --window "$E2E_WINDOW" \
  --min-requests "$prompts" --min-window-factor 1.5 --min-compactions 2 --min-reused 1 \
  --seconds "$((SECONDS - started))"
