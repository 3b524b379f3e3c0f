#!/bin/bash
# The official postgres image's entrypoint, reduced to what paystream uses: on first start,
# initdb as POSTGRES_USER (a superuser, so it has REPLICATION) with POSTGRES_PASSWORD,
# create POSTGRES_DB, allow password logins from any address; then exec postgres with the
# container's command (e.g. postgres -c wal_level=logical ...).
set -euo pipefail

if [[ ${1:-} == -* ]]; then set -- postgres "$@"; fi

if [[ ${1:-} == postgres && $(id -u) == 0 ]]; then
  mkdir -p "$PGDATA" /var/run/postgresql
  chown postgres:postgres "$PGDATA" /var/run/postgresql
  chmod 700 "$PGDATA"
  exec setpriv --reuid=postgres --regid=postgres --init-groups "$BASH_SOURCE" "$@"
fi

if [[ ${1:-} == postgres && ! -s $PGDATA/PG_VERSION ]]; then
  : "${POSTGRES_USER:=postgres}" "${POSTGRES_DB:=$POSTGRES_USER}"
  if [[ -z ${POSTGRES_PASSWORD:-} && ${POSTGRES_HOST_AUTH_METHOD:-} != trust ]]; then
    echo "error: database is uninitialized and superuser password is not specified." >&2
    echo "       Set POSTGRES_PASSWORD (or POSTGRES_HOST_AUTH_METHOD=trust)." >&2
    exit 1
  fi
  initdb --username="$POSTGRES_USER" --pwfile=<(printf '%s\n' "${POSTGRES_PASSWORD:-}") \
    --auth-local=trust --auth-host="${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}" \
    --encoding=UTF8 --locale=C.UTF-8 ${POSTGRES_INITDB_ARGS:-}
  echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
  echo "host all all all ${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}" >>"$PGDATA/pg_hba.conf"
  # A socket-only server to create the database, as the official image does; its
  # "ready to accept connections" line is the first of the two that clients wait for.
  pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -p 5432" -w start
  if [[ $POSTGRES_DB != postgres ]]; then
    psql -v ON_ERROR_STOP=1 -U "$POSTGRES_USER" -d postgres -q \
      -c "CREATE DATABASE \"$POSTGRES_DB\""
  fi
  pg_ctl -D "$PGDATA" -m fast -w stop
  echo "PostgreSQL init process complete; ready for start up."
fi

exec "$@"
