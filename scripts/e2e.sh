#!/usr/bin/env bash
# End-to-end scenarios: real clients, through Compactor, to a real model (llama-server).
#
#   scripts/e2e.sh                    every scenario, grouped by window: python node anthropic
#                                     responses langchain context_management (2048), pi aider
#                                     claude codex opencode (4096)
#   scripts/e2e.sh python pi          only these
#   scripts/e2e.sh setup              only install the clients, the server and the model
#
# Steps: install the clients into the cache (once), build target/release/compactor
# (`cargo build --release`, a no-op when up to date), then for each window in use start
# llama-server (scripts/llama-server.sh) with that window and a Compactor in front of it, run
# that window's scenarios one after the other, stop both. At the end: a table of durations and
# compactions, and a non-zero exit if any scenario failed.
#
# Windows: the SDK scenarios (python, node) run against a 2048-token window, so that a history
# of three windows and several compactions take a few minutes on 2 cores; the agents (pi,
# aider) against 4096 tokens, since Pi's own prompt and tools take about 1.4k. The Anthropic
# scenarios follow the same split: the SDK (anthropic) at 2048, Claude Code (claude) at 4096, and
# so do the Responses ones: the SDK (responses) at 2048, Codex (codex) at 4096. LangChain
# (langchain) is an SDK scenario, OpenCode (opencode) an agent one. context_management (both
# SDKs asking for the providers' own context management, which Compactor serves) is an SDK one.
# All traffic goes upstream through a recording relay (tests/e2e/recording_relay.py), so that the
# scenarios can check what Compactor forwarded: the Anthropic ones the shape of their bodies, the
# agents' recall turns the facts their first turn set (tests/e2e/recall.py).
#
# Environment (all optional):
#   COMPACTOR_CACHE       cache for downloads, the model, venvs and npm packages
#                         (default $HOME/.cache/compactor-e2e)
#   COMPACTOR_BIN         use this binary and skip `cargo build` (default target/release/compactor)
#   E2E_SDK_WINDOW        window for python and node (default 2048)
#   E2E_AGENT_WINDOW      window for pi and aider (default 4096)
#   E2E_LLAMA_PORT        llama-server's port (default 18089)
#   E2E_PORT              Compactor's port (default 18788)
#   E2E_RELAY_PORT        the recording relay's port (default E2E_PORT + 2)
#   E2E_LOG_DIR           logs of every process and scenario (default target/e2e)
#   E2E_SCENARIO_TIMEOUT  seconds one scenario may take (default 600)
#   PYTHON                python3 used to create the venvs (3.10–3.12 for aider)
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
CACHE="${COMPACTOR_CACHE:-$HOME/.cache/compactor-e2e}"
export COMPACTOR_CACHE="$CACHE"
PYTHON="${PYTHON:-python3}"
LLAMA_PORT="${E2E_LLAMA_PORT:-18089}"
PORT="${E2E_PORT:-18788}"
SDK_WINDOW="${E2E_SDK_WINDOW:-2048}"
AGENT_WINDOW="${E2E_AGENT_WINDOW:-4096}"
LOGS="${E2E_LOG_DIR:-$root/target/e2e}"
TIMEOUT="${E2E_SCENARIO_TIMEOUT:-600}"
MODEL="qwen2.5-coder-0.5b-instruct"
ADMIN_TOKEN="e2e-admin"

# Pinned client versions. A change here reinstalls.
PY_PACKAGES=(openai==3.57.0)
AIDER_PACKAGES=(aider-chat==0.86.2)
NPM_PACKAGES=(openai@7.59.0 @mariozechner/pi-coding-agent@0.73.1)
ANTHROPIC_PACKAGES=(anthropic==2.10.0)
CLAUDE_PACKAGES=(@anthropic-ai/claude-code@2.1.328)
CODEX_PACKAGES=(@openai/codex@0.169.0)
LANGCHAIN_PACKAGES=(langchain-openai==1.7.4)
OPENCODE_PACKAGES=(opencode-ai@1.18.33)
# The context-management scenario drives both SDKs from one process.
CONTEXT_PACKAGES=("${ANTHROPIC_PACKAGES[@]}" "${PY_PACKAGES[@]}")
RELAY_PORT="${E2E_RELAY_PORT:-$((PORT + 2))}"

setup_only=false
if [[ "${1:-}" == setup ]]; then setup_only=true; shift; fi
scenarios=("$@")
all_scenarios=(python node anthropic responses langchain context_management pi aider claude codex
  opencode)
[[ ${#scenarios[@]} -gt 0 ]] || scenarios=("${all_scenarios[@]}")
for s in "${scenarios[@]}"; do
  case " ${all_scenarios[*]} " in *" $s "*) ;;
    *) echo "unknown scenario $s (${all_scenarios[*]})" >&2; exit 2 ;;
  esac
done
wants() { local s; for s in "${scenarios[@]}"; do [[ "$s" == "$1" ]] && return 0; done; return 1; }
window_of() { case "$1" in python|node|anthropic|responses|langchain|context_management) echo "$SDK_WINDOW" ;; *) echo "$AGENT_WINDOW" ;; esac; }

say() { echo "e2e: $*" >&2; }
mkdir -p "$CACHE" "$LOGS"
rm -f "$LOGS"/*.log "$LOGS"/*.toml "$LOGS"/*.out "$LOGS"/*.jsonl "$LOGS"/*.err
started=$SECONDS

# ---- clients, installed once into the cache ---------------------------------------------
venv_with() { # dir packages…: a venv holding exactly these pins (stamped)
  local dir="$1"; shift
  local stamp="$*"
  if [[ -x "$dir/bin/python" && "$(cat "$dir/.e2e-stamp" 2>/dev/null)" == "$stamp" ]]; then
    return 0
  fi
  say "installing $* into $dir"
  rm -rf "$dir"
  "$PYTHON" -m venv "$dir"
  "$dir/bin/pip" install --disable-pip-version-check -q "$@" >"$LOGS/pip-$(basename "$dir").log" 2>&1 \
    || { tail -30 "$LOGS/pip-$(basename "$dir").log" >&2; return 1; }
  echo "$stamp" >"$dir/.e2e-stamp"
}

npm_with() { # dir packages…
  local dir="$1"; shift
  local stamp="$*"
  if [[ -d "$dir/node_modules" && "$(cat "$dir/.e2e-stamp" 2>/dev/null)" == "$stamp" ]]; then
    return 0
  fi
  say "installing $* into $dir"
  rm -rf "$dir"
  mkdir -p "$dir"
  echo '{"name":"compactor-e2e-clients","private":true}' >"$dir/package.json"
  npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "$@" >"$LOGS/npm.log" 2>&1 \
    || { tail -30 "$LOGS/npm.log" >&2; return 1; }
  echo "$stamp" >"$dir/.e2e-stamp"
}

# One setup at a time per cache: CI starts one in the background while the first stages
# compile (.ci/run), and this script's own setup then waits for it and finds everything ready.
exec 8>"$CACHE/.setup.lock"
flock 8
t0=$SECONDS
venv_with "$CACHE/venv" "${PY_PACKAGES[@]}"
wants aider && venv_with "$CACHE/venv-aider" "${AIDER_PACKAGES[@]}"
if wants node || wants pi; then npm_with "$CACHE/node" "${NPM_PACKAGES[@]}"; fi
wants anthropic && venv_with "$CACHE/venv-anthropic" "${ANTHROPIC_PACKAGES[@]}"
wants claude && npm_with "$CACHE/claude" "${CLAUDE_PACKAGES[@]}"
wants codex && npm_with "$CACHE/codex" "${CODEX_PACKAGES[@]}"
wants langchain && venv_with "$CACHE/venv-langchain" "${LANGCHAIN_PACKAGES[@]}"
wants opencode && npm_with "$CACHE/opencode" "${OPENCODE_PACKAGES[@]}"
wants context_management && venv_with "$CACHE/venv-context" "${CONTEXT_PACKAGES[@]}"
say "clients ready ($((SECONDS - t0))s)"

# The server and the model, fetched (or built) once; a no-op when cached.
t0=$SECONDS
"$root/scripts/llama-server.sh" fetch
say "llama-server and model ready ($((SECONDS - t0))s)"
flock -u 8
exec 8>&-
if $setup_only; then exit 0; fi

# ---- the proxy -----------------------------------------------------------------------------
if [[ -n "${COMPACTOR_BIN:-}" ]]; then
  BIN="$COMPACTOR_BIN"
else
  BIN="$root/target/release/compactor"
  say "cargo build --release"
  cargo build --release --quiet --bin compactor
fi
[[ -x "$BIN" ]] || { say "no compactor binary at $BIN"; exit 1; }

# ---- one stack (llama-server + Compactor) per window, stopped on exit ---------------------
compactor_pid=""
relay_pid=""
stop_stack() {
  if [[ -n "$relay_pid" ]]; then
    kill "$relay_pid" 2>/dev/null || true
    wait "$relay_pid" 2>/dev/null || true
    relay_pid=""
  fi
  if [[ -n "$compactor_pid" ]]; then
    kill "$compactor_pid" 2>/dev/null || true
    wait "$compactor_pid" 2>/dev/null || true
    compactor_pid=""
  fi
  "$root/scripts/llama-server.sh" stop "$LLAMA_PORT" 2>/dev/null || true
}
trap 'rc=$?; stop_stack; exit $rc' EXIT
trap 'exit 130' INT TERM

start_stack() { # window
  local window="$1" t0=$SECONDS out
  # Two slots of `window` tokens each: the proxy's summary requests get their own slot, so the
  # conversation's prompt cache survives them.
  out="$(LLAMA_CTX="$window" LLAMA_PARALLEL=2 LLAMA_ALIAS="$MODEL" \
    LLAMA_LOG="$LOGS/llama-server-$window.log" "$root/scripts/llama-server.sh" start "$LLAMA_PORT")"
  eval "$out"
  say "llama-server ($window-token window) ready at $LLAMA_URL ($((SECONDS - t0))s)"

  export E2E_RELAY_LOG="$LOGS/relay-$window.jsonl"
  "$PYTHON" "$root/tests/e2e/recording_relay.py" "$RELAY_PORT" "${LLAMA_URL%/v1}" "$E2E_RELAY_LOG" \
    >"$LOGS/relay-$window.log" 2>&1 &
  relay_pid=$!

  local config="$LOGS/compactor-$window.toml"
  { echo "anthropic_upstream = \"http://127.0.0.1:$RELAY_PORT\""
    sed -E "s/^(\"qwen2.5-coder-0.5b\" = )[0-9]+/\1$window/" "$root/tests/e2e/compactor.e2e.toml"
  } >"$config"
  COMPACTOR_LOG_FILE="$LOGS/compactor-$window.log"
  # Only the e2e configuration counts: drop COMPACTOR_* overrides from the caller's environment.
  # shellcheck disable=SC2046
  env $(env | grep -o '^COMPACTOR_[A-Z_]*' | grep -v '^COMPACTOR_CACHE$' | sed 's/^/-u /') \
    "$BIN" serve --listen "127.0.0.1:$PORT" --upstream "http://127.0.0.1:$RELAY_PORT/v1" --config "$config" \
    >"$COMPACTOR_LOG_FILE" 2>&1 &
  compactor_pid=$!
  local i
  for i in $(seq 100); do
    if "$PYTHON" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/healthz', timeout=1)" 2>/dev/null; then
      break
    fi
    kill -0 "$compactor_pid" 2>/dev/null || { tail -20 "$COMPACTOR_LOG_FILE" >&2; say "compactor exited"; return 1; }
    [[ $i -lt 100 ]] || { say "compactor not healthy"; return 1; }
    sleep 0.2
  done
  say "compactor ready at http://127.0.0.1:$PORT/v1 (log: $COMPACTOR_LOG_FILE)"
  export COMPACTOR_URL="http://127.0.0.1:$PORT/v1"
  export E2E_COMPACTOR_LOG="$COMPACTOR_LOG_FILE"
  export E2E_WINDOW="$window"
}

# A summary written ahead of time for one scenario's last turn may still be running when the
# next scenario starts on the same proxy, and the scenarios count the summaries in its log: each
# starts once the proxy writes none.
wait_until_no_summary_in_progress() {
  local i metrics
  for i in $(seq "$TIMEOUT"); do
    metrics="$("$PYTHON" -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$PORT/metrics', timeout=5).read().decode())" 2>/dev/null || true)"
    grep -qE '^compactor_summaries_in_progress 0$' <<<"$metrics" && return 0
    sleep 1
  done
  say "summaries still in progress after ${TIMEOUT}s"
  return 1
}

# ---- scenarios -----------------------------------------------------------------------------
export E2E_MODEL="$MODEL" E2E_ADMIN_TOKEN="$ADMIN_TOKEN" E2E_LOG_DIR="$LOGS"
export E2E_PYTHON="$CACHE/venv/bin/python"
export NODE_PATH="$CACHE/node/node_modules"
export PI_BIN="$CACHE/node/node_modules/.bin/pi"
export AIDER_BIN="$CACHE/venv-aider/bin/aider"
export CLAUDE_BIN="$CACHE/claude/node_modules/@anthropic-ai/claude-code-linux-x64/claude"
export OPENCODE_BIN="$CACHE/opencode/node_modules/.bin/opencode"
export CODEX_BIN="$CACHE/codex/node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex"

declare -A status seconds results
failed=0
current_window=""
for s in "${scenarios[@]}"; do
  window="$(window_of "$s")"
  if [[ "$window" != "$current_window" ]]; then
    stop_stack
    start_stack "$window"
    current_window="$window"
  else
    wait_until_no_summary_in_progress
  fi
  case "$s" in
    python) cmd=("$CACHE/venv/bin/python" "$root/tests/e2e/scenario_openai_python.py") ;;
    node) cmd=(node "$root/tests/e2e/scenario_openai_node.cjs") ;;
    pi) cmd=(bash "$root/tests/e2e/scenario_pi.sh") ;;
    aider) cmd=(bash "$root/tests/e2e/scenario_aider.sh") ;;
    anthropic) cmd=("$CACHE/venv-anthropic/bin/python" "$root/tests/e2e/scenario_anthropic_python.py") ;;
    claude) cmd=(bash "$root/tests/e2e/scenario_claude_code.sh") ;;
    codex) cmd=(bash "$root/tests/e2e/scenario_codex.sh") ;;
    responses) cmd=("$CACHE/venv/bin/python" "$root/tests/e2e/scenario_responses_python.py") ;;
    langchain) cmd=("$CACHE/venv-langchain/bin/python" "$root/tests/e2e/scenario_langchain.py") ;;
    opencode) cmd=(bash "$root/tests/e2e/scenario_opencode.sh") ;;
    context_management)
      cmd=("$CACHE/venv-context/bin/python" "$root/tests/e2e/scenario_context_management.py") ;;
  esac
  say "scenario $s (window $window): ${cmd[*]}"
  t0=$SECONDS
  set +e
  timeout --kill-after=10 "$TIMEOUT" "${cmd[@]}" 2>&1 | tee "$LOGS/scenario-$s.log"
  rc=$?
  set -e
  seconds[$s]=$((SECONDS - t0))
  results[$s]="$(grep -o 'E2E_RESULT .*' "$LOGS/scenario-$s.log" | tail -1 | cut -d' ' -f2- || true)"
  if [[ $rc -eq 0 && -n "${results[$s]}" ]]; then
    status[$s]=passed
  else
    status[$s]="FAILED (exit $rc)"
    [[ $rc -eq 124 ]] && status[$s]="FAILED (timeout ${TIMEOUT}s)"
    failed=$((failed + 1))
    say "scenario $s failed; last lines of the Compactor log:"
    tail -15 "$COMPACTOR_LOG_FILE" >&2 || true
  fi
done
stop_stack

# ---- report --------------------------------------------------------------------------------
echo
echo "e2e results (model $MODEL, logs in $LOGS, $((SECONDS - started))s in all):"
printf '  %-18s %-22s %8s  %s\n' scenario status seconds "details"
for s in "${scenarios[@]}"; do
  printf '  %-18s %-22s %8s  %s\n' "$s" "${status[$s]}" "${seconds[$s]}" "${results[$s]}"
done
passed=$((${#scenarios[@]} - failed))
echo "e2e: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
