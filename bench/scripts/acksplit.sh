#!/usr/bin/env bash
# Where an ack waits: the soak's shape (2 nodes, rooms of 10, a share of the
# users publishing every second, 100 B and 2 KB bodies, PostgreSQL and a
# private Redis) without its faults, scaled down and bounded, and the ack's
# time split read from the nodes' roost_ack_phase_seconds{phase} (queue,
# pipeline, window, commit, answer, broker, inbox, write: docs/operations.md) over the
# measurement window, beside the bench's own ack latency and every
# process's CPU (node, bench, Redis, PostgreSQL).
#
# Usage: bench/scripts/acksplit.sh [--short]
#   --short: 2 x 500 connections, 250 publishes/s, 10 s (CI).
#   CONNS (per node, default 3000), RATE (publishes/s over both nodes,
#   default 1500), DURATION (seconds, default 60), NODE_FLAGS (more
#   `roost serve` flags, e.g. "--batch-window 2ms") and PG_PARAMS
#   (PostgreSQL settings of the nodes' sessions, added to their database
#   URL, e.g. "synchronous_commit=off"; the server's own configuration is
#   not changed) in the environment shape the run.
# Needs: Go, PostgreSQL (ROOST_TEST_DATABASE_URL), psql, redis-server, curl.
# Loopback only, bounded, cleans up. Writes $OUT/acksplit.{json,txt,svg}
# (the bench's report, table and per-second plot), $OUT/acksplit-split.txt
# (the split and the scheduler's line), and the nodes' metrics and threads'
# scheduling before and after the window; ends with a SUMMARY line.
. "$(dirname "$0")/lib.sh"

parse_short "$@"
if [ $short = 1 ]; then
  conns=500 rate=250 duration=10 warmup=2s
else
  conns=${CONNS:-3000} rate=${RATE:-1500} duration=${DURATION:-60} warmup=5s
fi
need curl "curl"
size=10
rooms=$((2 * conns / size))
active=$(awk -v r="$rate" -v c=$((2 * conns)) 'BEGIN { a = r / c; if (a > 1) a = 1; printf "%.4f", a }')

build
make_db
start_redis
# The PostgreSQL settings that bear on a commit's latency, as the server has
# them (this script changes none).
psql "$pg_admin" -qtAc "SELECT name || '=' || setting || coalesce(unit, '') FROM pg_settings WHERE name IN
  ('synchronous_commit', 'fsync', 'wal_sync_method', 'commit_delay', 'commit_siblings', 'wal_writer_delay',
   'wal_writer_flush_after', 'full_page_writes', 'wal_level') ORDER BY name" > "$OUT/pg-settings.txt" 2>&1 || true
log "PostgreSQL: $(tr '\n' ' ' < "$OUT/pg-settings.txt")"

node_db_url=$db_url
if [ -n "${PG_PARAMS:-}" ]; then
  case $db_url in *\?*) node_db_url="$db_url&$PG_PARAMS" ;; *) node_db_url="$db_url?$PG_PARAMS" ;; esac
fi
ports=($(free_ports 2))
# shellcheck disable=SC2206 # NODE_FLAGS is a list of flags
node_flags=(--loops 1 --publish-workers 2 --database-url "$node_db_url" --redis-url "redis://127.0.0.1:$redis_port"
  --connections $((conns + 100)) ${NODE_FLAGS:-})
start_node n0 "${ports[0]}" "${node_flags[@]}"
start_node n1 "${ports[1]}" "${node_flags[@]}"
urls="ws://127.0.0.1:${ports[0]}/ws,ws://127.0.0.1:${ports[1]}/ws"
log "2 nodes up (${NODE_FLAGS:-default flags}${PG_PARAMS:+; PostgreSQL sessions: $PG_PARAMS}); $((2 * conns)) connections in $rooms rooms of $size; $rate publishes/s for ${duration}s"

GOMAXPROCS=2 "$bin" bench chat --url "$urls" --src "$(sources 2)" --procs 2 \
  --rooms $rooms --room-size $size --active "$active" --interval 1s --sizes 100:90,2048:10 \
  --warmup $warmup --duration ${duration}s --drain 5s --connect-timeout 2m \
  --pid "n0=@$work/n0.pid,n1=@$work/n1.pid" --watch "redis=@$work/redis.pid" --pg-db "$db" \
  --series 1s --report "$OUT/acksplit.json" --plot "$OUT/acksplit.svg" > "$OUT/acksplit.txt" 2>&1 &
bench=$!
started+=("$bench")

scrape() {
  local p
  for p in "${ports[@]}"; do curl -s "http://127.0.0.1:$((p + 1000))/metrics"; done | grep -E '^roost_ack_(phase|latency)_seconds' > "$1"
}
# sched NAME PID...: NAME, then the time the processes' threads ran and
# waited runnable for a CPU (ns, /proc/PID/task/*/schedstat): the
# scheduler's share of their latency.
sched() {
  local name=$1
  shift
  cat $(for p in "$@"; do echo /proc/"$p"/task/*/schedstat; done) 2>/dev/null |
    awk -v n="$name" '{ r += $1; w += $2 } END { printf "%s %d %d\n", n, r, w }'
}
# schedall FILE: the nodes', Redis', the run's PostgreSQL backends' and the
# machine's CPU pressure (PSI: µs some task waited for a CPU), now.
schedall() {
  {
    sched nodes "$(node_pid n0)" "$(node_pid n1)"
    sched redis "$(cat "$work/redis.pid")"
    # shellcheck disable=SC2046 # a list of PIDs
    sched postgres $(psql "$pg_admin" -qtAc "SELECT pid FROM pg_stat_activity WHERE datname = '$db'" 2>/dev/null)
    echo "psi $(awk '/^some/ { sub("total=", "", $5); print $5 }' /proc/pressure/cpu 2>/dev/null || echo 0) 0"
    echo "clock $(date +%s%N) 0"
  } > "$1"
}
# The window starts once every connection is in and the bench's warmup is
# over (its warmup counts from then too).
for _ in $(seq 1 1200); do
  n=0
  for p in "${ports[@]}"; do n=$((n + $(metric roost_connections_total_open "$p" || echo 0))); done
  [ "$n" -ge $((2 * conns)) ] && break
  kill -0 "$bench" 2>/dev/null || break
  sleep 0.1
done
sleep "${warmup%s}"
scrape "$OUT/metrics.before"
schedall "$OUT/sched.before"
set +e
wait "$bench"
rc=$?
set -e
scrape "$OUT/metrics.after"
schedall "$OUT/sched.after"
cat "$OUT/acksplit.txt"
[ -s "$OUT/acksplit.json" ] || die "the bench wrote no report (exit $rc)"
stop_nodes n0 n1

# The split: per phase, the window's observations (after - before, both
# nodes), their mean and quantiles interpolated within the buckets.
awk '
  function key(line) { return line }
  FNR == 1 { f++ }
  /_bucket\{/ {
    name = $1; sub(/_bucket\{.*/, "", name)
    ph = "total"; if (match($1, /phase="[a-z]+"/)) ph = substr($1, RSTART + 7, RLENGTH - 8)
    if (name == "roost_ack_latency_seconds") ph = "read-to-queued"
    match($1, /le="[^"]+"/); le = substr($1, RSTART + 4, RLENGTH - 5)
    v[ph, le] += (f == 1 ? -$2 : $2); les[ph] = les[ph] " " le; phases[ph] = 1
  }
  /_sum/ && !/_bucket/ {
    ph = "total"; if (match($1, /phase="[a-z]+"/)) ph = substr($1, RSTART + 7, RLENGTH - 8)
    if ($1 ~ /^roost_ack_latency_seconds/) ph = "read-to-queued"
    s[ph] += (f == 1 ? -$2 : $2)
  }
  END {
    split("queue pipeline window commit answer broker inbox write read-to-queued", order, " ")
    printf "%-15s %9s %9s %9s %9s %9s\n", "phase", "acks", "mean_ms", "p50_ms", "p95_ms", "p99_ms"
    for (i = 1; i <= 9; i++) {
      ph = order[i]; if (!(ph in phases)) continue
      n = split(les[ph], L, " "); m = 0; delete seen
      for (j = 1; j <= n; j++) if (!(L[j] in seen)) { seen[L[j]] = 1; B[++m] = L[j] }
      tot = v[ph, "+Inf"]
      printf "%-15s %9d %9.3f", ph, tot, (tot > 0 ? 1000 * s[ph] / tot : 0)
      split("0.5 0.95 0.99", Q, " ")
      for (q = 1; q <= 3; q++) {
        want = Q[q] * tot; prev = 0; prevc = 0; out = -1
        for (j = 1; j <= m; j++) {
          c = v[ph, B[j]]
          if (c >= want && tot > 0) {
            if (B[j] == "+Inf") { out = prev } else { out = prev + (B[j] - prev) * (c > prevc ? (want - prevc) / (c - prevc) : 1) }
            break
          }
          if (B[j] != "+Inf") prev = B[j]; prevc = c
        }
        printf " %9.3f", out * 1000
      }
      printf "\n"
    }
  }' "$OUT/metrics.before" "$OUT/metrics.after" > "$OUT/acksplit-split.txt"
# The scheduler: per second of the window (the bench's drain included),
# how long each group's threads ran and waited runnable, and the share of
# it some task of the machine waited for a CPU.
awk 'FNR == 1 { f++ } { r[$1] += (f == 1 ? -$2 : $2); w[$1] += (f == 1 ? -$3 : $3) }
  END {
    secs = r["clock"] / 1e9
    printf "scheduler over %.1fs:", secs
    for (k in r) if (k != "clock" && k != "psi") printf " %s ran %.1f ms/s waited %.1f ms/s for a CPU;", k, r[k] / 1e6 / secs, w[k] / 1e6 / secs
    if (r["psi"] > 0) printf " machine: some task waiting for a CPU %.0f%% of the time", 100 * r["psi"] / 1e6 / secs
    printf "\n"
  }' "$OUT/sched.before" "$OUT/sched.after" >> "$OUT/acksplit-split.txt"
log "the ack's time split over the window (both nodes; read-to-queued is roost_ack_latency_seconds):"
cat "$OUT/acksplit-split.txt" >&2
summary acksplit "$OUT/acksplit.json"
[ "$rc" = 0 ] || die "bench failed (exit $rc)"
log "acksplit: done; RESULTS $OUT"
