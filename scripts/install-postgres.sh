#!/usr/bin/env bash
# A private PostgreSQL server for slabtune's Optuna storage (tests/test_postgres.py, or a
# study several `slabtune tune` processes share): installs Debian's postgresql package with
# apt when no server is installed, then runs its own cluster from a data directory under the
# project's cache, on a free port of 127.0.0.1.  The machine's default cluster (Debian's
# "main", /var/lib/postgresql) is never started, stopped or changed.
#
# Usage: scripts/install-postgres.sh [start|stop|status] [--dir DIR]
#   start   install if needed, create the cluster once, start it (if it is not running);
#           prints the storage URL with its password masked; the full URL is in DIR/url
#           (mode 0600), e.g.  slabtune tune SPEC --storage "$(cat DIR/url)"
#   stop    stop the cluster (its data stays)
#   status  exit 0 when it runs
#   --dir DIR  where the cluster lives (default: $SLABTUNE_CACHE/postgres, else
#              ~/.cache/slabtune/postgres; as root, when the `postgres` user cannot reach
#              that, /var/tmp/slabtune-postgres)
#
# The server runs as a user other than root (PostgreSQL refuses root): as the invoking user,
# or, run as root, as Debian's `postgres` user, owning DIR/data.  It listens on 127.0.0.1
# only; its one role, `slabtune`, has a random password (DIR/password, mode 0600) and owns
# the database `slabtune`.  Exit status: 0 done, 3 no PostgreSQL server and none can be
# installed here (no apt, not root, or apt failed), 1 any other failure.
set -euo pipefail

action=start
dir=""
while [ $# -gt 0 ]; do
    case "$1" in
        start|stop|status) action="$1"; shift ;;
        --dir) dir="${2:?--dir needs a directory}"; shift 2 ;;
        -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
        *) echo "install-postgres: unknown argument: $1" >&2; exit 1 ;;
    esac
done

say() { echo "install-postgres: $*" >&2; }

pg_bin() {   # the newest installed server's bin directory (initdb and pg_ctl)
    local best=""
    for d in /usr/lib/postgresql/*/bin; do
        [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && best="$d"
    done
    [ -n "$best" ] && echo "$best"
}

bin="$(pg_bin || true)"
if [ -z "$bin" ] && [ "$action" = start ]; then
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
        say "no PostgreSQL server installed (/usr/lib/postgresql/*/bin) and apt-get cannot" \
            "install one here (needs root and apt)"
        exit 3
    fi
    say "installing Debian's postgresql package with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    if ! { apt-get install -y -qq postgresql >/dev/null 2>&1 ||
           { apt-get update -qq && apt-get install -y -qq postgresql >/dev/null; }; }; then
        say "apt-get install postgresql failed"
        exit 3
    fi
    bin="$(pg_bin || true)"
    [ -n "$bin" ] || { say "postgresql installed, but no server in /usr/lib/postgresql"; exit 3; }
fi

# as whom the server runs, and how to run a command as that user
if [ "$(id -u)" -eq 0 ]; then
    owner=postgres
    id "$owner" >/dev/null 2>&1 || { say "no '$owner' user to run the server as"; exit 1; }
    as_owner() { runuser -u "$owner" -- "$@"; }
else
    owner="$(id -un)"
    as_owner() { "$@"; }
fi

if [ -z "$dir" ]; then
    cache="${SLABTUNE_CACHE:-${HOME}/.cache/slabtune}"
    dir="$cache/postgres"
    if [ "$(id -u)" -eq 0 ] && ! as_owner test -x "$cache"; then
        dir=/var/tmp/slabtune-postgres   # the cache is under a home the server cannot enter
    fi
fi
mkdir -p "$dir"
chmod 711 "$dir"                          # the server user passes through, reads nothing
if ! as_owner test -x "$dir"; then
    say "user $owner cannot reach $dir (a parent directory is closed); give --dir elsewhere"
    exit 1
fi
data="$dir/data"
ctl() { as_owner "$bin/pg_ctl" -D "$data" "$@"; }

case "$action" in
    stop)
        if [ -n "$bin" ] && [ -f "$data/PG_VERSION" ] && ctl status >/dev/null 2>&1; then
            ctl -m fast -w stop >/dev/null
            say "stopped the cluster in $data"
        fi
        exit 0 ;;
    status)
        [ -n "$bin" ] && [ -f "$data/PG_VERSION" ] && ctl status >/dev/null 2>&1
        exit $? ;;
esac

if [ ! -f "$data/PG_VERSION" ]; then
    rm -rf "$data"
    mkdir -m 700 "$data"
    chown "$owner" "$data"
    umask 077
    password="$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')"
    pwfile="$dir/.initpw"
    printf '%s\n' "$password" > "$pwfile"
    chown "$owner" "$pwfile"
    # the role `slabtune` is the superuser; over TCP it needs its password, on the socket
    # (in the 0700 data directory: only the server's user reaches it) it is trusted
    as_owner "$bin/initdb" -D "$data" -U slabtune --pwfile="$pwfile" -E UTF8 --locale=C \
        --auth-host=scram-sha-256 --auth-local=trust >"$dir/initdb.log" 2>&1 ||
        { say "initdb failed (see $dir/initdb.log)"; rm -f "$pwfile"; exit 1; }
    rm -f "$pwfile"
    printf '%s\n' "$password" > "$dir/password"
    chmod 600 "$dir/password"
    rm -f "$dir/port" "$dir/url"
fi

if ! ctl status >/dev/null 2>&1; then
    port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    ctl -w -t 60 -l "$data/server.log" \
        -o "-p $port -k $data -c listen_addresses=127.0.0.1" start >/dev/null ||
        { say "the server did not start (see $data/server.log)"; exit 1; }
    echo "$port" > "$dir/port"
    if ! as_owner "$bin/psql" -h "$data" -p "$port" -U slabtune -d postgres -tAq \
            -c "SELECT 1 FROM pg_database WHERE datname = 'slabtune'" | grep -q 1; then
        as_owner "$bin/createdb" -h "$data" -p "$port" -U slabtune slabtune
    fi
fi
port="$(cat "$dir/port")"
umask 077
printf 'postgresql://slabtune:%s@127.0.0.1:%s/slabtune\n' "$(cat "$dir/password")" "$port" \
    > "$dir/url"
say "running in $data on 127.0.0.1:$port; its URL (with the password) is in $dir/url"
echo "postgresql://slabtune:***@127.0.0.1:$port/slabtune"
