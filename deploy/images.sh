#!/usr/bin/env bash
# Local stand-ins for the public images docker-compose.yml and the tests use, built offline
# (Debian's package mirror only, no Docker Hub), and a Docker engine to build and run them.
#
#   deploy/images.sh engine        start dockerd if no engine answers (idempotent)
#   deploy/images.sh build         build the stand-ins that are missing or out of date
#   deploy/images.sh build --force rebuild them all
#   eval "$(deploy/images.sh env)" point docker-compose.yml and testenv at the stand-ins
#
# Each image carries a label with the hash of its inputs (its directory under
# deploy/images/, the host's Go version and go.sum, the Kafka jars); build skips an image
# whose label matches. See deploy/README.md, "Docker".
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly SCRIPT_DIR REPO_DIR="${SCRIPT_DIR%/deploy}"
: "${HOME:=$(getent passwd "$(id -u)" | cut -d: -f6)}"
CACHE_DIR="${PAYSTREAM_CACHE_DIR:-$HOME/.cache/paystream}"
readonly DOCKER_DIR="$CACHE_DIR/docker"
readonly MIRROR="${PAYSTREAM_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
readonly KAFKA_VERSION=4.1.1
readonly KAFKA_HOME="$CACHE_DIR/kafka-$KAFKA_VERSION" # deploy/stack.sh's jar cache
readonly LABEL=io.paystream.inputs

readonly BASE_IMAGE=paystream-local/debian:bookworm
readonly POSTGRES_IMAGE=paystream-local/postgres:15
readonly KAFKA_IMAGE=paystream-local/kafka:$KAFKA_VERSION
readonly GO_IMAGE=paystream-local/golang:1.26
readonly RUNTIME_IMAGE=paystream-local/runtime:bookworm
readonly PROMETHEUS_IMAGE=paystream-local/prometheus:2

log() { printf 'images: %s\n' "$*" >&2; }
die() { printf 'images: error: %s\n' "$*" >&2; exit 1; }

# The docker.io package's client talks BuildKit without the buildx plugin, which a newer
# client on PATH (e.g. /usr/local/bin/docker) may lack; deploy/Dockerfile needs BuildKit.
if [[ -x /usr/bin/docker ]]; then PATH="/usr/bin:$PATH"; fi

apt_install() {
  [[ $(id -u) == 0 ]] || die "$* missing and not root: apt-get install $*"
  log "installing $* with apt-get (after apt-get update: a fresh machine has no package lists)"
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -q && apt-get install -y -q "$@"; } </dev/null >&2 ||
    die "apt-get install $* failed"
}

engine_answers() { timeout 10 docker info >/dev/null 2>&1; }

cmd_engine() {
  command -v dockerd >/dev/null 2>&1 || apt_install docker.io
  if engine_answers; then log "engine: answering ($(docker info --format '{{.ServerVersion}}' 2>/dev/null))"; return 0; fi
  [[ -z ${DOCKER_HOST:-} ]] || die "DOCKER_HOST=$DOCKER_HOST does not answer; start that engine or unset DOCKER_HOST"
  [[ $(id -u) == 0 ]] || die "no Docker engine answers and dockerd needs root: start Docker, then retry"
  mkdir -p "$DOCKER_DIR"
  log "engine: starting dockerd (data $DOCKER_DIR/root, log $DOCKER_DIR/dockerd.log)"
  # setsid: its own session, so it outlives this script (and make); no stdin, no caller's pipes.
  setsid dockerd --data-root "$DOCKER_DIR/root" --host unix:///var/run/docker.sock \
    --pidfile "$DOCKER_DIR/dockerd.pid" </dev/null >>"$DOCKER_DIR/dockerd.log" 2>&1 &
  local deadline=$((SECONDS + 60))
  until engine_answers; do
    if ((SECONDS >= deadline)) || ! kill -0 $! 2>/dev/null; then
      tail -n 20 "$DOCKER_DIR/dockerd.log" >&2
      die "dockerd did not answer within 60s (log: $DOCKER_DIR/dockerd.log)"
    fi
    sleep 0.5
  done
  log "engine: dockerd $(docker info --format '{{.ServerVersion}}') answering (pid $(<"$DOCKER_DIR/dockerd.pid"))"
}

# Stops the dockerd that `engine` started (by its pid file), never another one.
cmd_engine_down() {
  local pid
  pid=$(cat "$DOCKER_DIR/dockerd.pid" 2>/dev/null) || { log "engine: none started by this script"; return 0; }
  [[ $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) == *"--data-root $DOCKER_DIR/root"* ]] ||
    { log "engine: pid $pid is not our dockerd; left alone"; return 0; }
  kill "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
  log "engine: dockerd stopped"
}

# hash_inputs FILE_OR_DIR... : one hash over the files' names and contents.
hash_inputs() {
  find "$@" -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16
}

image_inputs() { docker image inspect --format "{{ index .Config.Labels \"$LABEL\" }}" "$1" 2>/dev/null || true; }

# up_to_date IMAGE HASH: the image exists with that inputs label and --force was not given.
up_to_date() {
  ((FORCE == 0)) && [[ $(image_inputs "$1") == "$2" ]] && log "$1: up to date" && return 0
  return 1
}

# build IMAGE HASH CONTEXT_DIR: docker build with the base image and the inputs label.
build() {
  local image=$1 hash=$2 ctx=$3 t0=$SECONDS
  log "$image: building"
  DOCKER_BUILDKIT=0 docker build -q --build-arg "BASE_IMAGE=$BASE_IMAGE" --label "$LABEL=$hash" \
    -t "$image" "$ctx" >/dev/null || die "$image: docker build failed"
  log "$image: built in $((SECONDS - t0))s"
}

build_base() {
  local hash
  hash=$(printf 'debootstrap minbase bookworm %s' "$MIRROR" | sha256sum | cut -c1-16)
  up_to_date "$BASE_IMAGE" "$hash" && return 0
  command -v debootstrap >/dev/null 2>&1 || apt_install debootstrap
  local root t0=$SECONDS
  mkdir -p "$CACHE_DIR/images"
  root=$(mktemp -d "$CACHE_DIR/images/rootfs.XXXXXX")
  log "$BASE_IMAGE: debootstrap --variant=minbase bookworm from $MIRROR"
  if ! debootstrap --variant=minbase bookworm "$root" "$MIRROR" >"$root.log" 2>&1; then
    tail -n 20 "$root.log" >&2; die "debootstrap failed (log: $root.log)"
  fi
  printf 'deb %s bookworm main\ndeb %s bookworm-updates main\n' "$MIRROR" "$MIRROR" >"$root/etc/apt/sources.list"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | docker import --change "LABEL $LABEL=$hash" --change 'CMD ["bash"]' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    - "$BASE_IMAGE" >/dev/null || die "docker import failed"
  rm -rf "$root" "$root.log"
  log "$BASE_IMAGE: built in $((SECONDS - t0))s"
}

# The jars deploy/stack.sh runs Kafka from; fetched the same way, into the same cache,
# when stack.sh has not done it yet.
ensure_kafka_jars() {
  local pom="$SCRIPT_DIR/kafka/pom.xml" want
  want="kafka=$KAFKA_VERSION pom=$(sha256sum "$pom" | cut -d' ' -f1)"
  [[ -f $KAFKA_HOME/.complete && $(<"$KAFKA_HOME/.complete") == "$want" ]] && return 0
  command -v mvn >/dev/null 2>&1 || apt_install maven
  local tmp
  mkdir -p "$CACHE_DIR"
  tmp=$(mktemp -d "$CACHE_DIR/.kafka-$KAFKA_VERSION.XXXXXX")
  log "kafka: fetching Apache Kafka $KAFKA_VERSION jars from Maven Central (one-time)"
  (cd "$tmp" && mvn -q -B -f "$pom" dependency:copy-dependencies -DoutputDirectory="$tmp/libs" \
    -DincludeScope=runtime </dev/null >"$tmp/mvn.log" 2>&1) ||
    { tail -n 30 "$tmp/mvn.log" >&2; die "mvn failed (log: $tmp/mvn.log)"; }
  rm -rf "$KAFKA_HOME" && mkdir -p "$KAFKA_HOME" && mv "$tmp/libs" "$KAFKA_HOME/libs"
  cp "$pom" "$KAFKA_HOME/pom.xml" && echo "$want" >"$KAFKA_HOME/.complete" && rm -rf "$tmp"
}

# A build context: deploy/images/NAME plus extra files, in a scratch dir removed on exit.
context() {
  local ctx
  ctx=$(mktemp -d "$CACHE_DIR/images/ctx.XXXXXX")
  CLEANUP+=("$ctx")
  cp -a "$SCRIPT_DIR/images/$1/." "$ctx/"
  echo "$ctx"
}

build_simple() { # IMAGE DIR
  local hash
  hash=$(hash_inputs "$SCRIPT_DIR/images/$2")
  up_to_date "$1" "$hash" || build "$1" "$hash" "$(context "$2")"
}

build_kafka() {
  ensure_kafka_jars
  local hash ctx
  hash=$(hash_inputs "$SCRIPT_DIR/images/kafka" "$KAFKA_HOME/.complete")
  up_to_date "$KAFKA_IMAGE" "$hash" && return 0
  ctx=$(context kafka)
  cp -a "$KAFKA_HOME/libs" "$ctx/libs"
  build "$KAFKA_IMAGE" "$hash" "$ctx"
}

# The Go builder: the host's toolchain plus, as a file:// module proxy, the host's module
# cache entries for every module in go.sum (downloaded on the host first).
build_go() {
  command -v go >/dev/null 2>&1 || PATH="/usr/local/go/bin:$PATH"
  command -v go >/dev/null 2>&1 || die "go not found: the Go builder image copies the host's toolchain"
  local goroot modcache hash ctx
  goroot=$(go env GOROOT) modcache=$(go env GOMODCACHE)
  hash=$( { go version; cat "$REPO_DIR/go.sum"; hash_inputs "$SCRIPT_DIR/images/go"; } | sha256sum | cut -c1-16)
  up_to_date "$GO_IMAGE" "$hash" && return 0
  (cd "$REPO_DIR" && go mod download) || die "go mod download failed on the host"
  ctx=$(context go)
  cp -a "$goroot" "$ctx/goroot"
  local mod ver rest esc src dst n=0
  while read -r mod ver rest; do
    ver=${ver%/go.mod}
    esc=$(sed -E 's/([A-Z])/!\L\1/g' <<<"$mod")
    src="$modcache/cache/download/$esc/@v" dst="$ctx/goproxy/$esc/@v"
    mkdir -p "$dst"
    for f in "$ver.info" "$ver.mod" "$ver.zip"; do
      [[ -f $src/$f && ! -f $dst/$f ]] && cp "$src/$f" "$dst/$f" && n=$((n + 1))
    done
  done <"$REPO_DIR/go.sum"
  log "$GO_IMAGE: $(go version | cut -d' ' -f3) and $n module files from $modcache"
  build "$GO_IMAGE" "$hash" "$ctx"
}

cmd_build() {
  FORCE=0
  [[ ${1:-} == --force ]] && FORCE=1
  CLEANUP=()
  trap 'rm -rf "${CLEANUP[@]}"' EXIT
  engine_answers || die "no Docker engine answers (deploy/images.sh engine starts one)"
  local t0=$SECONDS
  build_base
  build_simple "$POSTGRES_IMAGE" postgres
  build_kafka
  build_go
  build_simple "$RUNTIME_IMAGE" runtime
  build_simple "$PROMETHEUS_IMAGE" prometheus
  log "stand-ins ready in $((SECONDS - t0))s"
}

cmd_env() {
  cat <<EOF
export PAYSTREAM_KAFKA_IMAGE=$KAFKA_IMAGE
export PAYSTREAM_POSTGRES_IMAGE=$POSTGRES_IMAGE
export PAYSTREAM_GO_IMAGE=$GO_IMAGE
export PAYSTREAM_RUNTIME_IMAGE=$RUNTIME_IMAGE
export PAYSTREAM_PROMETHEUS_IMAGE=$PROMETHEUS_IMAGE
export PAYSTREAM_TEST_KAFKA_IMAGE=$KAFKA_IMAGE
export PAYSTREAM_TEST_POSTGRES_IMAGE=$POSTGRES_IMAGE
# testcontainers' reaper image (Ryuk) can't be pulled either; testenv stops its containers.
export TESTCONTAINERS_RYUK_DISABLED=true
EOF
}

usage() {
  cat >&2 <<'EOF'
usage: deploy/images.sh COMMAND
  engine           start dockerd if no Docker engine answers (data and log under
                   ~/.cache/paystream/docker), installing docker.io if needed
  engine-down      stop the dockerd that `engine` started
  build [--force]  build the offline stand-in images that are missing or out of date
  env              print export lines: eval "$(deploy/images.sh env)"
EOF
}

case ${1:-} in
  engine) cmd_engine ;;
  engine-down) cmd_engine_down ;;
  build) shift; cmd_build "$@" ;;
  env) cmd_env ;;
  -h | --help | help) usage ;;
  *) usage; exit 2 ;;
esac
