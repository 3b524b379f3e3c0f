#!/usr/bin/env bash
# paystream local stack without Docker: a private PostgreSQL cluster (Debian packages)
# and a single-node Apache Kafka broker in KRaft mode (jars from Maven Central).
#
#   deploy/stack.sh up | down [--purge] | status | env | kafka-version
#   deploy/stack.sh restart-kafka | restart-postgres | kill-kafka | start-kafka
#   deploy/stack.sh postgres-up | stop-postgres | start-postgres | kill-postgres
#   deploy/stack.sh standby-up | promote-standby | standby-down [--purge]
#   deploy/stack.sh kafka-topics ARGS...   (org.apache.kafka.tools.TopicCommand)
#   deploy/stack.sh kafka-tool MAIN_CLASS ARGS...
#
# Besides PLAINTEXT, the broker has a SASL_SSL listener (SCRAM-SHA-512/256, PLAIN, OAUTHBEARER)
# and an SSL listener that requires a client certificate; Postgres serves TLS too. The CA and
# certificates are generated once with openssl under $PAYSTREAM_STACK_DIR/tls.
#
# Progress goes to stderr; `up`, `postgres-up`, `standby-up` and `env` print only
# `export NAME=value` lines on stdout, so `eval "$(deploy/stack.sh up)"` works. See deploy/README.md.
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
PG_STANDBY_PORT="${PAYSTREAM_STACK_PG_STANDBY_PORT:-$((PG_PORT + 1))}"
KAFKA_PORT="${PAYSTREAM_STACK_KAFKA_PORT:-59092}"
KAFKA_CONTROLLER_PORT="${PAYSTREAM_STACK_KAFKA_CONTROLLER_PORT:-$((KAFKA_PORT + 1))}"
KAFKA_SASL_PORT="${PAYSTREAM_STACK_KAFKA_SASL_PORT:-$((KAFKA_PORT + 2))}"
KAFKA_MTLS_PORT="${PAYSTREAM_STACK_KAFKA_MTLS_PORT:-$((KAFKA_PORT + 3))}"
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

# A streaming physical standby of that cluster (standby-up), for failover tests.
readonly PGS_DIR="$STACK_DIR/postgres-standby"
readonly PGS_DATA="$PGS_DIR/data"
readonly PGS_SOCKET_DIR="$PGS_DIR/run"
readonly PGS_LOG_DIR="$PGS_DIR/log"
readonly PGS_LOG="$PGS_LOG_DIR/postgres.log"
readonly PG_STANDBY_SLOT=paystream_standby

# One CA signs the server certificate (localhost, 127.0.0.1) both Kafka and Postgres present,
# and the client certificate the mutual-TLS listener asks for.
readonly TLS_DIR="$STACK_DIR/tls"
readonly CA_CERT="$TLS_DIR/ca.pem"
readonly CA_KEY="$TLS_DIR/ca.key"
readonly SERVER_CERT="$TLS_DIR/server.pem"
readonly SERVER_KEY="$TLS_DIR/server.key"
readonly CLIENT_CERT="$TLS_DIR/client.pem"
readonly CLIENT_KEY="$TLS_DIR/client.key"

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
readonly K_KEYSTORE="$K_CONF_DIR/keystore.pem"
readonly K_SASL_USER=paystream
readonly K_SASL_PASSWORD_FILE="$K_DIR/sasl-password"
readonly K_SCRAM_MARKER="$K_DIR/scram.done"

DB_URL="postgres://paystream@127.0.0.1:${PG_PORT}/paystream?sslmode=disable"
DB_TLS_URL="postgres://paystream@localhost:${PG_PORT}/paystream?sslmode=verify-full&sslrootcert=${CA_CERT}"
STANDBY_DB_URL="postgres://paystream@127.0.0.1:${PG_STANDBY_PORT}/paystream?sslmode=disable"
BROKERS="127.0.0.1:${KAFKA_PORT}"
SASL_BROKERS="127.0.0.1:${KAFKA_SASL_PORT}"
MTLS_BROKERS="127.0.0.1:${KAFKA_MTLS_PORT}"

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

# ----------------------------------------------------------------------------- tls

# A CA and the server and client certificates it signs (EC P-256, ten years), made once
# with openssl and kept across restarts; down --purge deletes them.
tls_ensure() {
  [[ -s $CA_CERT && -s $SERVER_CERT && -s $SERVER_KEY && -s $CLIENT_CERT && -s $CLIENT_KEY ]] && return 0
  command -v openssl >/dev/null 2>&1 || apt_install openssl
  log "tls: generating a CA and server/client certificates in $TLS_DIR"
  mkdir -p "$STACK_DIR"
  local tmp
  tmp=$(mktemp -d "$STACK_DIR/.tls.XXXXXX")
  if ! (
    set -e
    cd "$tmp"
    umask 077
    printf '%s\n' 'subjectAltName=DNS:localhost,IP:127.0.0.1' 'extendedKeyUsage=serverAuth' \
      'keyUsage=critical,digitalSignature' >server.ext
    printf '%s\n' 'extendedKeyUsage=clientAuth' 'keyUsage=critical,digitalSignature' >client.ext
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
      -subj "/CN=paystream stack CA" -addext basicConstraints=critical,CA:TRUE \
      -addext keyUsage=critical,keyCertSign,cRLSign -keyout ca.key -out ca.pem
    for name in server client; do
      openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
        -subj "/CN=$([[ $name == server ]] && echo localhost || echo "$K_SASL_USER")" \
        -keyout "$name.key" -out "$name.csr"
      openssl x509 -req -in "$name.csr" -CA ca.pem -CAkey ca.key -days 3650 \
        -set_serial "0x$(openssl rand -hex 16)" -extfile "$name.ext" -out "$name.pem"
    done
    chmod 0644 ca.pem server.pem client.pem
  ) </dev/null >"$tmp/openssl.log" 2>&1 9>&-; then
    cat "$tmp/openssl.log" >&2
    rm -rf "$tmp"
    die "openssl could not generate the stack's certificates"
  fi
  rm -rf "$TLS_DIR"
  mkdir -p "$TLS_DIR"
  mv "$tmp"/{ca,server,client}.{pem,key} "$TLS_DIR/"
  rm -rf "$tmp"
  # Anyone may read the CA and the certificates (the broker and postgres get copies of the keys).
  chmod 0755 "$TLS_DIR"
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

pg_running() { pg_running_dir "$PGDATA"; }
# (a killed postmaster not reaped yet is a zombie pg_ctl would call running)
pg_running_dir() {
  [[ -f $1/postmaster.pid ]] && proc_alive "$(head -n1 "$1/postmaster.pid")" &&
    as_pg "$PG_BIN/pg_ctl" -D "$1" status >/dev/null 2>&1
}

pg_psql() { "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U paystream "$@"; }

# Write the settings of the cluster in data dir $1 (default: the primary's), serving on port
# $2 with its unix socket in $3, and its TLS certificate and key (copies owned by the cluster's
# owner: postgres wants its key private).
pg_write_conf() {
  local data=${1:-$PGDATA} port=${2:-$PG_PORT} sockdir=${3:-$PG_SOCKET_DIR}
  # unix socket paths are limited to ~107 bytes; fall back to TCP only.
  ((${#sockdir} + 20 < 100)) || sockdir=""
  tls_ensure
  install -m 0644 "$SERVER_CERT" "$data/server.crt"
  install -m 0600 "$SERVER_KEY" "$data/server.key"
  cat >"$data/paystream.conf" <<EOF
# Written by deploy/stack.sh on every start; edit the script, not this file.
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$sockdir'
# TLS for clients that ask (sslmode=require/verify-full); sslmode=disable keeps working.
ssl = on
ssl_cert_file = 'server.crt'
ssl_key_file = 'server.key'
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
  if is_root; then chown postgres: "$data/paystream.conf" "$data/server.crt" "$data/server.key"; fi
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
      pg_ensure_ssl
      pgs_drop_orphan_slot
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
  pgs_drop_orphan_slot
}

# A cluster started by an older stack.sh serves no TLS: write the settings and certificate
# and reload (ssl needs no restart).
pg_ensure_ssl() {
  [[ $(pg_psql -d postgres -tAc 'show ssl') == on ]] && return 0
  log "postgres: running without TLS; turning it on (reload)"
  pg_write_conf
  pg_psql -d postgres -tAc 'select pg_reload_conf()' >/dev/null
  local deadline=$((SECONDS + 30))
  until [[ $(pg_psql -d postgres -tAc 'show ssl') == on ]]; do
    ((SECONDS < deadline)) || { tail -n 20 "$PG_LOG" >&2; die "postgres: ssl still off 30s after the reload (log: $PG_LOG)"; }
    sleep 0.2
  done
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

pg_stop() { pg_stop_dir "$PGDATA" postgres; }

# Stop the cluster in data dir $1 (named $2 in messages): fast, then immediate, then SIGKILL.
pg_stop_dir() {
  local data=$1 name=$2 pid
  pg_running_dir "$data" || { log "$name: not running"; return 0; }
  log "$name: stopping"
  as_pg "$PG_BIN/pg_ctl" -D "$data" -m fast -w -t 60 stop >/dev/null 2>&1 9>&- && return 0
  log "$name: fast shutdown timed out, using immediate"
  as_pg "$PG_BIN/pg_ctl" -D "$data" -m immediate -w -t 30 stop >/dev/null 2>&1 9>&- && return 0
  pid=$(head -n1 "$data/postmaster.pid" 2>/dev/null || true)
  [[ $pid =~ ^[0-9]+$ ]] && kill -KILL "$pid" 2>/dev/null || true
  sleep 1
  ! pg_running_dir "$data" || die "could not stop $name (pid ${pid:-?})"
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

# ------------------------------------------------------------------ postgres standby

pgs_psql() { "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_STANDBY_PORT" -U paystream "$@"; }
pgs_running() { pg_running_dir "$PGS_DATA"; }

# Copy the running primary with pg_basebackup (-R: a standby that streams from the primary
# through the physical slot, which keeps the WAL the standby has not received yet).
pgs_create() {
  log "standby: pg_basebackup from 127.0.0.1:$PG_PORT (slot $PG_STANDBY_SLOT) into $PGS_DATA"
  pg_psql -d postgres -tAc "SELECT pg_create_physical_replication_slot('$PG_STANDBY_SLOT', true)
    WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = '$PG_STANDBY_SLOT')" >/dev/null
  rm -rf "$PGS_DATA"
  mkdir -p "$PGS_DATA"
  chmod 0700 "$PGS_DATA"
  if is_root; then chown postgres: "$PGS_DATA"; fi
  if ! as_pg "$PG_BIN/pg_basebackup" -h 127.0.0.1 -p "$PG_PORT" -U paystream -D "$PGS_DATA" \
      -R -X stream -S "$PG_STANDBY_SLOT" --checkpoint=fast </dev/null >>"$PGS_LOG" 2>&1 9>&-; then
    tail -n 20 "$PGS_LOG" >&2
    rm -rf "$PGS_DATA"
    die "pg_basebackup failed (log: $PGS_LOG)"
  fi
}

pgs_start() {
  if pgs_running; then log "standby: already running on 127.0.0.1:$PG_STANDBY_PORT"; return 0; fi
  if port_open "$PG_STANDBY_PORT"; then
    die "port 127.0.0.1:$PG_STANDBY_PORT is taken by another process; set PAYSTREAM_STACK_PG_STANDBY_PORT"
  fi
  pg_write_conf "$PGS_DATA" "$PG_STANDBY_PORT" "$PGS_SOCKET_DIR"
  log "standby: starting on 127.0.0.1:$PG_STANDBY_PORT"
  as_pg bash -c "$CLOSE_FDS"'exec "$@"' pg_ctl \
    "$PG_BIN/pg_ctl" -D "$PGS_DATA" -l "$PGS_LOG" -w -t "$READY_TIMEOUT" start \
    </dev/null >/dev/null 2>&1 9>&- \
    || { tail -n 40 "$PGS_LOG" >&2; die "standby did not start within ${READY_TIMEOUT}s (log: $PGS_LOG)"; }
}

# Wait until the standby's WAL receiver streams from the primary.
pgs_wait_streaming() {
  local deadline=$((SECONDS + READY_TIMEOUT)) status=""
  until [[ $status == streaming ]]; do
    ((SECONDS < deadline)) || { tail -n 20 "$PGS_LOG" >&2; die "standby not streaming after ${READY_TIMEOUT}s (status '${status}'; log: $PGS_LOG)"; }
    sleep 0.2
    status=$(pgs_psql -d postgres -tAc 'SELECT status FROM pg_stat_wal_receiver' 2>/dev/null || true)
  done
  log "standby: streaming from 127.0.0.1:$PG_PORT on 127.0.0.1:$PG_STANDBY_PORT"
}

# The standby's slot without a standby (purged while the primary was down) keeps WAL forever.
pgs_drop_orphan_slot() {
  [[ -f $PGS_DATA/PG_VERSION ]] && return 0
  [[ $(pg_psql -d postgres -tAc "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '$PG_STANDBY_SLOT'") == 0 ]] && return 0
  log "postgres: dropping replication slot $PG_STANDBY_SLOT (its standby is gone)"
  pgs_drop_slot
}

# Drop the standby's slot on the primary, if the primary runs (a slot nobody reads keeps WAL
# forever). The WAL sender of a standby just stopped may hold it for a moment.
pgs_drop_slot() {
  pg_running || return 0
  local deadline=$((SECONDS + 30))
  until pg_psql -d postgres -tAc "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
      WHERE slot_name = '$PG_STANDBY_SLOT'" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "could not drop replication slot $PG_STANDBY_SLOT on 127.0.0.1:$PG_PORT"
    sleep 0.2
  done
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
  tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -qF "kafka.Kafka $K_CONF" || return 1
  echo "$pid"
}

kafka_running() { kafka_pid >/dev/null; }

# The password of the SASL user (SCRAM and PLAIN), generated once: 24 characters of
# base64url, nothing to quote in JAAS or ConfigCommand.
kafka_ensure_password() {
  [[ -s $K_SASL_PASSWORD_FILE ]] && return 0
  mkdir -p "$K_DIR"
  (umask 077 && head -c 18 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n' >"$K_SASL_PASSWORD_FILE")
}

kafka_write_config() {
  mkdir -p "$K_DATA" "$K_CONF_DIR" "$K_LOG_DIR"
  tls_ensure
  kafka_ensure_password
  local password
  password=$(<"$K_SASL_PASSWORD_FILE")
  (umask 077 && cat "$SERVER_KEY" "$SERVER_CERT" >"$K_KEYSTORE")
  # server.properties holds the PLAIN password: readable by its owner only.
  (umask 077 && cat >"$K_CONF" <<EOF
# Written by deploy/stack.sh on every start; edit the script, not this file.
# Single node, KRaft combined mode (broker + controller), loopback only.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$KAFKA_CONTROLLER_PORT
# PLAINTEXT for most tests and inter-broker traffic; SASL_SSL (SCRAM, PLAIN, OAUTHBEARER over
# TLS) and SSL with a required client certificate for the tests of secured connections.
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT,SASL_SSL://127.0.0.1:$KAFKA_SASL_PORT,SSL://127.0.0.1:$KAFKA_MTLS_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,SASL_SSL://127.0.0.1:$KAFKA_SASL_PORT,SSL://127.0.0.1:$KAFKA_MTLS_PORT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL,SSL:SSL
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
log.dirs=$K_DATA

# TLS: the stack's server certificate (localhost, 127.0.0.1); the CA checks client certificates.
ssl.keystore.type=PEM
ssl.keystore.location=$K_KEYSTORE
ssl.truststore.type=PEM
ssl.truststore.location=$CA_CERT
listener.name.ssl.ssl.client.auth=required
# SASL on the SASL_SSL listener: SCRAM users are created with ConfigCommand after the start
# (user $K_SASL_USER); PLAIN checks the JAAS user below; OAUTHBEARER takes unsecured JWTs
# (alg none) with a sub claim, Kafka's built-in validator: for tests only.
listener.name.sasl_ssl.sasl.enabled.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256,PLAIN,OAUTHBEARER
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$K_SASL_USER="$password";
listener.name.sasl_ssl.oauthbearer.sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required unsecuredLoginStringClaim_sub="$K_SASL_USER";

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
  )
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
  log "kafka: formatting storage in $K_DATA (cluster id $cid, SCRAM user $K_SASL_USER)"
  local password
  password=$(<"$K_SASL_PASSWORD_FILE")
  kafka_java_tool kafka.tools.StorageTool format -t "$cid" -c "$K_CONF" --ignore-formatted \
    --add-scram "SCRAM-SHA-512=[name=$K_SASL_USER,password=$password]" \
    --add-scram "SCRAM-SHA-256=[name=$K_SASL_USER,password=$password]" \
    </dev/null >>"$K_STDOUT" 2>&1 9>&- \
    || { tail -n 30 "$K_STDOUT" >&2; die "kafka storage format failed (log: $K_STDOUT)"; }
  scram_marker >"$K_SCRAM_MARKER"
}

# What the SCRAM credentials were made for: the formatted data dir and the password.
scram_marker() {
  echo "$(grep '^directory.id=' "$K_DATA/meta.properties" 2>/dev/null) $(sha256sum <"$K_SASL_PASSWORD_FILE" | cut -d' ' -f1)"
}

kafka_start() {
  if kafka_running; then
    if port_open "$KAFKA_SASL_PORT" && port_open "$KAFKA_MTLS_PORT"; then
      log "kafka: already running on $BROKERS (pid $(kafka_pid))"
      kafka_ensure_scram
      return 0
    fi
    # Started by an older stack.sh, without the secured listeners: restart it once with them.
    log "kafka: running without the SASL_SSL and SSL listeners; restarting it with the stack's settings"
    kafka_stop
  fi
  ensure_java
  ensure_kafka_jars
  kafka_write_config
  local p
  for p in "$KAFKA_PORT" "$KAFKA_CONTROLLER_PORT" "$KAFKA_SASL_PORT" "$KAFKA_MTLS_PORT"; do
    port_open "$p" && die "port 127.0.0.1:$p is taken by another process; set PAYSTREAM_STACK_KAFKA_PORT / PAYSTREAM_STACK_KAFKA_CONTROLLER_PORT / PAYSTREAM_STACK_KAFKA_SASL_PORT / PAYSTREAM_STACK_KAFKA_MTLS_PORT"
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
  kafka_ensure_scram
}

# Create the SCRAM-SHA-512 and -256 credentials of the SASL user in a data dir formatted
# without them (by an older stack.sh): they live in the cluster's metadata log. A fresh data
# dir gets them at format time.
kafka_ensure_scram() {
  local password want mech
  want=$(scram_marker)
  [[ -f $K_SCRAM_MARKER && $(<"$K_SCRAM_MARKER") == "$want" ]] && return 0
  log "kafka: creating the SCRAM credentials of user $K_SASL_USER"
  ensure_java
  password=$(<"$K_SASL_PASSWORD_FILE")
  for mech in SCRAM-SHA-512 SCRAM-SHA-256; do # one per request, Kafka insists
    kafka_java_tool kafka.admin.ConfigCommand --bootstrap-server "$BROKERS" --alter \
      --add-config "$mech=[password=$password]" --entity-type users --entity-name "$K_SASL_USER" \
      </dev/null >>"$K_STDOUT" 2>&1 9>&- \
      || { tail -n 20 "$K_STDOUT" >&2; die "kafka: could not create the $mech credential of $K_SASL_USER (log: $K_STDOUT)"; }
  done
  echo "$want" >"$K_SCRAM_MARKER"
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
  print_pg_env
  printf 'export %s=%s\n' \
    PAYSTREAM_TEST_KAFKA_BROKERS "$BROKERS" \
    PAYSTREAM_KAFKA_BROKERS "$BROKERS" \
    PAYSTREAM_TEST_KAFKA_SASL_BROKERS "$SASL_BROKERS" \
    PAYSTREAM_TEST_KAFKA_SASL_USERNAME "$K_SASL_USER" \
    PAYSTREAM_TEST_KAFKA_SASL_PASSWORD_FILE "$K_SASL_PASSWORD_FILE" \
    PAYSTREAM_TEST_KAFKA_TLS_CA_FILE "$CA_CERT" \
    PAYSTREAM_TEST_KAFKA_MTLS_BROKERS "$MTLS_BROKERS" \
    PAYSTREAM_TEST_KAFKA_TLS_CERT_FILE "$CLIENT_CERT" \
    PAYSTREAM_TEST_KAFKA_TLS_KEY_FILE "$CLIENT_KEY"
}

print_pg_env() {
  printf 'export %s=%s\n' \
    PAYSTREAM_TEST_DATABASE_URL "$DB_URL" \
    PAYSTREAM_DATABASE_URL "$DB_URL"
  # single quotes: the URL has a '&'
  printf "export %s='%s'\n" PAYSTREAM_TEST_DATABASE_TLS_URL "$DB_TLS_URL"
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
  if PG_BIN=$(pg_bin_dir 2>/dev/null); then
    if [[ -f $PGS_DATA/PG_VERSION ]]; then pg_stop_dir "$PGS_DATA" standby; fi
    pg_stop
  fi
  if ((purge)); then
    log "purging $PG_DIR, $PGS_DIR, $K_DIR and $TLS_DIR (jar cache $KAFKA_HOME kept)"
    rm -rf "$PG_DIR" "$PGS_DIR" "$K_DIR" "$TLS_DIR"
  fi
  log "stack down"
}

cmd_postgres_up() {
  take_lock
  pg_up
  print_pg_env
}

cmd_kill_postgres() {
  take_lock
  pg_up_existing
  pg_running || { log "postgres: not running"; return 0; }
  local pid children deadline=$((SECONDS + 30))
  pid=$(head -n1 "$PGDATA/postmaster.pid")
  children=$(pgrep -P "$pid" || true)
  log "postgres: SIGKILL postmaster pid $pid (a crash)"
  kill -KILL "$pid" 2>/dev/null || true
  while port_open "$PG_PORT" || proc_alive "$pid"; do
    ((SECONDS < deadline)) || die "postgres: port $PG_PORT still open 30s after SIGKILL of pid $pid"
    sleep 0.1
  done
  # Its backends exit when they notice the postmaster is gone; a new postmaster cannot start
  # while they hold the shared memory, nor while the dead one is an unreaped zombie (its pid
  # still in postmaster.pid answers kill -0).
  local c
  for c in $children "$pid"; do
    while kill -0 "$c" 2>/dev/null; do
      ((SECONDS < deadline)) || { log "postgres: process $c still there 30s after the postmaster was killed"; break; }
      sleep 0.1
    done
  done
  log "postgres: killed; start-postgres or postgres-up starts it again (crash recovery)"
}

cmd_standby_up() {
  take_lock
  pg_up_existing
  pg_running || die "postgres is not running on 127.0.0.1:$PG_PORT: run deploy/stack.sh postgres-up (or up) first"
  mkdir -p "$PGS_DIR" "$PGS_SOCKET_DIR" "$PGS_LOG_DIR"
  if is_root; then chown postgres: "$PGS_DIR" "$PGS_SOCKET_DIR" "$PGS_LOG_DIR"; touch "$PGS_LOG"; chown postgres: "$PGS_LOG"; fi
  if [[ ! -f $PGS_DATA/PG_VERSION ]]; then
    pgs_create
  elif [[ ! -f $PGS_DATA/standby.signal ]]; then
    die "$PGS_DATA was promoted (no standby.signal): deploy/stack.sh standby-down --purge, then standby-up"
  fi
  pgs_start
  pgs_wait_streaming
  printf 'export %s=%s\n' PAYSTREAM_TEST_STANDBY_DATABASE_URL "$STANDBY_DB_URL"
}

cmd_promote_standby() {
  take_lock
  pg_up_existing
  [[ -f $PGS_DATA/PG_VERSION ]] || die "no standby in $PGS_DATA: run deploy/stack.sh standby-up first"
  pgs_running || die "the standby is not running: run deploy/stack.sh standby-up first"
  if [[ $(pgs_psql -d postgres -tAc 'SELECT pg_is_in_recovery()') == f ]]; then
    log "standby: already promoted"
    return 0
  fi
  log "standby: promoting 127.0.0.1:$PG_STANDBY_PORT"
  as_pg "$PG_BIN/pg_ctl" -D "$PGS_DATA" -w -t "$READY_TIMEOUT" promote >/dev/null 2>&1 9>&- \
    || { tail -n 20 "$PGS_LOG" >&2; die "pg_ctl promote failed (log: $PGS_LOG)"; }
  local deadline=$((SECONDS + READY_TIMEOUT))
  until [[ $(pgs_psql -d postgres -tAc 'SELECT pg_is_in_recovery()' 2>/dev/null) == f ]]; do
    ((SECONDS < deadline)) || die "standby still in recovery ${READY_TIMEOUT}s after pg_ctl promote (log: $PGS_LOG)"
    sleep 0.1
  done
  log "standby: promoted, accepting writes on 127.0.0.1:$PG_STANDBY_PORT"
}

cmd_standby_down() {
  local purge=0
  case "${1:-}" in
    "") ;;
    --purge) purge=1 ;;
    *) die "usage: stack.sh standby-down [--purge]" ;;
  esac
  take_lock
  PG_BIN=$(pg_bin_dir 2>/dev/null) || { log "standby: postgres is not installed"; return 0; }
  pg_stop_dir "$PGS_DATA" standby
  if ((purge)); then
    log "standby: purging $PGS_DIR and dropping slot $PG_STANDBY_SLOT"
    rm -rf "$PGS_DIR"
    pgs_drop_slot
  fi
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
      echo "          SASL_SSL $SASL_BROKERS (user $K_SASL_USER)  SSL+client cert $MTLS_BROKERS  CA $CA_CERT"
    else
      echo "kafka:    starting (pid $pid, port $KAFKA_PORT not open yet)"; rc=3
    fi
  else
    echo "kafka:    down ($BROKERS, data $K_DATA, cached jars: Apache Kafka $(cached_kafka_version || true))"; rc=3
  fi
  if [[ -f $PGS_DATA/PG_VERSION ]]; then
    # optional: a standby that is down does not make the stack down
    if [[ -n ${PG_BIN:-} ]] && pgs_running; then
      pid=$(head -n1 "$PGS_DATA/postmaster.pid")
      if [[ $(pgs_psql -d postgres -tAc 'SELECT pg_is_in_recovery()' 2>/dev/null) == f ]]; then
        echo "standby:  up   127.0.0.1:$PG_STANDBY_PORT  promoted (a primary)  pid $pid  data $PGS_DATA"
      else
        ver=$(pgs_psql -d postgres -tAc 'SELECT status FROM pg_stat_wal_receiver' 2>/dev/null || true)
        echo "standby:  up   127.0.0.1:$PG_STANDBY_PORT  ${ver:-not streaming} from 127.0.0.1:$PG_PORT (slot $PG_STANDBY_SLOT)  pid $pid  data $PGS_DATA"
      fi
    else
      echo "standby:  down (127.0.0.1:$PG_STANDBY_PORT, data $PGS_DATA)"
    fi
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
  down [--purge]     stop all (data kept; --purge deletes data and certificates, keeps the jar cache)
  status             up/down per service (exit 3 if anything is down)
  env                print export lines only: eval "\$(deploy/stack.sh env)"
  kafka-version      Kafka version running (or cached), e.g. $KAFKA_VERSION
  restart-kafka      graceful stop + start, data kept, waits until ready
  restart-postgres   fast stop + start, data kept, waits until ready
  stop-postgres      fast stop, data kept (outage tests); start-postgres brings it back
  start-postgres     start postgres if it is not running, wait until ready
  postgres-up        start only PostgreSQL, as up does (idempotent), print its export lines
  kill-postgres      SIGKILL the postmaster (a crash), wait until its port is closed
  standby-up         streaming standby on port $PG_STANDBY_PORT (pg_basebackup, slot $PG_STANDBY_SLOT),
                     wait until it streams, print PAYSTREAM_TEST_STANDBY_DATABASE_URL
  promote-standby    pg_ctl promote the standby, wait until it accepts writes
  standby-down [--purge]  stop the standby (--purge: delete it and drop its slot)
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
    postgres-up) cmd_postgres_up ;;
    kill-postgres) cmd_kill_postgres ;;
    standby-up) cmd_standby_up ;;
    promote-standby) cmd_promote_standby ;;
    standby-down) cmd_standby_down "$@" ;;
    kill-kafka) cmd_kill_kafka ;;
    start-kafka) cmd_start_kafka ;;
    kafka-topics) cmd_kafka_tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$BROKERS" "$@" ;;
    kafka-tool) cmd_kafka_tool "$@" ;;
    -h | --help | help) usage ;;
    *) usage; exit 2 ;;
  esac
}

main "$@"
