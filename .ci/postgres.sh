#!/usr/bin/env bash
# A throwaway PostgreSQL server for the storage tests (tests/test_store.py), started the way
# .ci/run needs it: Debian's postgresql package (installed here if missing), a cluster in a
# temporary folder owned by the `postgres` user (the server never runs as root), listening on
# 127.0.0.1 and a free port, with a role whose password the tests check never leaks.
# Prints shell lines for eval: `export RACE_TEST_POSTGRES_URL=…` and a trap that stops it.
#   eval "$(.ci/postgres.sh)"
set -euo pipefail
log() { echo "postgres.sh: $*" >&2; }
if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    log "installing Debian's postgresql package"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql) >&2 \
      || { log "could not install postgresql"; exit 0; }
  else
    log "postgresql is not installed and this is not root: the PostgreSQL tests will fail under CI=true"; exit 0
  fi
fi
BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
DIR=$(mktemp -d /tmp/race-pg.XXXXXX)
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
PASSWORD=$(python3 -c 'import secrets; print(secrets.token_hex(12))')
if [ "$(id -u)" = 0 ]; then
  id postgres >/dev/null 2>&1 || useradd --system --home "$DIR" postgres
  chown postgres "$DIR"
  AS=(runuser -u postgres --)
else
  AS=()
fi
cd "$DIR"                     # the postgres user may not be able to read the checkout
printf '%s\n' "$PASSWORD" > "$DIR/pw"
chmod 644 "$DIR/pw"
"${AS[@]}" "$BIN/initdb" -D "$DIR/data" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
  --pwfile="$DIR/pw" >/dev/null
rm -f "$DIR/pw"
"${AS[@]}" "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w -t 60 \
  -o "-c listen_addresses=127.0.0.1 -p $PORT -k $DIR -c fsync=off -c max_connections=200" start >/dev/null
"${AS[@]}" "$BIN/psql" -h "$DIR" -p "$PORT" -U postgres -q -v ON_ERROR_STOP=1 \
  -c "CREATE ROLE race LOGIN PASSWORD '$PASSWORD'" -c "CREATE DATABASE race OWNER race" >/dev/null
# a second role whose password holds every character URL syntax makes awkward (/ @ : % space, non-ASCII):
# tests/test_urls.py checks it appears in no output, file or stored attribute
HOSTILE="h/st@le:pa%ss wörd-$(python3 -c 'import secrets; print(secrets.token_hex(4))')"
PGCLIENTENCODING=UTF8 "${AS[@]}" "$BIN/psql" -h "$DIR" -p "$PORT" -U postgres -q -v ON_ERROR_STOP=1 \
  -c "CREATE ROLE race_hostile LOGIN PASSWORD '$HOSTILE'" -c "CREATE DATABASE race_hostile OWNER race_hostile" >/dev/null
HOSTILE_Q=$(python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1], safe=""))' "$HOSTILE")
log "PostgreSQL $("$BIN/postgres" --version | awk '{print $3}') on 127.0.0.1:$PORT (data in $DIR)"
echo "export RACE_TEST_POSTGRES_URL='postgresql://race:$PASSWORD@127.0.0.1:$PORT/race'"
echo "export RACE_TEST_POSTGRES_HOSTILE_URL='postgresql://race_hostile:$HOSTILE_Q@127.0.0.1:$PORT/race_hostile'"
echo "trap '${AS[*]} $BIN/pg_ctl -D $DIR/data -m immediate stop >/dev/null 2>&1 || true' EXIT"
