#!/usr/bin/env bash
# Records the request sequences in tests/fixtures/codex/ from the real Codex binary talking to
# the scripted stub upstream (responses_stub.py). Rerun after a Codex upgrade:
#
#   tests/e2e/record_codex.sh [port]      (default port 19501; CODEX may name the binary)
#
# Two recordings:
#   exec-resume.jsonl   a custom provider (wire_api "responses", minimized prompt): one
#                       `codex exec` turn and three `codex exec resume --last` turns, each
#                       pasting part of a source file; the stub answers every turn's first
#                       request with a function call (`seq 1 60`).
#   compaction.jsonl    the built-in OpenAI provider pointed at the stub, with a compaction
#                       limit of 1,000 tokens and the stub reporting 5,000: Codex asks for a
#                       remote compaction (`compaction_trigger`) and sends the returned
#                       `compaction` item back in the turns after it.
#
# Only POSTs are kept (the built-in provider first tries websockets with GETs), and only the
# fields that are not machine-specific: the turn metadata header shrinks to request_kind and
# window_number, client_metadata is dropped.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
port="${1:-19501}"
cache="${COMPACTOR_CACHE:-$HOME/.cache/compactor-e2e}"
CODEX="${CODEX:-$cache/codex/node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex}"
out="$root/tests/fixtures/codex"
mkdir -p "$out"
work="${RECORD_WORK:-$root/target/codex-record}"
rm -rf "$work"
mkdir -p "$work"

stub_pid=""
stop_stub() {
  if [[ -n "$stub_pid" ]]; then
    kill "$stub_pid" 2>/dev/null || true
    wait "$stub_pid" 2>/dev/null || true
  fi
  stub_pid=""
}
trap stop_stub EXIT

prompt() { # n: the start of one file of the shared conversation, and a question (~350 tokens)
  python3 - "$1" <<EOF
import sys
sys.path.insert(0, "$here")
import conversation
code, question = conversation.source_file(int(sys.argv[1]))
print(f"{code[:1200]}\n\n{question}")
EOF
}

record() { # name provider-config stub-args…
  local name="$1" provider="$2"; shift 2
  local home="$work/$name-home" project="$work/$name-project"
  mkdir -p "$home" "$project"
  bash "$here/codex_config.sh" "$home" "$provider" >"$home/config.toml"
  python3 "$here/responses_stub.py" --port "$port" --log "$work/$name.raw.jsonl" --tool-call "$@" &
  stub_pid=$!
  sleep 1
  local i
  for i in 0 1 2 3; do
    local resume=()
    [[ $i -gt 0 ]] && resume=(resume --last)
    (cd "$project" && CODEX_HOME="$home" COMPACTOR_KEY=sk-record OPENAI_API_KEY=sk-record \
      timeout 120 "$CODEX" exec --skip-git-repo-check -s danger-full-access "${resume[@]}" \
      "$(prompt "$i")" </dev/null >"$work/$name-$i.out" 2>&1)
  done
  stop_stub
  python3 - "$work/$name.raw.jsonl" "$out/$name.jsonl" <<'EOF'
import json, sys
kept = []
for line in open(sys.argv[1], encoding="utf-8"):
    entry = json.loads(line)
    if entry["method"] != "POST":
        continue
    headers = entry["headers"]
    meta = json.loads(headers.pop("x-codex-turn-metadata", "{}"))
    headers["x-codex-turn-metadata"] = json.dumps(
        {"request_kind": meta.get("request_kind"), "window_number": meta.get("window_number")}
    )
    body = entry["body"]
    body.pop("client_metadata", None)
    kept.append({"path": entry["path"], "headers": headers, "body": body})
with open(sys.argv[2], "w", encoding="utf-8") as f:
    for entry in kept:
        f.write(json.dumps(entry, separators=(",", ":")) + "\n")
print(f"{sys.argv[2]}: {len(kept)} requests")
EOF
}

record exec-resume "compactor=http://127.0.0.1:$port/v1"
record compaction "openai=http://127.0.0.1:$port/v1" --input-tokens 5000
