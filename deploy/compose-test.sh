#!/usr/bin/env bash
# `make compose-test`: docker-compose.yml end to end, as a user runs it, on this machine.
#
# Starts a Docker engine if none answers, builds the offline stand-in images
# (deploy/images.sh) and the paystream image, brings the compose project up with its
# defaults (only the image variables point at the stand-ins), waits for every service,
# sends signed webhooks to the published ingest port, and checks that a payment reaches
# `paid` in Postgres (published port) and that its state event is on the state topic
# (read_committed). Tears the project down on exit, failed or not
# (PAYSTREAM_COMPOSE_KEEP=1 keeps it for a look).
#
# When a service fails or never gets ready, prints its state, its last log lines and, for
# the paystream services, any PAYSTREAM_* variable it was given that its command does not
# read, with the ones it does.
#
# Needs bin/paystream (make build) for inspect, and bin/paystream-lab for loadgen.
set -euo pipefail
exec </dev/null
cd "$(dirname "${BASH_SOURCE[0]}")/.."

readonly PROJECT=${PAYSTREAM_COMPOSE_PROJECT:-paystream-composetest}
readonly READY_TIMEOUT=${PAYSTREAM_COMPOSE_TIMEOUT:-240}
readonly BIN=bin/paystream
readonly LAB_BIN=bin/paystream-lab
readonly STATE_TOPIC=paystream.payments.state.v1
readonly DB_URL="postgres://paystream:paystream@127.0.0.1:5432/paystream?sslmode=disable"
readonly PAYSTREAM_SERVICES="migrate ingest processor sink"
T0=$SECONDS

log() { printf 'compose-test: %s\n' "$*" >&2; }
fail() { printf 'compose-test: FAIL: %s\n' "$*" >&2; exit 1; }
step() { printf '\n== %s (t+%ds)\n' "$*" "$((SECONDS - T0))" >&2; }

[[ -x $BIN ]] || fail "$BIN missing: run make build"

step "engine and images"
deploy/images.sh engine
deploy/images.sh build
eval "$(deploy/images.sh env)"
export PAYSTREAM_IMAGE=paystream-local/paystream:compose-test
# deploy/images.sh prefers the docker.io client (BuildKit without the buildx plugin).
if [[ -x /usr/bin/docker ]]; then PATH="/usr/bin:$PATH"; fi

if docker compose version >/dev/null 2>&1; then
  compose() { docker compose -p "$PROJECT" "$@"; }
else
  command -v docker-compose >/dev/null 2>&1 || {
    [[ $(id -u) == 0 ]] || fail "neither 'docker compose' nor docker-compose: install one"
    log "installing docker-compose with apt-get"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker-compose >&2 ||
      { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker-compose >&2; }
  }
  compose() { docker-compose -p "$PROJECT" "$@"; }
fi
export COMPOSE_DOCKER_CLI_BUILD=1 DOCKER_BUILDKIT=1

for port in 8080 5432 29092 9090; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    fail "127.0.0.1:$port is taken (docker-compose.yml publishes it): stop what listens there"
  fi
done

# --- diagnostics -------------------------------------------------------------------------

container() { compose ps -q "$1" 2>/dev/null | head -n1; }

# state SERVICE: "running", "healthy", "exited(N)", "restarting", "unhealthy", "starting",
# "missing" ... and "+restarts" when the engine restarted it.
state() {
  local id
  id=$(container "$1")
  [[ -n $id ]] || { echo missing; return; }
  docker inspect --format \
    '{{.State.Status}}{{if .State.Health}}/{{.State.Health.Status}}{{end}} exit={{.State.ExitCode}} restarts={{.RestartCount}}' "$id"
}

# Names (never values: they hold passwords) of the PAYSTREAM_* variables a paystream
# service was given that `paystream COMMAND` does not read.
unknown_settings() {
  local svc=$1 id cmd known given name
  id=$(container "$svc") && [[ -n $id ]] || return 0
  cmd=$(docker inspect --format '{{index .Config.Cmd 0}}' "$id")
  known=$("$BIN" "$cmd" --help 2>/dev/null | grep -o '\$PAYSTREAM_[A-Z0-9_]*' | tr -d '$' | sort -u)
  given=$(docker inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "$id" | cut -d= -f1 | grep '^PAYSTREAM_' | sort -u)
  for name in $given; do
    grep -qx "$name" <<<"$known" ||
      printf '  %s: %s is not a setting of `paystream %s`; it reads: %s\n' \
        "$svc" "$name" "$cmd" "$(tr '\n' ' ' <<<"$known")"
  done
}

diagnose() {
  local svc st logs
  FAILED=""
  printf '\n== diagnosis\n' >&2
  for svc in $(compose config --services); do
    st=$(state "$svc")
    printf '%-11s %s\n' "$svc" "$st" >&2
  done
  for svc in $(compose config --services); do
    st=$(state "$svc")
    case $st in
      "running exit=0 restarts=0" | "running/healthy exit=0 restarts=0") continue ;;
      "exited exit=0 restarts=0") [[ $svc == migrate ]] && continue ;;
    esac
    [[ $st == missing ]] && continue # never created: a service it depends on failed
    FAILED+=" $svc"
    logs=$(compose logs --no-color --tail 400 "$svc" 2>&1 | grep -v '^Attaching to' || true)
    printf '\n-- %s (%s): first error lines\n' "$svc" "$st" >&2
    grep -E 'ERROR|FATAL|[A-Za-z]+Exception:|error:|paystream: ' <<<"$logs" | sort -u | head -n 8 >&2 || true
    printf -- '-- %s: last log lines\n' "$svc" >&2
    tail -n 20 <<<"$logs" >&2
  done
  local unknown=""
  for svc in $PAYSTREAM_SERVICES; do
    [[ " $FAILED " == *" $svc "* ]] && unknown+=$(unknown_settings "$svc")$'\n'
  done
  if [[ -n ${unknown//$'\n'/} ]]; then
    printf '\n-- settings the failed paystream services were given but do not read (docker-compose.yml):\n%s\n' "$unknown" >&2
  fi
}

teardown() {
  local rc=$?
  [[ -z ${up_pid:-} ]] || kill "$up_pid" 2>/dev/null || true
  rm -f "${up_log:-}"
  ((rc == 0)) || diagnose || true
  if [[ ${PAYSTREAM_COMPOSE_KEEP:-0} == 1 ]]; then
    log "kept project $PROJECT (docker-compose -p $PROJECT down -v removes it)"
  else
    step "down"
    compose down -v --remove-orphans >/dev/null 2>&1 || log "compose down failed"
  fi
  log "$( ((rc == 0)) && echo PASS || echo FAIL) in $((SECONDS - T0))s"
  exit "$rc"
}
trap teardown EXIT

# --- the run -----------------------------------------------------------------------------

step "build the paystream image"
t=$SECONDS
compose build migrate >&2 || fail "paystream image build failed"
log "paystream image built in $((SECONDS - t))s"

step "up, and wait until every service is ready (up to ${READY_TIMEOUT}s)"
# In the background: `up` itself waits for the health of the services others depend on, and
# a service that keeps failing should end the test at once, not when its health check gives up.
up_log=$(mktemp)
compose up -d --no-build >"$up_log" 2>&1 &
up_pid=$!
deadline=$((SECONDS + READY_TIMEOUT))
while :; do
  if [[ -n $up_pid ]] && ! kill -0 "$up_pid" 2>/dev/null; then
    wait "$up_pid" || { cat "$up_log" >&2; fail "docker compose up failed"; }
    cat "$up_log" >&2
    up_pid=""
  fi
  bad="" waiting=""
  for svc in $(compose config --services); do
    st=$(state "$svc")
    [[ $st == missing && -n $up_pid ]] && { waiting+=" $svc(not created yet)"; continue; }
    case $svc:$st in
      *restarts=[1-9]* | *unhealthy* | *missing* | migrate:exited\ exit=[1-9]*) bad+=" $svc($st)" ;;
      kafka:running/healthy* | postgres:running/healthy* | migrate:exited\ exit=0*) ;;
      ingest:running* | processor:running* | sink:running* | prometheus:running*) ;;
      *exited*) bad+=" $svc($st)" ;;
      *) waiting+=" $svc($st)" ;;
    esac
  done
  [[ -z $bad ]] || fail "service(s) failed:$bad"
  if [[ -z $waiting && -z $up_pid ]] && curl -fsS -o /dev/null http://127.0.0.1:8080/readyz; then break; fi
  ((SECONDS < deadline)) || fail "not ready after ${READY_TIMEOUT}s:${waiting:- ingest /readyz}"
  sleep 1
done
log "all services ready at t+$((SECONDS - T0))s"

step "send signed webhooks to 127.0.0.1:8080"
report=$("$LAB_BIN" loadgen --sources deploy/sources.example.yaml --source acme --payments 1 \
  --requests 2 --concurrency 1 --url http://127.0.0.1:8080 --quiet --json) ||
  fail "loadgen failed: $report"
echo "$report" >&2
grep -q '"errors": {}' <<<"$report" && grep -Eq '"200": 2\b' <<<"$report" ||
  fail "ingest did not answer 200 to both webhooks (report above)"

step "a payment reaches paid (Postgres on 127.0.0.1:5432)"
deadline=$((SECONDS + 60))
until row=$(compose exec -T postgres psql -U paystream -d paystream -Atc \
  "SELECT payment_key || '|' || payment_id FROM payments WHERE source = 'acme' AND status = 'paid' LIMIT 1") &&
  [[ -n $row ]]; do
  ((SECONDS < deadline)) || fail "no payment reached paid within 60s"
  sleep 1
done
key=${row%%|*} id=${row#*|}
"$BIN" inspect payment --database-url "$DB_URL" --source acme --id "$id" >&2 ||
  fail "paystream inspect against 127.0.0.1:5432 failed"

step "its state event is on $STATE_TOPIC (read_committed, via the HOST listener)"
deadline=$((SECONDS + 90))
until compose exec -T kafka /opt/kafka/bin/kafka-console-consumer.sh \
  --bootstrap-server localhost:29092 --topic "$STATE_TOPIC" --from-beginning \
  --isolation-level read_committed --property print.key=true --timeout-ms 10000 2>/dev/null |
  grep -F "$key" | grep -q '"paid"'; do
  ((SECONDS < deadline)) || fail "no paid state event for $key on $STATE_TOPIC within 90s"
done
log "state event for $key (paid) read from $STATE_TOPIC"
