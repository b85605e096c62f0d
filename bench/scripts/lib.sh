# Shared by the full-size scripts (chat-100k.sh, one-channel.sh, soak.sh):
# build the binary, start nodes, a private Redis and a fresh PostgreSQL
# database on loopback, and take all of it down again on exit, however the
# script ends. Source it; it sets -euo pipefail.
#
# Environment: ROOST_TEST_DATABASE_URL (default
# postgres://postgres@127.0.0.1:5432/test?sslmode=disable) is where the
# run's own database is created; OUT is where results go (default a new
# directory under /tmp, printed at the end).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=$(mktemp -d /tmp/roost-run.XXXXXX)
OUT=${OUT:-$work/out}
mkdir -p "$OUT"
bin=$work/roost
pg_admin=${ROOST_TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}
started=()   # PIDs this script started (nodes, Redis), killed on exit by PID
db=""
redis_port=""

# machine NAME: what else the machine was doing, for the write-up (the
# figures of a shared machine are only as good as this).
machine() {
  { echo "== $1 $(date -u +%FT%TZ)"; echo "loadavg $(cat /proc/loadavg)"; echo "cpus $(nproc)"
    top -bn1 2>/dev/null | sed -n '1,5p;7,20p'; } >> "$OUT/machine.txt" 2>&1 || true
}

cleanup() {
  local rc=$?
  machine end
  for p in "${started[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true; done
  for p in "${started[@]:-}"; do [ -n "$p" ] && wait "$p" 2>/dev/null || true; done
  if [ -n "$db" ]; then
    psql "$pg_admin" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
  fi
  rm -rf "$work/redis" "$bin"
  echo "results in $OUT"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { echo "[$(date +%H:%M:%S)] $*" >&2; }
die() { log "FAIL: $*"; exit 1; }

# The per-process open-file limit bounds every node and bench process; take
# the hard limit.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

build() {
  machine start
  log "building roost"
  (cd "$repo" && go build -o "$bin" .)
}

# port_free PORT: nothing listens there.
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# free_ports N: N free loopback ports, printed space-separated. They lie
# below the ephemeral range (32768-60999 by default), so that no outgoing
# connection takes a killed node's port before it is started again; a
# node's admin port is its port + 1000.
free_ports() {
  local n=$1 out=() p
  p=$((20000 + RANDOM % 10000))
  while [ ${#out[@]} -lt "$n" ]; do
    p=$((p + 1))
    port_free "$p" && out+=("$p")
  done
  echo "${out[@]}"
}

wait_listen() { # PORT [SECONDS]
  local i
  for i in $(seq 1 $((${2:-20} * 10))); do
    port_free "$1" || return 0
    sleep 0.1
  done
  die "nothing listening on 127.0.0.1:$1"
}

need() { command -v "$1" >/dev/null || die "$1 is not installed ($2)"; }

# make_db: a fresh database of this run, migrated; sets db and db_url.
make_db() {
  need psql "PostgreSQL client"
  db=roost_run_$$_$RANDOM
  psql "$pg_admin" -qc "CREATE DATABASE $db" >/dev/null || die "cannot create a database at $pg_admin"
  db_url=$(echo "$pg_admin" | sed -E "s#/[^/?]+(\?|$)#/$db\1#")
  "$bin" migrate --database-url "$db_url" >/dev/null 2>&1 || die "cannot migrate $db_url"
}

# start_redis: a private redis-server on a free port (the soak restarts
# it; nobody else's Redis is touched); sets redis_port and redis_pid.
start_redis() {
  need redis-server "Redis"
  [ -n "$redis_port" ] || redis_port=$(free_ports 1)
  mkdir -p "$work/redis"
  redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$work/redis" --logfile "$work/redis/redis.log" &
  redis_pid=$!
  started+=("$redis_pid")
  echo "$redis_pid" > "$work/redis.pid"
  wait_listen "$redis_port"
}

stop_redis() {
  kill -9 "$redis_pid" 2>/dev/null || true
  wait "$redis_pid" 2>/dev/null || true
}

# start_node NAME PORT [serve flags...]: a node on 127.0.0.1:PORT with its
# admin listener on PORT+1000, its PID in $work/NAME.pid, its output in
# $OUT/NAME.log. NODE_PREFIX (e.g. "taskset -c 1") runs before it.
start_node() {
  local name=$1 port=$2
  shift 2
  ${NODE_PREFIX:-} "$bin" serve --insecure --listen "127.0.0.1:$port" --admin "127.0.0.1:$((port + 1000))" --api off \
    --node-id "$name" --log-level warn "$@" >>"$OUT/$name.log" 2>&1 &
  local pid=$!
  started+=("$pid")
  echo "$pid" > "$work/$name.pid"
  wait_listen "$port"
}

node_pid() { cat "$work/$1.pid"; }

# metric NAME PORT: one value of a node's /metrics (admin on PORT+1000).
metric() {
  curl -s "http://127.0.0.1:$(($2 + 1000))/metrics" | awk -v m="$1" '$1 == m {print $2}'
}

# mark EVENTS NAME: one --events line, now.
mark() { echo "$(date +%s%N) $2" >> "$1"; log "event: $2"; }

# sources N: N loopback source addresses (127.0.0.2 ...): each pair of
# source and node port has ~28,000 ephemeral ports.
sources() {
  local out="" i
  for i in $(seq 2 $(($1 + 1))); do out="${out:+$out,}127.0.0.$i"; done
  echo "$out"
}

# json_num FILE KEY: the first number under "KEY" in a report.
json_num() { grep -m1 "\"$2\":" "$1" | sed -E 's/.*: *(-?[0-9.e+]+).*/\1/'; }
