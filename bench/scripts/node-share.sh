#!/usr/bin/env bash
# One node's share of the 100,000-user chat (chat-100k.sh divided by six):
# one node on one core (taskset -c 1) holding 16,700 connections in 167
# rooms of 100, 10% of the users sending every 5 s (334 publishes/s, 33,400
# frames/s), bodies 90% 100 B and 10% 2 KB, its messages through a private
# Redis (the broker every node of the full chat shares) and stored in
# PostgreSQL, for 5 minutes; the bench on the other core (taskset -c 0), so
# that what the node gets is what one node of the full run would get,
# without the five others on the same two cores.
#
# Targets: publish -> receipt p99 <= 15 ms, node RSS <= 45 MiB, 100%
# delivered (and 0 gaps or duplicates: --verdict).
#
# Usage (from anywhere): bench/scripts/node-share.sh [--short]
#   --short: 2,000 connections (20 rooms), 15 s, every user of the active
#   tenth sending every second (the CI form; the same targets are reported,
#   only delivery and the verdict are held to).
#   ROOMS, DURATION, PROCS in the environment override the full run's shape;
#   NODE_GOGC (default 15; chat-100k.sh runs 25) is the node's GOGC; NODE_ENV
#   (e.g. GODEBUG=memprofilerate=1 for an exact heap profile from the
#   admin port, port + 1000) is added to the node's environment only.
# Needs: Go, taskset, PostgreSQL (ROOST_TEST_DATABASE_URL), psql,
# redis-server. Loopback only; bounded; cleans up on any exit.
# Writes $OUT/node-share.{json,svg,txt} and the node's log; ends with a
# SUMMARY line and the report's path (RESULTS).
. "$(dirname "$0")/lib.sh"

parse_short "$@"
if [ $short = 1 ]; then
  rooms=20 procs=1 srcs=1 interval=1s warmup=3s duration=15s rsstail=10s
else
  rooms=${ROOMS:-167} procs=${PROCS:-2} srcs=2 interval=5s warmup=20s duration=${DURATION:-5m} rsstail=4m
fi
size=100
need taskset "util-linux"
[ "$(nproc)" -ge 2 ] || die "needs 2 CPUs: the node on CPU 1, the bench on CPU 0"

build
make_db
start_redis
port=$(free_ports 1)
# one loop on its one core; GOGC 15: the heap is mostly the connections'
# long-lived state (12 of 19 MB live) and the load allocates ~3 MB/s, so
# the default 100 lets it double between collections and 25 still kept
# the node at 45.8 MiB of RSS; 15 took 1 MiB more off for about one
# point of its core (docs/tuning.md; docs/bench-notes/2026-12-06.md,
# "rss29")
GOGC=${NODE_GOGC:-15} NODE_PREFIX="${NODE_ENV:+env $NODE_ENV }taskset -c 1" start_node n0 "$port" --loops 1 --database-url "$db_url" \
  --redis-url "redis://127.0.0.1:$redis_port" --connections $((rooms * size + 100))
log "node up on CPU 1; $((rooms * size)) connections over $procs bench process(es) on CPU 0"

set +e
GOMAXPROCS=2 taskset -c 0 "$bin" bench chat --url "ws://127.0.0.1:$port/ws" --src "$(sources $srcs)" --procs $procs \
  --rooms $rooms --room-size $size --active 0.1 --interval $interval --sizes 100:90,2048:10 \
  --warmup $warmup --duration $duration --drain 10s --connect-timeout 3m \
  --pid "n0=@$work/n0.pid" --watch "redis=@$work/redis.pid" --pg-db "$db" --series 5s --rss-tail $rsstail --verdict \
  --targets 'delivery>=100,p99<=15ms,rss<=45MiB' \
  --report "$OUT/node-share.json" --plot "$OUT/node-share.svg" | tee "$OUT/node-share.txt"
rc=${PIPESTATUS[0]}
set -e
stop_nodes n0
json_add "$OUT/node-share.json" pg_deadlocks "$(pg_deadlocks)"
summary node-share "$OUT/node-share.json"
[ $rc = 0 ] || die "roost bench chat exited $rc (integrity errors or a failed run: see above)"
log "node-share: done"
