# Shared by the full-size scripts (chat-100k.sh, one-channel.sh, soak.sh):
# build the binary, start nodes, a private Redis and a fresh PostgreSQL
# database on loopback, and take all of it down again on exit, however the
# script ends. Source it; it sets -euo pipefail.
#
# Environment: ROOST_TEST_DATABASE_URL (default
# postgres://postgres@127.0.0.1:5432/test?sslmode=disable) is where the
# run's own database is created; OUT is where results go (default a new
# directory under /tmp, printed at the end). KEEP_DB=1 keeps the run's database
# (its name is printed at the end) to read the store after a failed verdict.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=$(mktemp -d /tmp/roost-run.XXXXXX)
OUT=${OUT:-$work/out}
mkdir -p "$OUT"
bin=$work/roost
pg_admin=${ROOST_TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}
started=()   # PIDs this script started (nodes, Redis), killed on exit by PID
exit_hooks=() # functions run on exit after those are gone (e.g. removing cgroups)
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
  for h in "${exit_hooks[@]:-}"; do [ -n "$h" ] && "$h" || true; done   # once the processes are gone (cgroups)
  if [ -n "$db" ] && [ -z "${KEEP_DB:-}" ]; then
    psql "$pg_admin" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
  fi
  [ -n "${KEEP_DB:-}" ] && [ -n "$db" ] && echo "database kept: $db"
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
# node's admin port is its port + 1000, so both must be free (a node whose
# admin port is taken, e.g. by this run's Redis, exits at once).
free_ports() {
  local n=$1 out=() p
  p=$((20000 + RANDOM % 10000))
  while [ ${#out[@]} -lt "$n" ]; do
    p=$((p + 1))
    port_free "$p" && port_free $((p + 1000)) && [ "$p" != "$redis_port" ] && [ $((p + 1000)) != "$redis_port" ] && out+=("$p")
  done
  echo "${out[@]}"
}

# wait_listen PORT [SECONDS [PID [LOG]]]: until something listens on PORT.
# Given the process that should, it stops waiting as soon as that process
# is gone and shows the end of its log: a node that exits at start (a
# taken port, a refused database) says why instead of a silent timeout.
wait_listen() {
  local i
  for i in $(seq 1 $((${2:-30} * 10))); do
    port_free "$1" || return 0
    if [ -n "${3:-}" ] && ! kill -0 "$3" 2>/dev/null; then
      [ -n "${4:-}" ] && tail -n 20 "$4" >&2
      die "the process meant to listen on 127.0.0.1:$1 exited${4:+ (its log: $4)}"
    fi
    sleep 0.1
  done
  [ -n "${4:-}" ] && tail -n 20 "$4" >&2
  die "nothing listening on 127.0.0.1:$1 after ${2:-30} s${4:+ (its log: $4)}"
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
  wait_listen "$redis_port" 30 "$redis_pid" "$work/redis/redis.log"
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
  wait_listen "$port" 30 "$pid" "$OUT/$name.log"
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

# stop_nodes NAME...: SIGTERM the nodes and wait for them (SIGKILL after
# 20 s), then for their PostgreSQL backends to exit: a backend reports its
# statistics (pg_stat_database) when it exits.
stop_nodes() {
  local n p i
  for n in "$@"; do kill -TERM "$(node_pid "$n")" 2>/dev/null || true; done
  for n in "$@"; do
    p=$(node_pid "$n")
    for i in $(seq 1 200); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  [ -n "$db" ] || return 0
  for i in $(seq 1 50); do
    [ "$(psql "$pg_admin" -qtAc "SELECT count(*) FROM pg_stat_activity WHERE datname = '$db'" 2>/dev/null)" = 0 ] && break
    sleep 0.1
  done
}

# pg_deadlocks: the deadlocks PostgreSQL detected in the run's database
# (each cost its transactions deadlock_timeout, 1 s by default, and one of
# them its statement). Read it after stop_nodes.
pg_deadlocks() {
  psql "$pg_admin" -qtAc "SELECT deadlocks FROM pg_stat_database WHERE datname = '$db'" 2>/dev/null || echo null
}

# json_add FILE KEY VALUE: a top-level field added to a report (the bench
# writes the opening brace alone on the first line).
json_add() { if [ -s "$1" ]; then sed -i "1s/^{\$/{\n  \"$2\": ${3:-null},/" "$1"; fi; }

# summary NAME FILE: one line of the report's main figures (needs jq; the
# report has all of them either way), and where the report is.
summary() {
  if [ -s "$2" ] && command -v jq >/dev/null; then
    jq -r --arg n "$1" '.levels[0] as $l | def ms(x): if x then (x / 1e6 * 100 | round / 100 | tostring) + " ms" else "-" end;
      "SUMMARY \($n): \(.connections) connections; acked \($l.acked) of \($l.sent) sent (\($l.achieved_per_s // 0 | floor)/s of \($l.offered_per_s // 0 | floor)/s offered); " +
      "delivered \($l.delivery_pct // 0 | . * 1000 | round / 1000)% gaps \($l.gaps) missing \($l.missing) duplicates \($l.duplicates) reordered \($l.reordered); " +
      "latency p99 \(ms($l.latency.p99_ns)); ack p95 \(ms($l.ack_latency.p95_ns)) p99 \(ms($l.ack_latency.p99_ns)); " +
      "node RSS \(([$l.nodes[]?.rss_bytes] | add // 0) / 1048576 | floor) MiB; postgres \(if $l.pg_cpu_us_per_publish then ($l.pg_cpu_us_per_publish | round | tostring) + " µs/publish" else "-" end); " +
      "deadlocks \(.pg_deadlocks // "-"); " +
      (if (.args // [] | any(. == "--step")) then "step: \(.levels | length) level(s), \(.levels[0].offered_per_s | floor)/s to \(.levels[-1].offered_per_s | floor)/s (figures above: the first), highest sustained \(.highest_sustained_per_s // "none")\(if .highest_sustained_per_s then "/s" else "" end), last level: \(.levels[-1].broken // "sustained"); " else "" end) +
      "verdict \(if .verdict then (if .verdict.ok then "ok" else "FAILED" end) else "-" end); " +
      "targets \([.targets[]? | "\(.target) got \(.got * 100 | round / 100)\(.unit) \(if .met then "met" else "MISSED" end)"] | join(", "))"' "$2" 2>/dev/null ||
      echo "SUMMARY $1: (cannot read $2)"
  else
    echo "SUMMARY $1: no summary (no report, or no jq): see $2"
  fi
  echo "RESULTS $1: $2"
}

# parse_short sets short=1 for --short, the one argument the scripts that
# use it take; anything else ends the script.
parse_short() {
  short=0
  for a in "$@"; do
    case $a in
      --short) short=1 ;;
      *) die "unknown argument $a (want --short)" ;;
    esac
  done
}
