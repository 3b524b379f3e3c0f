#!/usr/bin/env bash
# paystream local stack without Docker: a private PostgreSQL cluster (Debian packages)
# and a single-node Apache Kafka broker in KRaft mode (jars from Maven Central).
#
#   deploy/stack.sh up | down [--purge] | status | env | kafka-version
#   deploy/stack.sh restart-kafka | restart-postgres | kill-kafka | start-kafka
#   deploy/stack.sh stop-postgres | start-postgres
#   deploy/stack.sh kafka-topics ARGS...   (org.apache.kafka.tools.TopicCommand)
#   deploy/stack.sh kafka-tool MAIN_CLASS ARGS...
#
# Progress goes to stderr; `up` and `env` print only `export NAME=value` lines on stdout,
# so `eval "$(deploy/stack.sh up)"` works. See deploy/README.md.
set -euo pipefail

readonly KAFKA_VERSION=4.1.1
: "${HOME:=$(getent passwd "$(id -u)" | cut -d: -f6)}"
# libpq variables from the caller's shell must not redirect our psql/pg_ctl calls.
unset PGHOST PGHOSTADDR PGPORT PGUSER PGDATABASE PGSERVICE PGSSLMODE PGOPTIONS PGDATA
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly SCRIPT_DIR

CACHE_DIR="${PAYSTREAM_CACHE_DIR:-$HOME/.cache/paystream}"
STACK_DIR="${PAYSTREAM_STACK_DIR:-$HOME/.cache/paystream/stack}"
PG_PORT="${PAYSTREAM_STACK_PG_PORT:-55432}"
KAFKA_PORT="${PAYSTREAM_STACK_KAFKA_PORT:-59092}"
KAFKA_CONTROLLER_PORT="${PAYSTREAM_STACK_KAFKA_CONTROLLER_PORT:-$((KAFKA_PORT + 1))}"
KAFKA_HEAP_OPTS="${PAYSTREAM_STACK_KAFKA_HEAP_OPTS:--Xms256m -Xmx1g}"
KAFKA_SESSION_TIMEOUT_MS="${PAYSTREAM_STACK_KAFKA_SESSION_TIMEOUT_MS:-9000}"
READY_TIMEOUT="${PAYSTREAM_STACK_TIMEOUT:-120}"

# Absolute paths: the broker and postgres must not depend on the caller's cwd.
case "$CACHE_DIR" in /*) ;; *) CACHE_DIR="$PWD/$CACHE_DIR" ;; esac
case "$STACK_DIR" in /*) ;; *) STACK_DIR="$PWD/$STACK_DIR" ;; esac

readonly KAFKA_HOME="$CACHE_DIR/kafka-$KAFKA_VERSION"
readonly KAFKA_LIBS="$KAFKA_HOME/libs"
readonly KAFKA_MARKER="$KAFKA_HOME/.complete"
readonly KAFKA_POM="$SCRIPT_DIR/kafka/pom.xml"

readonly PG_DIR="$STACK_DIR/postgres"
readonly PGDATA="$PG_DIR/data"
readonly PG_SOCKET_DIR="$PG_DIR/run"
readonly PG_LOG_DIR="$PG_DIR/log"
readonly PG_LOG="$PG_LOG_DIR/postgres.log"

readonly K_DIR="$STACK_DIR/kafka"
readonly K_DATA="$K_DIR/data"
readonly K_CONF_DIR="$K_DIR/config"
readonly K_CONF="$K_CONF_DIR/server.properties"
readonly K_LOG4J="$K_CONF_DIR/log4j2.xml"
readonly K_TOOLS_LOG4J="$K_CONF_DIR/tools-log4j2.xml"
readonly K_LOG_DIR="$K_DIR/logs"
readonly K_LOG="$K_LOG_DIR/server.log"
readonly K_STDOUT="$K_LOG_DIR/kafka.out"
readonly K_PIDFILE="$K_DIR/kafka.pid"
readonly K_CLUSTER_ID_FILE="$K_DIR/cluster.id"
readonly K_RUNNING_VERSION="$K_DIR/running.version"

DB_URL="postgres://paystream@127.0.0.1:${PG_PORT}/paystream?sslmode=disable"
BROKERS="127.0.0.1:${KAFKA_PORT}"

# --------------------------------------------------------------------------- helpers

log() { printf '[stack] %s\n' "$*" >&2; }
die() { printf '[stack] ERROR: %s\n' "$*" >&2; exit 1; }
is_root() { [[ $(id -u) -eq 0 ]]; }

# Block until nobody else mutates the stack (tests may call restart-* concurrently).
# fd 9 is closed for every daemon we start, so they never inherit the lock.
take_lock() {
  mkdir -p "$STACK_DIR"
  exec 9>>"$STACK_DIR/.lock"
  flock -w 600 9 || die "could not lock $STACK_DIR/.lock within 600s"
}

# Prefix for `bash -c` that closes every inherited fd above 2 before exec'ing a daemon, so
# no caller's pipe (CI runner, $(...) capture) or our lock stays open in postgres/java.
# shellcheck disable=SC2016 # expanded by the inner bash
readonly CLOSE_FDS='for f in /proc/$$/fd/*; do n=${f##*/}; if ((n > 2)); then eval "exec $n>&-"; fi; done 2>/dev/null; '

port_open() { timeout 1 bash -c ">/dev/tcp/127.0.0.1/$1" 2>/dev/null; }

# apt-get install, retrying after `apt-get update` (fresh images have no package lists).
try_apt_install() {
  is_root || return 1
  log "installing $* with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends "$@" </dev/null >&2 2>&1 9>&- && return 0
  apt-get update -q </dev/null >&2 2>&1 9>&- &&
    apt-get install -y -q --no-install-recommends "$@" </dev/null >&2 2>&1 9>&-
}

apt_install() {
  is_root || die "$* missing and not root: install it (apt-get install $*) and retry"
  try_apt_install "$@" || die "apt-get install $* failed"
}

# ------------------------------------------------------------------------ postgres

pg_bin_dir() {
  local want="" d
  [[ -f $PGDATA/PG_VERSION ]] && want=$(<"$PGDATA/PG_VERSION")
  if [[ -n $want && -x /usr/lib/postgresql/$want/bin/initdb ]]; then
    echo "/usr/lib/postgresql/$want/bin"; return 0
  fi
  d=$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V | tail -n1)
  [[ -n $d && -x $d/initdb ]] || return 1
  [[ -z $want ]] || die "cluster in $PGDATA is PostgreSQL $want but only $d is installed (down --purge to recreate)"
  echo "$d"
}

ensure_pg_installed() {
  if ! pg_bin_dir >/dev/null; then
    apt_install postgresql
    pg_bin_dir >/dev/null || die "postgresql installed but /usr/lib/postgresql/*/bin/initdb not found"
  fi
  PG_BIN=$(pg_bin_dir)
}

# Run a postgres binary as the cluster owner. As root that is the `postgres` OS user
# (postgres refuses to run as root); otherwise the calling user.
as_pg() {
  if is_root; then (cd / && runuser -u postgres -- "$@"); else "$@"; fi
}

ensure_pg_user() {
  is_root || return 0
  id -u postgres >/dev/null 2>&1 && return 0
  log "creating OS user postgres"
  useradd --system --user-group --home-dir /var/lib/postgresql --shell /bin/bash postgres \
    || die "could not create the postgres OS user"
}

# The postgres user needs search (x) permission on every parent of the stack dir;
# as root $HOME is usually /root with mode 0700. Grant exactly that: an ACL for the
# postgres user when possible, otherwise o+x (search only, no listing).
ensure_pg_can_reach() {
  is_root || return 0
  local path="" part parts
  IFS=/ read -r -a parts <<<"${PG_DIR#/}"
  # fix from the top down: a component is only testable once its parents are reachable
  for part in "${parts[@]}"; do
    path="$path/$part"
    [[ -d $path ]] || break
    runuser -u postgres -- test -x "$path" 2>/dev/null && continue
    command -v setfacl >/dev/null 2>&1 || try_apt_install acl || true
    if command -v setfacl >/dev/null 2>&1 && setfacl -m u:postgres:x "$path" 2>/dev/null; then
      log "granted the postgres user search permission on $path (setfacl -m u:postgres:x)"
    else
      chmod o+x "$path"
      log "granted search permission on $path (chmod o+x) so the postgres user can reach $PG_DIR"
    fi
  done
}

pg_running() { [[ -f $PGDATA/postmaster.pid ]] && as_pg "$PG_BIN/pg_ctl" -D "$PGDATA" status >/dev/null 2>&1; }

pg_psql() { "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U paystream "$@"; }

pg_write_conf() {
  local sockdir="$PG_SOCKET_DIR"
  # unix socket paths are limited to ~107 bytes; fall back to TCP only.
  ((${#sockdir} + 20 < 100)) || sockdir=""
  cat >"$PGDATA/paystream.conf" <<EOF
# Written by deploy/stack.sh on every start; edit the script, not this file.
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$sockdir'
max_connections = 300
shared_buffers = 256MB
# durability settings (fsync, synchronous_commit, full_page_writes) stay at defaults:
# the reliability tests depend on them.
# The sink relays state events from a logical replication slot (pg_logical_emit_message).
wal_level = logical
max_replication_slots = 64
max_wal_senders = 64
# A relay down for long makes the slot hold WAL; past this the slot is invalidated
# (the relay then stops and says so) instead of filling the disk.
max_slot_wal_keep_size = 2GB
timezone = 'UTC'
log_timezone = 'UTC'
logging_collector = off
log_line_prefix = '%m [%p] %q%u@%d '
EOF
  if is_root; then chown postgres: "$PGDATA/paystream.conf"; fi
}

pg_init() {
  [[ -f $PGDATA/PG_VERSION ]] && return 0
  log "initdb: new PostgreSQL cluster in $PGDATA"
  rm -rf "$PGDATA"
  mkdir -p "$PGDATA"
  chmod 0700 "$PGDATA"
  if is_root; then chown -R postgres: "$PG_DIR"; fi
  as_pg "$PG_BIN/initdb" -D "$PGDATA" --username=paystream --auth=trust \
    --encoding=UTF8 --locale=C >>"$PG_LOG" 2>&1 9>&- \
    || { tail -n 30 "$PG_LOG" >&2; die "initdb failed (log: $PG_LOG)"; }
  cat >"$PGDATA/pg_hba.conf" <<'EOF'
# deploy/stack.sh: loopback only, trust (a throwaway test cluster)
local   all             all                                     trust
host    all             all             127.0.0.1/32            trust
host    replication     all             127.0.0.1/32            trust
EOF
  echo "include_if_exists = 'paystream.conf'" >>"$PGDATA/postgresql.conf"
  if is_root; then chown postgres: "$PGDATA/pg_hba.conf" "$PGDATA/postgresql.conf"; fi
}

pg_start() {
  if pg_running; then
    # A cluster started by an older stack.sh runs without logical decoding: restart it
    # once with the settings above (wal_level needs a restart).
    if [[ $(pg_psql -d postgres -tAc 'show wal_level' 2>/dev/null) == logical ]]; then
      log "postgres: already running on 127.0.0.1:$PG_PORT"
      return 0
    fi
    log "postgres: running without wal_level=logical; restarting it with the stack's settings"
    pg_stop
  fi
  if port_open "$PG_PORT"; then
    die "port 127.0.0.1:$PG_PORT is taken by another process; set PAYSTREAM_STACK_PG_PORT"
  fi
  pg_write_conf
  log "postgres: starting on 127.0.0.1:$PG_PORT"
  as_pg bash -c "$CLOSE_FDS"'exec "$@"' pg_ctl \
    "$PG_BIN/pg_ctl" -D "$PGDATA" -l "$PG_LOG" -w -t "$READY_TIMEOUT" start \
    </dev/null >/dev/null 2>&1 9>&- \
    || { tail -n 40 "$PG_LOG" >&2; die "postgres did not start within ${READY_TIMEOUT}s (log: $PG_LOG)"; }
  pg_wait_ready
}

pg_wait_ready() {
  local deadline=$((SECONDS + READY_TIMEOUT))
  until pg_psql -d postgres -tAc 'select 1' >/dev/null 2>&1; do
    ((SECONDS < deadline)) || { tail -n 40 "$PG_LOG" >&2; die "postgres not accepting connections after ${READY_TIMEOUT}s (log: $PG_LOG)"; }
    sleep 0.2
  done
  if [[ $(pg_psql -d postgres -tAc "select 1 from pg_database where datname = 'paystream'") != 1 ]]; then
    log "postgres: creating database paystream"
    pg_psql -d postgres -c 'CREATE DATABASE paystream OWNER paystream' >/dev/null
  fi
}

pg_stop() {
  pg_running || { log "postgres: not running"; return 0; }
  log "postgres: stopping"
  as_pg "$PG_BIN/pg_ctl" -D "$PGDATA" -m fast -w -t 60 stop >/dev/null 2>&1 9>&- && return 0
  log "postgres: fast shutdown timed out, using immediate"
  as_pg "$PG_BIN/pg_ctl" -D "$PGDATA" -m immediate -w -t 30 stop >/dev/null 2>&1 9>&- && return 0
  local pid
  pid=$(head -n1 "$PGDATA/postmaster.pid" 2>/dev/null || true)
  [[ $pid =~ ^[0-9]+$ ]] && kill -KILL "$pid" 2>/dev/null || true
  sleep 1
  ! pg_running || die "could not stop postgres (pid ${pid:-?})"
}

pg_up() {
  ensure_pg_installed
  ensure_pg_user
  mkdir -p "$PG_DIR" "$PG_SOCKET_DIR" "$PG_LOG_DIR"
  if is_root; then chown postgres: "$PG_DIR" "$PG_SOCKET_DIR" "$PG_LOG_DIR"; touch "$PG_LOG"; chown postgres: "$PG_LOG"; fi
  ensure_pg_can_reach
  pg_init
  pg_start
}

# --------------------------------------------------------------------------- kafka

find_java() {
  if [[ -n ${JAVA_HOME:-} && -x $JAVA_HOME/bin/java ]]; then echo "$JAVA_HOME/bin/java"; return 0; fi
  command -v java
}

java_major() { "$1" -version 2>&1 | sed -n 's/.*version "\([0-9][0-9]*\)[."].*/\1/p' | head -n1; }

ensure_java() {
  JAVA=$(find_java || true)
  if [[ -z $JAVA ]]; then
    apt_install openjdk-17-jre-headless
    JAVA=$(find_java) || die "java not found after installing openjdk-17-jre-headless"
  fi
  local major
  major=$(java_major "$JAVA")
  [[ -n $major && $major -ge 17 ]] || die "Kafka $KAFKA_VERSION needs Java 17+, $JAVA is '${major:-unknown}' (set JAVA_HOME)"
}

pom_sum() { sha256sum "$KAFKA_POM" | cut -d' ' -f1; }

ensure_kafka_jars() {
  [[ -f $KAFKA_POM ]] || die "missing $KAFKA_POM"
  local want
  want="kafka=$KAFKA_VERSION pom=$(pom_sum)"
  if [[ -f $KAFKA_MARKER && $(<"$KAFKA_MARKER") == "$want" ]] && compgen -G "$KAFKA_LIBS/kafka_2.13-*.jar" >/dev/null; then
    return 0
  fi
  command -v mvn >/dev/null 2>&1 || apt_install maven
  mkdir -p "$CACHE_DIR"
  local tmp
  tmp=$(mktemp -d "$CACHE_DIR/.kafka-$KAFKA_VERSION.XXXXXX")
  cp "$KAFKA_POM" "$tmp/pom.xml"
  log "kafka: fetching Apache Kafka $KAFKA_VERSION jars from Maven Central (one-time, ~1 min)"
  local t0=$SECONDS
  if ! (cd "$tmp" && mvn -q -B -Dstyle.color=never -f "$tmp/pom.xml" \
      dependency:copy-dependencies -DoutputDirectory="$tmp/libs" -DincludeScope=runtime \
      </dev/null >"$tmp/mvn.log" 2>&1 9>&-); then
    tail -n 40 "$tmp/mvn.log" >&2
    die "mvn dependency:copy-dependencies failed (full log: $tmp/mvn.log)"
  fi
  compgen -G "$tmp/libs/kafka_2.13-$KAFKA_VERSION.jar" >/dev/null || die "kafka_2.13-$KAFKA_VERSION.jar missing after mvn (see $tmp)"
  rm -rf "$KAFKA_HOME.old"
  [[ -e $KAFKA_HOME ]] && mv "$KAFKA_HOME" "$KAFKA_HOME.old"
  mkdir -p "$KAFKA_HOME"
  mv "$tmp/libs" "$KAFKA_LIBS"
  cp "$KAFKA_POM" "$KAFKA_HOME/pom.xml"
  echo "$want" >"$KAFKA_MARKER"
  rm -rf "$tmp" "$KAFKA_HOME.old"
  local jars=("$KAFKA_LIBS"/*.jar)
  log "kafka: ${#jars[@]} jars ($(du -sh "$KAFKA_LIBS" | cut -f1)) cached in $KAFKA_LIBS in $((SECONDS - t0))s"
}

# Version of the jars in the cache (from the jar file name), empty if not fetched.
cached_kafka_version() {
  local j
  j=$(compgen -G "$KAFKA_LIBS/kafka_2.13-*.jar" | head -n1) || true
  [[ -n $j ]] || return 0
  j=${j##*/kafka_2.13-}
  echo "${j%.jar}"
}

kafka_pid() {
  local pid
  pid=$(cat "$K_PIDFILE" 2>/dev/null) || return 1
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  # the pid must still be *our* broker (pid reuse, zombies have an empty cmdline)
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "kafka.Kafka $K_CONF" || return 1
  echo "$pid"
}

kafka_running() { kafka_pid >/dev/null; }

kafka_write_config() {
  mkdir -p "$K_DATA" "$K_CONF_DIR" "$K_LOG_DIR"
  cat >"$K_CONF" <<EOF
# Written by deploy/stack.sh on every start; edit the script, not this file.
# Single node, KRaft combined mode (broker + controller), loopback only.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$KAFKA_CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
log.dirs=$K_DATA

num.partitions=3
default.replication.factor=1
min.insync.replicas=1
auto.create.topics.enable=true
delete.topic.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=10
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
# After a SIGKILL (kill-kafka) the restarted broker cannot register until the killed
# incarnation's session expires, so kill+start takes about this long. Shorter sessions
# get a live broker fenced on a starved CI box (seen at 6 s with load average 36 on 2 CPUs).
broker.session.timeout.ms=$KAFKA_SESSION_TIMEOUT_MS
broker.heartbeat.interval.ms=$((KAFKA_SESSION_TIMEOUT_MS / 3 < 2000 ? KAFKA_SESSION_TIMEOUT_MS / 3 : 2000))
log.retention.hours=168
num.recovery.threads.per.data.dir=2
EOF
  cat >"$K_LOG4J" <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<!-- Written by deploy/stack.sh: broker logs go to $K_LOG, never the console. -->
<Configuration status="WARN">
  <Appenders>
    <RollingFile name="server" fileName="$K_LOG" filePattern="$K_LOG.%i">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
      <Policies><SizeBasedTriggeringPolicy size="64 MB"/></Policies>
      <DefaultRolloverStrategy max="4"/>
    </RollingFile>
  </Appenders>
  <Loggers>
    <Logger name="kafka.request.logger" level="WARN"/>
    <Logger name="state.change.logger" level="WARN"/>
    <Logger name="kafka.log.LogCleaner" level="WARN"/>
    <Root level="INFO"><AppenderRef ref="server"/></Root>
  </Loggers>
</Configuration>
EOF
  cat >"$K_TOOLS_LOG4J" <<'EOF'
<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="WARN">
  <Appenders><Console name="stderr" target="SYSTEM_ERR"><PatternLayout pattern="%p %m (%c)%n"/></Console></Appenders>
  <Loggers><Root level="WARN"><AppenderRef ref="stderr"/></Root></Loggers>
</Configuration>
EOF
}

# Run a Kafka CLI main class from the cached jars (logging: warnings to stderr).
kafka_java_tool() {
  "$JAVA" -Xmx512m -Djava.awt.headless=true -Dlog4j2.configurationFile="$K_TOOLS_LOG4J" \
    -cp "$KAFKA_LIBS/*" "$@"
}

kafka_format() {
  [[ -f $K_DATA/meta.properties ]] && return 0
  local cid
  if [[ ! -s $K_CLUSTER_ID_FILE ]]; then
    # a Kafka Uuid: 16 random bytes, url-safe base64 without padding
    head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n' >"$K_CLUSTER_ID_FILE"
  fi
  cid=$(<"$K_CLUSTER_ID_FILE")
  log "kafka: formatting storage in $K_DATA (cluster id $cid)"
  kafka_java_tool kafka.tools.StorageTool format -t "$cid" -c "$K_CONF" --ignore-formatted \
    </dev/null >>"$K_STDOUT" 2>&1 9>&- \
    || { tail -n 30 "$K_STDOUT" >&2; die "kafka storage format failed (log: $K_STDOUT)"; }
}

kafka_start() {
  if kafka_running; then log "kafka: already running on $BROKERS (pid $(kafka_pid))"; return 0; fi
  ensure_java
  ensure_kafka_jars
  kafka_write_config
  local p
  for p in "$KAFKA_PORT" "$KAFKA_CONTROLLER_PORT"; do
    port_open "$p" && die "port 127.0.0.1:$p is taken by another process; set PAYSTREAM_STACK_KAFKA_PORT / PAYSTREAM_STACK_KAFKA_CONTROLLER_PORT"
  done
  kafka_format
  # remember where this start's log lines begin
  local log_offset=0
  [[ -f $K_LOG ]] && log_offset=$(stat -c %s "$K_LOG")
  rm -f "$K_RUNNING_VERSION" "$K_PIDFILE"
  log "kafka: starting Apache Kafka $(cached_kafka_version) (KRaft) on $BROKERS"
  # setsid: own session, survives the caller; the inner bash records its pid and execs java.
  # shellcheck disable=SC2086,SC2016 # KAFKA_HEAP_OPTS is a list of JVM flags; $$ is the inner bash's
  setsid bash -c "$CLOSE_FDS"'echo $$ >"$0"; exec "$@"' "$K_PIDFILE" \
    "$JAVA" $KAFKA_HEAP_OPTS -server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
    -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent -XX:+ExitOnOutOfMemoryError \
    -Djava.awt.headless=true -Dkafka.logs.dir="$K_LOG_DIR" -Dlog4j2.configurationFile="$K_LOG4J" \
    -cp "$KAFKA_LIBS/*" kafka.Kafka "$K_CONF" \
    </dev/null >>"$K_STDOUT" 2>&1 9>&- &
  kafka_wait_ready "$log_offset"
}

# Ready = the PLAINTEXT port accepts connections AND the broker logged "Kafka Server
# started" (KafkaRaftServer logs it after the broker is unfenced and serving metadata).
kafka_wait_ready() {
  local offset=$1 deadline=$((SECONDS + READY_TIMEOUT)) pid="" new
  while :; do
    pid=$(kafka_pid || true)
    if [[ -z $pid && -s $K_PIDFILE ]] && ! proc_alive "$(<"$K_PIDFILE")"; then
      tail -n 40 "$K_STDOUT" >&2 || true; tail -n 40 "$K_LOG" >&2 || true
      die "kafka exited during startup (logs: $K_LOG, $K_STDOUT)"
    fi
    if [[ -n $pid ]] && port_open "$KAFKA_PORT"; then
      # log rotated since we noted the offset -> read it from the start
      (($(stat -c %s "$K_LOG" 2>/dev/null || echo 0) >= offset)) || offset=0
      new=$(tail -c +"$((offset + 1))" "$K_LOG" 2>/dev/null || true)
      if grep -q 'Kafka Server started' <<<"$new"; then
        sed -n 's/.*Kafka version: \([^ ]*\).*/\1/p' <<<"$new" | tail -n1 >"$K_RUNNING_VERSION"
        [[ -s $K_RUNNING_VERSION ]] || cached_kafka_version >"$K_RUNNING_VERSION"
        log "kafka: ready on $BROKERS (Apache Kafka $(<"$K_RUNNING_VERSION"), pid $pid)"
        return 0
      fi
    fi
    if ((SECONDS >= deadline)); then
      tail -n 40 "$K_LOG" >&2 || true
      die "kafka not ready after ${READY_TIMEOUT}s (logs: $K_LOG, $K_STDOUT)"
    fi
    sleep 0.25
  done
}

# alive = exists and is not a zombie (an unreaped zombie holds no ports or files)
proc_alive() {
  local state
  state=$(sed -n 's/^[0-9]* (.*) \([A-Za-z]\) .*/\1/p' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n $state && $state != Z && $state != X ]]
}

kafka_wait_exit() {
  local pid=$1 deadline=$((SECONDS + $2))
  while proc_alive "$pid"; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
  return 0
}

kafka_stop() {
  local pid
  pid=$(kafka_pid) || { log "kafka: not running"; rm -f "$K_PIDFILE" "$K_RUNNING_VERSION"; return 0; }
  log "kafka: stopping (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  if ! kafka_wait_exit "$pid" 60; then
    log "kafka: no exit 60s after SIGTERM, sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    kafka_wait_exit "$pid" 30 || die "kafka (pid $pid) did not die"
  fi
  rm -f "$K_PIDFILE" "$K_RUNNING_VERSION"
}

kafka_kill() {
  local pid
  pid=$(kafka_pid) || { log "kafka: not running"; return 0; }
  log "kafka: SIGKILL pid $pid"
  kill -KILL "$pid" 2>/dev/null || true
  kafka_wait_exit "$pid" 30 || die "kafka (pid $pid) did not die"
  rm -f "$K_PIDFILE" "$K_RUNNING_VERSION"
}

# ------------------------------------------------------------------------ commands

print_env() {
  printf 'export %s=%s\n' \
    PAYSTREAM_TEST_DATABASE_URL "$DB_URL" \
    PAYSTREAM_TEST_KAFKA_BROKERS "$BROKERS" \
    PAYSTREAM_DATABASE_URL "$DB_URL" \
    PAYSTREAM_KAFKA_BROKERS "$BROKERS"
}

cmd_up() {
  take_lock
  pg_up
  kafka_start
  log "stack up (${SECONDS}s; state in $STACK_DIR). Export with: eval \"\$(deploy/stack.sh env)\""
  print_env
}

cmd_down() {
  local purge=0
  case "${1:-}" in
    "") ;;
    --purge) purge=1 ;;
    *) die "usage: stack.sh down [--purge]" ;;
  esac
  take_lock
  kafka_stop
  if PG_BIN=$(pg_bin_dir 2>/dev/null); then pg_stop; fi
  if ((purge)); then
    log "purging $PG_DIR and $K_DIR (jar cache $KAFKA_HOME kept)"
    rm -rf "$PG_DIR" "$K_DIR"
  fi
  log "stack down"
}

cmd_status() {
  local rc=0 pid ver
  if PG_BIN=$(pg_bin_dir 2>/dev/null) && pg_running; then
    pid=$(head -n1 "$PGDATA/postmaster.pid")
    ver=$(pg_psql -d postgres -tAc 'show server_version' 2>/dev/null || echo '?')
    ver=${ver%% *}
    echo "postgres: up   127.0.0.1:$PG_PORT  PostgreSQL $ver  pid $pid  data $PGDATA"
  else
    echo "postgres: down (127.0.0.1:$PG_PORT, data $PGDATA)"; rc=3
  fi
  if pid=$(kafka_pid); then
    if port_open "$KAFKA_PORT"; then
      echo "kafka:    up   $BROKERS  Apache Kafka $(cmd_kafka_version) (KRaft)  pid $pid  data $K_DATA"
    else
      echo "kafka:    starting (pid $pid, port $KAFKA_PORT not open yet)"; rc=3
    fi
  else
    echo "kafka:    down ($BROKERS, data $K_DATA, cached jars: Apache Kafka $(cached_kafka_version || true))"; rc=3
  fi
  echo "logs:     $PG_LOG  $K_LOG"
  return $rc
}

cmd_kafka_version() {
  if kafka_running && [[ -s $K_RUNNING_VERSION ]]; then cat "$K_RUNNING_VERSION"; return 0; fi
  local v
  v=$(cached_kafka_version)
  echo "${v:-$KAFKA_VERSION}"
}

cmd_restart_postgres() {
  take_lock
  pg_up_existing
  pg_stop
  pg_start
}

pg_up_existing() {
  PG_BIN=$(pg_bin_dir) || die "postgres is not installed; run deploy/stack.sh up"
  [[ -f $PGDATA/PG_VERSION ]] || die "no cluster in $PGDATA; run deploy/stack.sh up"
}

kafka_existing() {
  ensure_java
  [[ -f $K_DATA/meta.properties ]] || die "no kafka data in $K_DATA; run deploy/stack.sh up"
}

cmd_stop_postgres() { take_lock; pg_up_existing; pg_stop; }
cmd_start_postgres() { take_lock; pg_up_existing; pg_start; }

cmd_restart_kafka() { take_lock; kafka_existing; kafka_stop; kafka_start; }
cmd_start_kafka() { take_lock; kafka_existing; kafka_start; }
cmd_kill_kafka() { take_lock; kafka_kill; }

cmd_kafka_tool() {
  ensure_java
  [[ -f $KAFKA_MARKER ]] || die "kafka jars not cached; run deploy/stack.sh up"
  [[ -f $K_TOOLS_LOG4J ]] || { mkdir -p "$K_CONF_DIR"; kafka_write_config; }
  kafka_java_tool "$@"
}

usage() {
  cat >&2 <<EOF
usage: deploy/stack.sh COMMAND
  up                 start PostgreSQL and Kafka (idempotent), print export lines
  down [--purge]     stop both (data kept; --purge deletes data, keeps the jar cache)
  status             up/down per service (exit 3 if anything is down)
  env                print export lines only: eval "\$(deploy/stack.sh env)"
  kafka-version      Kafka version running (or cached), e.g. $KAFKA_VERSION
  restart-kafka      graceful stop + start, data kept, waits until ready
  restart-postgres   fast stop + start, data kept, waits until ready
  stop-postgres      fast stop, data kept (outage tests); start-postgres brings it back
  start-postgres     start postgres if it is not running, wait until ready
  kill-kafka         SIGKILL the broker (failure tests); start-kafka brings it back
  start-kafka        start the broker if it is not running, wait until ready
  kafka-topics ARGS  org.apache.kafka.tools.TopicCommand --bootstrap-server $BROKERS ARGS
  kafka-tool CLASS ARGS  run any Kafka CLI main class with the cached jars
EOF
}

main() {
  local cmd=${1:-}
  (($#)) && shift
  case "$cmd" in
    up) cmd_up "$@" ;;
    down) cmd_down "$@" ;;
    status) cmd_status ;;
    env) print_env ;;
    kafka-version) cmd_kafka_version ;;
    restart-kafka) cmd_restart_kafka ;;
    restart-postgres) cmd_restart_postgres ;;
    stop-postgres) cmd_stop_postgres ;;
    start-postgres) cmd_start_postgres ;;
    kill-kafka) cmd_kill_kafka ;;
    start-kafka) cmd_start_kafka ;;
    kafka-topics) cmd_kafka_tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$BROKERS" "$@" ;;
    kafka-tool) cmd_kafka_tool "$@" ;;
    -h | --help | help) usage ;;
    *) usage; exit 2 ;;
  esac
}

main "$@"
