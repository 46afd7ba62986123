#!/usr/bin/env bash
# Throw-away PostgreSQL for the tests and the benchmark: Debian's server binaries, a cluster of
# its own in DIR (initdb, pg_ctl), on loopback only, password authentication, run as a non-root
# user (PostgreSQL refuses to run as root: as root the Debian package's `postgres` user runs it).
#
#   scripts/postgres.sh install            # apt-get install postgresql when its binaries are missing
#   scripts/postgres.sh start DIR PORT     # prints export lines: MXBRIDGE_TEST_DATABASE_URL
#   scripts/postgres.sh restart DIR        # stop and start again (fault tests)
#   scripts/postgres.sh stop DIR
#
# The URL names the `postgres` database of a superuser `mxbridge` with a random password; tests
# create a database of their own in it (agent::db::create_scratch).
set -euo pipefail

log() { printf '[postgres] %s\n' "$*" >&2; }

bindir() {
  local d
  d="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
  [ -n "$d" ] && [ -x "$d/pg_ctl" ] && echo "$d"
}

install() {
  if [ -n "$(bindir || true)" ]; then
    log "reusing $(bindir)"
    return
  fi
  log "installing PostgreSQL from Debian"
  apt-get update -qq
  # The package's own cluster is not used (nor started here): our clusters live in temp dirs.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null
}

# Runs pg_ctl without the caller's other open files: the server it starts lives on, and must not
# keep a caller's pipe or lock open (a `flock` around the tests, a reader waiting for EOF).
pg_ctl_clean() (
  for fd in /proc/$BASHPID/fd/*; do
    fd="${fd##*/}"
    [ "$fd" -gt 2 ] 2>/dev/null && eval "exec $fd>&-"
  done
  as_owner "$(bindir)/pg_ctl" "$@" </dev/null
)

# Runs a command as the cluster's owner: ourselves, or `postgres` when we are root.
as_owner() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

start() {
  local dir="$1" port="$2" bin
  bin="$(bindir)" || { log "PostgreSQL is not installed: run scripts/postgres.sh install"; exit 1; }
  mkdir -p "$dir"
  [ "$(id -u)" = 0 ] && chown postgres: "$dir"
  if [ ! -f "$dir/data/PG_VERSION" ]; then
    local password
    password="$(head -c 18 /dev/urandom | od -An -tx1 | tr -d ' \n')"
    printf '%s' "$password" > "$dir/password"
    [ "$(id -u)" = 0 ] && chown postgres: "$dir/password"
    as_owner "$bin/initdb" -D "$dir/data" -U mxbridge --pwfile="$dir/password" \
      -A scram-sha-256 -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 ||
      { cat "$dir/initdb.log" >&2; exit 1; }
    cat >> "$dir/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir'
max_connections = 300
fsync = on
log_min_messages = warning
CONF
  fi
  pg_ctl_clean -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null ||
    { cat "$dir/server.log" >&2; exit 1; }
  log "running on 127.0.0.1:$port (data in $dir/data)"
  echo "export MXBRIDGE_TEST_DATABASE_URL='postgres://mxbridge:$(cat "$dir/password")@127.0.0.1:$port/postgres?sslmode=disable'"
  echo "export MXBRIDGE_PG_DIR='$dir'"
}

stop() {
  local dir="$1" bin
  bin="$(bindir)" || return 0
  [ -f "$dir/data/postmaster.pid" ] || return 0
  as_owner "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
}

restart() {
  local dir="$1"
  pg_ctl_clean -D "$dir/data" -l "$dir/server.log" -m fast -w -t 60 restart >/dev/null
}

case "${1:-}" in
  install) install ;;
  start) start "$2" "$3" ;;
  restart) restart "$2" ;;
  stop) stop "$2" ;;
  *) echo "usage: $0 install | start DIR PORT | restart DIR | stop DIR" >&2; exit 2 ;;
esac
