#!/usr/bin/env bash
# The design documents' chat load: 100,000 connections over 6 nodes, 1,000
# rooms of 100 users, 10% of the users sending every 5 s (2,000 msg/s,
# 200,000 frames/s), bodies 90% 100 B and 10% 2 KB, for 5 minutes. The nodes
# share one PostgreSQL database and a private Redis, so that every room
# spans every node. Each node holds ~16,700 connections and each of the six
# bench processes as many: under the per-process open-file limit.
#
# Targets: 100% delivered, 0 gaps or duplicates, p99 publish -> receipt
# <= 15 ms, total node RSS <= 300 MB.
#
# Usage (from anywhere): bench/scripts/chat-100k.sh [--short]
#   --short: 2 nodes, 2,000 connections, 15 s (the CI form).
#   NODES, ROOMS, PROCS, SRCS, DURATION in the environment override the
#   full run's shape (a smaller run of the same kind on a smaller machine);
#   NODE_GOGC (default 25) is the nodes' GOGC.
# Needs: Go, PostgreSQL reachable at ROOST_TEST_DATABASE_URL (default
# postgres://postgres@127.0.0.1:5432/test), psql, redis-server. Loopback
# only; bounded in time; stops by itself and cleans up on any exit.
# Writes $OUT/chat-100k.{json,svg,txt} and each node's log; the report also
# holds pg_deadlocks, the deadlocks PostgreSQL detected in the run's
# database. Ends with a SUMMARY line and the report's path (RESULTS).
. "$(dirname "$0")/lib.sh"

short=0
[ "${1:-}" = "--short" ] && short=1
if [ $short = 1 ]; then
  nodes=2 rooms=20 procs=2 srcs=2 interval=1s warmup=3s duration=15s rsstail=10s
else
  nodes=${NODES:-6} rooms=${ROOMS:-1000} procs=${PROCS:-6} srcs=${SRCS:-12} interval=5s warmup=20s
  duration=${DURATION:-5m} rsstail=4m
fi
size=100

build
make_db
start_redis
ports=($(free_ports "$nodes"))
urls="" pids=""
for k in $(seq 0 $((nodes - 1))); do
  # one loop each: six nodes on two cores, and each keeps a P for Go's
  # netpoller; two publish workers each keep PostgreSQL connections few.
  # GOGC 25: a node's heap is mostly its connections' state, ~0.9 KiB
  # each and long-lived, while the garbage comes from the publish path at
  # a few KB per publish; Go's default 100 lets the heap grow to twice the
  # connections' state between collections (docs/bench-notes/2026-12-01.md, "Memory
  # per connection under a chat load").
  GOGC=${NODE_GOGC:-25} start_node "n$k" "${ports[$k]}" --loops 1 --publish-workers 2 --database-url "$db_url" \
    --redis-url "redis://127.0.0.1:$redis_port" --connections $((rooms * size / nodes + 100))
  urls="${urls:+$urls,}ws://127.0.0.1:${ports[$k]}/ws"
  pids="${pids:+$pids,}n$k=@$work/n$k.pid"
done
log "$nodes nodes up; $((rooms * size)) connections over $procs bench processes"

set +e
GOMAXPROCS=2 "$bin" bench chat --url "$urls" --src "$(sources $srcs)" --procs $procs \
  --rooms $rooms --room-size $size --active 0.1 --interval $interval --sizes 100:90,2048:10 \
  --warmup $warmup --duration $duration --drain 10s --connect-timeout 5m \
  --pid "$pids" --watch "redis=@$work/redis.pid" --pg --series 5s --rss-tail $rsstail --verdict \
  --targets 'delivery>=100,p99<=15ms,rss<=300MB' \
  --report "$OUT/chat-100k.json" --plot "$OUT/chat-100k.svg" | tee "$OUT/chat-100k.txt"
rc=${PIPESTATUS[0]}
set -e
names=()
for k in $(seq 0 $((nodes - 1))); do names+=("n$k"); done
stop_nodes "${names[@]}"
json_add "$OUT/chat-100k.json" pg_deadlocks "$(pg_deadlocks)"
summary chat-100k "$OUT/chat-100k.json"
[ $rc = 0 ] || die "roost bench chat exited $rc (integrity errors or a failed run: see above)"
log "chat-100k: done"
