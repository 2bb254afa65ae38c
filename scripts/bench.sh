#!/usr/bin/env bash
# Load benchmark: Compactor beside direct access, nginx and LiteLLM's proxy, all in front of the
# same fast mock upstream, in one run on this machine. Prints a markdown table and writes it to
# benches/results/YYYY-MM-DD.md (raw figures beside it as .json).
#
#   scripts/bench.sh                      # everything (about 5-8 minutes on 2 cores)
#   scripts/bench.sh --systems nginx,compactor --seconds 5
#   scripts/bench.sh --help               # all options (scripts/bench/run.py)
#   # the load rounds also run nginx and Compactor with their request logs on (`--log both`, the
#   # default; `--log off` skips those twins) and print the log line's cost beside nginx's
#   # per-stage costs: cargo run --release --example stage_costs
#   # a 200k-token body in all three dialects: scripts/bench/large_dialects.py --compactor BIN
#   # instructions per request beside nginx (callgrind; steady on a busy host): scripts/bench/instructions.py
#   # two builds in one run, interleaved (e.g. before and after a change):
#   scripts/bench.sh --systems compactor --baseline-compactor ../before/target/release/compactor \
#     --baseline-name b78c675 --label before-after
#
# What it installs when missing (as root; otherwise install them first):
#   Debian:    nginx, wrk, libssl-dev, pkg-config  (apt-get)
#   crates.io: oha $OHA_VERSION                    (cargo install, into $CACHE/oha-bin, with
#              its native-tls feature instead of the default rustls one, whose aws-lc-sys does
#              not build everywhere; oha does not build with no TLS feature at all). If that
#              fails too, the fixed-rate rows run on wrk, paced (the report says so: its tail
#              figures are not oha's).
#   PyPI:      litellm[proxy]==$LITELLM_VERSION    (a venv in $CACHE/litellm-venv; only when
#              LiteLLM is among --systems)
#              openai==$OPENAI_SDK_VERSION          (a venv in $CACHE/sdk-venv: the real-SDK row)
# and it builds target/release/compactor (`cargo build --release`) unless BENCH_NO_BUILD=1.
#
# Environment: COMPACTOR_CACHE (default ~/.cache/compactor-bench), OHA_VERSION, LITELLM_VERSION,
# OPENAI_SDK_VERSION,
# BENCH_NO_BUILD=1 (use the existing binary), BENCH_COMPACTOR_LOG (COMPACTOR_LOG for the proxy, default warn).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${COMPACTOR_CACHE:-$HOME/.cache/compactor-bench}"
OHA_VERSION="${OHA_VERSION:-1.16.0}"
LITELLM_VERSION="${LITELLM_VERSION:-1.108.7}"
OPENAI_SDK_VERSION="${OPENAI_SDK_VERSION:-3.57.0}"
mkdir -p "$CACHE"

say() { echo "[bench.sh] $*" >&2; }

# --- Debian packages ---------------------------------------------------------------------------
missing=()
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing+=(nginx)
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
command -v taskset >/dev/null 2>&1 || missing+=(util-linux)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
[ -e /usr/include/openssl/ssl.h ] || missing+=(libssl-dev)
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]} (apt-get)"
  if [ "$(id -u)" -ne 0 ]; then say "not root: install ${missing[*]} first"; exit 1; fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
export PATH="/usr/sbin:$PATH"

# --- oha (fixed-rate load with latency correction) ---------------------------------------------
OHA="$CACHE/oha-bin/bin/oha"
if [ ! -x "$OHA" ]; then
  if command -v oha >/dev/null 2>&1; then
    OHA="$(command -v oha)"
  else
    say "installing oha $OHA_VERSION with native-tls (cargo install, a few minutes)"
    # A target dir of its own: never the project's (CARGO_TARGET_DIR may point there).
    if ! CARGO_TARGET_DIR="$CACHE/oha-build" cargo install --locked --quiet oha \
        --version "$OHA_VERSION" --no-default-features --features native-tls \
        --root "$CACHE/oha-bin"; then
      say "oha did not install: the fixed-rate rows run on wrk, paced"
      OHA=""
    fi
    rm -rf "$CACHE/oha-build"
  fi
fi

# --- LiteLLM proxy in its own venv, when it is measured -----------------------------------------
systems="direct,nginx,litellm,compactor"
args=("$@")
for i in "${!args[@]}"; do
  case "${args[$i]}" in
    --systems) systems="${args[$((i + 1))]:-}" ;;
    --systems=*) systems="${args[$i]#--systems=}" ;;
  esac
done
VENV="$CACHE/litellm-venv"
if [[ ",${systems,,}," == *,litellm,* ]] && [ ! -x "$VENV/bin/litellm" ]; then
  say "installing litellm[proxy]==$LITELLM_VERSION into $VENV (pip)"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q "litellm[proxy]==$LITELLM_VERSION"
fi

# --- the OpenAI Python SDK, for the real-SDK row ------------------------------------------------
SDK_VENV="$CACHE/sdk-venv"
if [ "$(cat "$SDK_VENV/.stamp" 2>/dev/null)" != "openai==$OPENAI_SDK_VERSION" ]; then
  say "installing openai==$OPENAI_SDK_VERSION into $SDK_VENV (pip)"
  rm -rf "$SDK_VENV"
  python3 -m venv "$SDK_VENV"
  "$SDK_VENV/bin/pip" install -q --disable-pip-version-check "openai==$OPENAI_SDK_VERSION"
  echo "openai==$OPENAI_SDK_VERSION" >"$SDK_VENV/.stamp"
fi

# --- the proxy ---------------------------------------------------------------------------------
if [ "${BENCH_NO_BUILD:-0}" != 1 ]; then
  say "cargo build --release"
  (cd "$ROOT" && cargo build --release --quiet --bin compactor) || say "build failed: Compactor will be reported n/a"
fi

ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" || true

# run.py needs only the standard library; LiteLLM's venv also brings tiktoken (and its bundled
# encoding files) for exact token counts of the large conversation, so it runs there when present.
PYTHON="$VENV/bin/python"
[ -x "$PYTHON" ] || PYTHON=python3
export BENCH_COMMAND="scripts/bench.sh${*:+ $*}"
exec "$PYTHON" "$ROOT/scripts/bench/run.py" \
  --oha "$OHA" --litellm "$VENV/bin/litellm" --sdk-python "$SDK_VENV/bin/python" \
  --compactor "${CARGO_TARGET_DIR:-$ROOT/target}/release/compactor" "$@"
