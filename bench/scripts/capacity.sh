#!/usr/bin/env bash
# The game chat's capacity marks: 18,000 publishes/s sustained through
# PostgreSQL for 5 minutes (2 nodes sharing one database and a private
# Redis, 3,000 rooms, each with its publisher on one node and its receiver
# on the other), then 90,000 publishes offered within one second on top of
# it (bench --burst: each publisher its share, evenly over the second).
#
# Targets: ack p95 <= 10 ms over the 5 minutes before the burst; nothing
# lost: every publish acked, those answered `overloaded` acked on their
# retry (the bench sends a refused publish again with its id after a
# jittered, doubling wait), and delivered once and in order (--verdict);
# reported: the time from the burst's start until its last publish is
# acked (the backlog gone), the refusals, and the others' ack p50/p95/p99
# and everyone's receipt p99 meanwhile.
#
# Usage (from anywhere): bench/scripts/capacity.sh [--short]
#   --short: 300 rooms at 1,000/s for 8 s with a burst of 5,000 at 4 s (CI).
#   ROOMS, RATE, STEADY (seconds before the burst), BURST, AFTER (seconds
#   after it) in the environment override the full run's shape; NODE_FLAGS
#   adds serve flags to both nodes (e.g. NODE_FLAGS="--batch-window 2ms").
# Needs: Go, PostgreSQL (ROOST_TEST_DATABASE_URL), psql, redis-server, jq.
# Loopback only; bounded; cleans up on any exit.
# Writes $OUT/capacity.{json,svg,txt} and each node's log; ends with a
# BURST line, a SUMMARY line and the report's path (RESULTS).
. "$(dirname "$0")/lib.sh"

parse_short "$@"
if [ $short = 1 ]; then
  rooms=300 rate=1000 steady=4 burst=5000 after=4 warmup=2s series=250ms drain=30s
else
  rooms=${ROOMS:-3000} rate=${RATE:-18000} steady=${STEADY:-300} burst=${BURST:-90000} after=${AFTER:-60} warmup=20s series=1s drain=60s
fi
need jq "jq"

build
make_db
start_redis
ports=($(free_ports 2))
for k in 0 1; do
  start_node "n$k" "${ports[$k]}" --database-url "$db_url" --redis-url "redis://127.0.0.1:$redis_port" \
    --connections $((rooms + 100)) ${NODE_FLAGS:-}
done
log "2 nodes up; $rooms rooms at $rate/s for ${steady}s, then $burst publishes within 1 s, then ${after}s more"

set +e
GOMAXPROCS=2 "$bin" bench publish --url "ws://127.0.0.1:${ports[0]}/ws,ws://127.0.0.1:${ports[1]}/ws" \
  --rooms "$rooms" --rate "$rate" --size 100 --warmup $warmup --duration $((steady + 1 + after))s --drain $drain \
  --burst "$burst" --burst-at "${steady}s" --burst-over 1s --connect-timeout 3m \
  --pid "n0=@$work/n0.pid,n1=@$work/n1.pid" --watch "redis=@$work/redis.pid" --pg-db "$db" \
  --series $series --verdict --targets 'delivery>=100' \
  --report "$OUT/capacity.json" --plot "$OUT/capacity.svg" | tee "$OUT/capacity.txt"
rc=${PIPESTATUS[0]}
set -e
stop_nodes n0 n1
json_add "$OUT/capacity.json" pg_deadlocks "$(pg_deadlocks)"
jq -r '.burst as $b | .levels[0] as $l | def r(x): (x // 0) * 100 | round / 100;
  "BURST capacity: before the burst ack p50 \(r($b.before.ack_p50_ms)) p95 \(r($b.before.ack_p95_ms)) p99 \(r($b.before.ack_p99_ms)) ms (target p95 <= 10 ms: \(if ($b.before.ack_p95_ms // 1e9) <= 10 then "met" else "MISSED" end)); " +
  "burst \($b.offered) offered over \($b.over_s)s: \($b.sent) sent, \($b.acked) acked; " +
  "refusals \($l.errors_by_code.overloaded // 0) overloaded, \($l.resent // 0) sent again; " +
  (if ($b.backlog_gone_s // 0) > 0 then "backlog gone \(r($b.backlog_gone_s)) s after the burst began; meanwhile others ack p50 \(r($b.during.ack_p50_ms)) p95 \(r($b.during.ack_p95_ms)) p99 \(r($b.during.ack_p99_ms)) ms, every receipt p99 \(r($b.during.p99_ms)) ms"
   else "backlog NOT gone: \($b.acked) of \($b.offered) acked when the drain ended" end)' \
  "$OUT/capacity.json" || true
summary capacity "$OUT/capacity.json"
[ $rc = 0 ] || die "roost bench publish exited $rc (a publish lost, or a failed run: see above)"
log "capacity: done"
