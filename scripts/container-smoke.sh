#!/usr/bin/env bash
# Container smoke test: builds the image from the real Dockerfile (all of its stages) and starts
# both compose files, on a machine with no image registry.
#
#   scripts/container-smoke.sh          (as root; needs podman, runc, debootstrap, curl)
#
# Podman stands in for Docker, Debian trixie's docker-compose v2 talks to podman's API socket,
# and every image the Dockerfile and the compose files name is a stand-in built from Debian
# packages (docker/test/, test-only). What is checked:
#   image    the Dockerfile builds; the image runs as uid 10001, not root; its HEALTHCHECK passes
#   sidecar  the agent container reaches Compactor by its service name and gets the provider's
#            answer, sent with the key Compactor holds
#   gateway  both replicas answer through nginx; a checkpoint made on one is used by the other
#            through Redis; with Redis stopped requests are still served (store degraded), and
#            with Redis started again both replicas are ready; Prometheus scrapes both replicas
#
# Cached across runs on one machine: podman's image storage (base images, stand-ins, the
# Dockerfile's cargo-chef and dependency layers) and, in ${COMPACTOR_CONTAINER_CACHE:-
# ~/.cache/compactor-containers}, the debootstrap base trees and the docker-compose binary.
# Logs go to target/container-smoke/. Host ports: GATEWAY_PORT and PROMETHEUS_PORT if set, else
# free ones.
set -euo pipefail
cd "$(dirname "$0")/.."
prepare_only=false
case "${1:-}" in
  --prepare) prepare_only=true ;;  # only the base images, stand-ins and docker-compose (CI
                                   # fetches them in the background while it compiles)
  "") ;;
  *) echo "usage: scripts/container-smoke.sh [--prepare]" >&2; exit 2 ;;
esac

cache="${COMPACTOR_CONTAINER_CACHE:-$HOME/.cache/compactor-containers}"
logs="$PWD/target/container-smoke"
prefix=localhost/compactor-smoke
image=compactor:local
mkdir -p "$cache" "$logs"

step() { printf '\n--> %s  [%ds]\n' "$*" "$SECONDS"; }
ok() { printf 'ok:   %s\n' "$*"; }
fail() {
  printf 'FAIL: %s\n' "$*" >&2
  exit 1
}

[ "$(id -u)" = 0 ] || fail "needs root (podman containers on a bridge network)"
for tool in podman runc debootstrap curl; do
  command -v "$tool" >/dev/null || fail "$tool is missing (apt-get install podman runc debootstrap curl)"
done

# --- podman configuration, in a file of our own (nothing in /etc changes) -------------------------
# runc and cgroupfs: crun refuses a mixed cgroup v1/v2 host, and there may be no systemd. Podman's
# default limits (1M open files) are above what an unprivileged-resource host allows.
nofile=$(ulimit -Hn)
[ "$nofile" = unlimited ] && nofile=1048576
# Written whole and then renamed: a preparation in the background may be reading it.
cat >"$logs/containers.conf.$$" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=32768:32768"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
mv "$logs/containers.conf.$$" "$logs/containers.conf"
export CONTAINERS_CONF="$logs/containers.conf"

# --- base images from debootstrap ------------------------------------------------------------------
mirror=$(awk '$1 == "URIs:" { print $2; exit }' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
[ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $2 ~ /debian\/?$/ { print $2; exit }' /etc/apt/sources.list 2>/dev/null || true)
mirror="${mirror:-http://deb.debian.org/debian}"

# base_image SUITE: $prefix/SUITE:minbase, imported from a cached minbase tree.
base_image() {
  local suite=$1 tar="$cache/$1-minbase.tar"
  podman image exists "$prefix/$suite:minbase" && return 0
  if [ ! -s "$tar" ]; then
    local tree="$cache/$suite-rootfs"
    rm -rf "$tree"
    # forky has no script of its own in bookworm's debootstrap; sid's is the one for testing.
    debootstrap --variant=minbase "$suite" "$tree" "$mirror" /usr/share/debootstrap/scripts/sid
    rm -rf "$tree"/var/cache/apt/archives/*.deb "$tree"/var/lib/apt/lists/*
    tar -C "$tree" -cf "$tar.part" . && mv "$tar.part" "$tar"
    rm -rf "$tree"
  fi
  podman import --change 'CMD ["bash"]' "$tar" "$prefix/$suite:minbase" >/dev/null
}

# in_background NAME COMMAND...: runs it with its output in $logs/NAME.log; `finish` waits.
declare -A jobs=()
in_background() {
  local name=$1
  shift
  "$@" >"$logs/$name.log" 2>&1 &
  jobs[$name]=$!
}
finish() {
  local name failed=()
  for name in "${!jobs[@]}"; do
    wait "${jobs[$name]}" || failed+=("$name")
  done
  jobs=()
  for name in "${failed[@]}"; do
    tail -n 30 "$logs/$name.log" >&2
  done
  [ ${#failed[@]} = 0 ] || fail "${failed[*]} (logs in $logs)"
}

# One preparation at a time per cache: a later run waits for one in the background, then finds
# its images made.
exec 8>"$cache/.prepare.lock"
flock 8
step "base images (debootstrap bookworm and forky, cached)"
in_background base-bookworm base_image bookworm
in_background base-forky base_image forky
finish

# --- docker-compose v2, the binary from Debian trixie's package ------------------------------------
compose_bin="$cache/docker-compose"
fetch_compose() {
  local apt="$cache/apt-trixie"
  mkdir -p "$apt/lists/partial" "$apt/archives/partial" "$apt/deb"
  echo "deb $mirror trixie main" >"$apt/sources.list"
  local opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt" -o Acquire::Check-Valid-Until=false -o APT::Sandbox::User=root)
  apt-get "${opts[@]}" update -qq
  (cd "$apt/deb" && rm -f ./*.deb && apt-get "${opts[@]}" download docker-compose)
  rm -rf "$apt/x" && dpkg -x "$apt"/deb/docker-compose_*.deb "$apt/x"
  local bin
  bin="$apt/x/usr/libexec/docker/cli-plugins/docker-compose"
  "$bin" version || return 1
  install -m 755 "$bin" "$compose_bin.part" && mv "$compose_bin.part" "$compose_bin"
}

# --- stand-in images (docker/test/, test-only) -------------------------------------------------------
standin() {
  local name=$1 tag=$2 base=$3
  shift 3
  podman build --format docker --pull=never --build-arg "BASE=$prefix/$base:minbase" "$@" \
    -f "docker/test/$name.Dockerfile" -t "$prefix/$name:$tag" docker/test
}
host_ca=/usr/local/share/ca-certificates
if [ ! -d "$host_ca" ]; then
  host_ca="$logs/no-extra-ca"
  mkdir -p "$host_ca"
fi
toolchain=$(rustc --print sysroot)

step "stand-in images and docker-compose (cached)"
[ -x "$compose_bin" ] || in_background compose fetch_compose
in_background rust standin rust bookworm bookworm --build-arg "TOOLCHAIN_VERSION=$(rustc --version)" \
  -v "$toolchain:/host-toolchain:ro" -v "$host_ca:/host-ca:ro"
in_background python standin python bookworm bookworm
in_background redis standin redis bookworm bookworm
in_background prometheus standin prometheus bookworm bookworm
in_background nginx standin nginx forky forky
finish
flock -u 8
exec 8>&-
if $prepare_only; then exit 0; fi
compose() { "$compose_bin" "$@"; }
compose version

step "the Dockerfile, every stage (log: $logs/image.log)"
build_started=$SECONDS
podman build --format docker --pull=never \
  --build-arg "RUST_IMAGE=$prefix/rust:bookworm" --build-arg "RUNTIME_IMAGE=$prefix/bookworm:minbase" \
  -t "$image" . >"$logs/image.log" 2>&1 || {
  tail -n 40 "$logs/image.log" >&2
  fail "podman build of the Dockerfile"
}
ok "image $image built in $((SECONDS - build_started)) s"
# Each build leaves its stages behind as untagged images (2 to 3 GB a run), labelled by the
# Dockerfile. Those this build neither made nor reused (its log names both) are removed, and with
# each the parent layers no other image shares; what it made or reused stays, as the next
# build's cache. (Removing by age instead would throw away the cached dependency layer whenever
# a build reuses it, since it keeps the date it was first made.)
used_layers=$(grep -oE '^--> (Using cache )?[0-9a-f]{11,64}$' "$logs/image.log" |
  grep -oE '[0-9a-f]{11,64}$' | cut -c1-11 | sort -u || true)
for old in $(podman images --filter dangling=true --filter label=io.compactor.build-stage \
  --format '{{.ID}}'); do
  grep -qx "${old:0:11}" <<<"$used_layers" || podman rmi "$old" >/dev/null ||
    echo "    (could not remove an earlier build's image $old)" >&2
done

# --- the podman API socket for docker-compose, and the health checks podman cannot schedule ------
socket="$logs/podman.sock"
rm -f "$socket"
podman system service --time=0 "unix://$socket" >"$logs/podman-service.log" 2>&1 &
service_pid=$!
# Podman runs HEALTHCHECKs from systemd timers; without systemd, this loop runs them, so that
# `depends_on: condition: service_healthy` and `--wait` work.
health_ticker() {
  while sleep 2; do
    podman ps -q --filter label=com.docker.compose.project | while read -r id; do
      podman healthcheck run "$id" </dev/null >/dev/null 2>&1 || true
    done
  done
}
health_ticker >/dev/null 2>&1 &
ticker_pid=$!
export DOCKER_HOST="unix://$socket"

sidecar=(-f docker/compose.sidecar.yaml -f docker/test/sidecar.override.yaml)
gateway=(-f docker/compose.gateway.yaml -f docker/test/gateway.override.yaml)
cleanup() {
  compose "${sidecar[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
  compose "${gateway[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
  podman rm -f compactor-smoke-image >/dev/null 2>&1 || true
  kill "$ticker_pid" "$service_pid" 2>/dev/null || true
  wait "$ticker_pid" "$service_pid" 2>/dev/null || true
}
trap cleanup EXIT
for _ in $(seq 50); do
  [ -S "$socket" ] && break
  sleep 0.2
done
[ -S "$socket" ] || fail "podman system service did not open $socket"
export OPENAI_API_KEY=sk-smoke-key-held-by-compactor
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
export GATEWAY_PORT="${GATEWAY_PORT:-$(free_port)}" PROMETHEUS_PORT="${PROMETHEUS_PORT:-$(free_port)}"
cleanup_compose() {
  compose "${sidecar[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
  compose "${gateway[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
}
cleanup_compose

# --- the image on its own ------------------------------------------------------------------------------
step "image: non-root, HEALTHCHECK"
user=$(podman image inspect "$image" --format '{{.Config.User}}')
[ "$user" = 10001:10001 ] || fail "image user is '$user', expected 10001:10001"
# (podman logs, harmlessly, that it has no systemd to schedule health checks with)
podman run -d --name compactor-smoke-image -e COMPACTOR_UPSTREAM=http://127.0.0.1:9/v1 "$image" \
  >/dev/null 2>>"$logs/podman-run.log"
uid=$(podman exec compactor-smoke-image id -u)
[ "$uid" = 10001 ] || fail "the proxy's container runs as uid $uid"
ok "runs as uid $uid ($user in the image)"
healthy=0
for _ in $(seq 30); do
  if podman healthcheck run compactor-smoke-image >/dev/null 2>&1; then
    healthy=1
    break
  fi
  sleep 0.5
done
[ "$healthy" = 1 ] || fail "the image's HEALTHCHECK never passed: $(podman logs compactor-smoke-image 2>&1 | tail -n 5)"
status=$(podman inspect compactor-smoke-image --format '{{.State.Health.Status}}')
[ "$status" = healthy ] || fail "health status '$status' after a passing check"
ok "HEALTHCHECK passes (status $status)"
podman rm -f compactor-smoke-image >/dev/null 2>>"$logs/podman-run.log"

# --- sidecar ---------------------------------------------------------------------------------------------
step "sidecar: the agent reaches Compactor by service name"
sidecar_up() { timeout 180 "$compose_bin" "${sidecar[@]}" up --no-build --exit-code-from agent >"$logs/sidecar.log" 2>&1; }
sidecar_failed() { tail -n 40 "$logs/sidecar.log" >&2; fail "sidecar: the agent did not succeed"; }
if ! sidecar_up; then
  # The agent's check (the compose file's own) makes one attempt; a name lookup it loses to the
  # network's DNS server being silent after the containers start (see the gateway below) is the
  # platform's, so the whole file is started once more, and said. So is an exit status that
  # docker-compose under podman once got wrong: non-zero after logging that the agent exited 0.
  grep -q "name resolution\|Name or service not known\|agent-1 exited with code 0" \
    "$logs/sidecar.log" || sidecar_failed
  tail -n 5 "$logs/sidecar.log" >&2
  printf 'retry: the sidecar agent lost a name lookup or its exit status; starting the compose file again\n'
  compose "${sidecar[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
  sleep 5
  sidecar_up || sidecar_failed
fi
grep -q "compactor /healthz: 200" "$logs/sidecar.log" || fail "sidecar: no /healthz answer in the agent's output"
grep -q "models via compactor: \['stub-model'\]" "$logs/sidecar.log" ||
  fail "sidecar: the agent did not get the provider's models"
ok "agent: /healthz 200 and the provider's model list, through http://compactor:8787"
compose "${sidecar[@]}" down -v --remove-orphans >/dev/null 2>&1

# --- gateway ---------------------------------------------------------------------------------------------
step "gateway: two replicas, Redis, nginx, Prometheus"
gw="http://127.0.0.1:$GATEWAY_PORT"
if ! timeout 240 "$compose_bin" "${gateway[@]}" up -d --no-build --wait >"$logs/gateway-up.log" 2>&1; then
  tail -n 40 "$logs/gateway-up.log" >&2
  compose "${gateway[@]}" logs --no-color >"$logs/gateway.log" 2>&1 || true
  fail "gateway: compose up --wait (logs in $logs)"
fi
trap 'compose "${gateway[@]}" logs --no-color >"$logs/gateway.log" 2>&1 || true; cleanup' EXIT
in_net() { compose "${gateway[@]}" exec -T upstream python /smoke/gateway_check.py "$@"; }

# nginx_get PATH [SECONDS]: the status code and body of a GET through nginx ("000" if none came
# within SECONDS, default 10); the time it took is left in $logs/took.
nginx_get() {
  curl -sS -m "${2:-10}" -o "$logs/body" -w '%{http_code}%{stderr}\n%{time_total}\n' \
    -H 'authorization: Bearer smoke-tenant' "$gw$1" 2>"$logs/took" || true
}
# explain WHAT: what the gateway was doing when WHAT failed or was slow, for the CI log: the
# replicas' and nginx's last lines, and how long names take to resolve inside the network.
explain() {
  printf -- '--- %s; the gateway'"'"'s last log lines:\n' "$1" >&2
  compose "${gateway[@]}" logs --no-color --tail 12 compactor-1 compactor-2 nginx >&2 2>&1 || true
  in_net resolve >&2 || true
}
# The replicas reach the provider by name through the network's DNS server. Right after the
# containers start, podman's has been seen to answer nothing for many seconds (a replica's lookups
# of the provider timing out at 10 s, "temporary failure in name resolution" in other
# containers): the platform's delay, not the gateway's, so it is waited out here, and how long it
# took is printed, before the first request goes through.
dns_started=$SECONDS
until {
  timeout 5 "$compose_bin" "${gateway[@]}" exec -T compactor-1 getent ahosts upstream &&
    timeout 5 "$compose_bin" "${gateway[@]}" exec -T compactor-2 getent ahosts upstream
} >/dev/null 2>&1; do
  [ $((SECONDS - dns_started)) -lt 120 ] || fail "the replicas could not resolve the provider's name in 120 s"
  sleep 1
done
ok "both replicas resolve the provider's name (after $((SECONDS - dns_started)) s)"
for _ in $(seq 60); do
  [ "$(nginx_get /readyz 2>/dev/null)" = 200 ] && break
  sleep 0.5
done
{ grep -q '"redis"' "$logs/body" && grep -q '"ready"' "$logs/body"; } ||
  fail "gateway /readyz through nginx: $(cat "$logs/body")"
ok "/readyz through nginx: $(cat "$logs/body")"
in_net readyz ready

before=$(in_net requests)
for i in 1 2 3 4 5 6; do
  # A replica's first pass-through also resolves and connects to the provider.
  code=$(nginx_get /v1/models 30)
  took=$(grep -E '^[0-9.]+$' "$logs/took" | tail -n 1)
  if ! { [ "$code" = 200 ] && grep -q stub-model "$logs/body"; }; then
    explain "GET /v1/models #$i through nginx: $code after ${took}s"
    fail "GET /v1/models #$i through nginx: $code after ${took}s: $(cat "$logs/body")"
  fi
  # Answered, but slowly: said, with what the gateway was doing, so that a slow start shows.
  if awk -v t="$took" 'BEGIN { exit !(t > 2) }'; then
    printf 'slow: GET /v1/models #%d through nginx took %s s\n' "$i" "$took"
    explain "GET /v1/models #$i took ${took}s"
  fi
done
after=$(in_net requests)
for replica in compactor-1 compactor-2; do
  b=$(awk -v r="$replica" '$1 == r { print $2 }' <<<"$before")
  a=$(awk -v r="$replica" '$1 == r { print $2 }' <<<"$after")
  { [ -n "$a" ] && [ "$a" -gt "${b:-0}" ]; } || fail "$replica answered none of 6 requests through nginx ($before -> $after)"
  ok "$replica answered $((a - b)) of 6 requests through nginx"
done

in_net checkpoint

chat_body='{"model":"stub-model","messages":[{"role":"user","content":"hello"}]}'
# nginx_chat: status and x-compactor-store header of a chat request through nginx.
nginx_chat() {
  curl -sS -m 30 -o /dev/null -D "$logs/headers" -w '%{http_code}' -H 'authorization: Bearer smoke-tenant' \
    -H 'content-type: application/json' -d "$chat_body" "$gw/v1/chat/completions" || true
}
store_header() { awk -F': *' 'tolower($1) == "x-compactor-store" { gsub(/\r/, "", $2); print $2 }' "$logs/headers"; }

compose "${gateway[@]}" stop redis >/dev/null 2>&1
for i in 1 2 3 4; do
  code=$(nginx_chat)
  [ "$code" = 200 ] || fail "chat #$i through nginx with Redis stopped: $code"
  [ "$(store_header)" = degraded ] || fail "chat #$i with Redis stopped: x-compactor-store '$(store_header)'"
done
ok "Redis stopped: 4 chat requests through nginx answered 200, x-compactor-store: degraded"
in_net readyz degraded
compose "${gateway[@]}" start redis >/dev/null 2>&1
in_net readyz ready
code=$(nginx_chat)
{ [ "$code" = 200 ] && [ -z "$(store_header)" ]; } || fail "chat after Redis returned: $code, store '$(store_header)'"
ok "Redis started again: served with no degraded store"

prom="http://127.0.0.1:$PROMETHEUS_PORT/api/v1/query"
scraped=0
# Prometheus finds the replicas by name too: as long as the readiness waits above, for the same DNS.
prom_started=$SECONDS
while [ $((SECONDS - prom_started)) -lt 150 ]; do
  if curl -sS -m 5 -G "$prom" --data-urlencode 'query=up{job="compactor"} == 1' -o "$logs/prometheus.json" 2>/dev/null &&
    grep -q '"instance":"compactor-1:8787"' "$logs/prometheus.json" &&
    grep -q '"instance":"compactor-2:8787"' "$logs/prometheus.json"; then
    scraped=1
    break
  fi
  sleep 1
done
[ "$scraped" = 1 ] || fail "Prometheus does not report both replicas up: $(cat "$logs/prometheus.json" 2>/dev/null)"
ok "Prometheus scrapes both replicas (up == 1 for compactor-1:8787 and compactor-2:8787)"

printf '\ncontainer smoke: passed in %d s\n' "$SECONDS"
