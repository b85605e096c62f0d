#!/usr/bin/env bash
# A reconnect storm: node B holds 15,000 connections (150 rooms of 100),
# node A 4,000 others (40 rooms of 100); both share PostgreSQL and a private
# Redis. B is SIGKILLed, and its 15,000 clients come back to A within their
# retry window (a jittered 1-5 s, then doubling), rejoining with since, so
# A ends with 19,000 (under the open-file limit of 20,000). Reported: the
# rate A took them back at (rejoined/s, per second), the time until all
# were back, A's members' live p99 before and during the storm, and the
# store reads A made for the rejoins (reads per rejoin, from its metrics).
#
# Usage: bench/scripts/storm.sh [--short]
#   --short: 1,500 storm clients and 400 others (the CI form).
# Needs: Go, PostgreSQL (ROOST_TEST_DATABASE_URL), psql, redis-server, curl.
# Loopback only, bounded, cleans up. Writes $OUT/storm-{others,storm}.{json,svg,txt}.
. "$(dirname "$0")/lib.sh"

short=0
[ "${1:-}" = "--short" ] && short=1
if [ $short = 1 ]; then
  storm_rooms=15 other_rooms=4 duration=20 kill_at=8 lead=3
else
  storm_rooms=150 other_rooms=40 duration=60 kill_at=20 lead=12
fi
size=100
need curl "curl"
events=$OUT/storm.events
: > "$events"

build
make_db
start_redis
read -r pa pb < <(free_ports 2)
flags=(--loops 1 --publish-workers 2 --database-url "$db_url" --redis-url "redis://127.0.0.1:$redis_port"
  --connections $(((storm_rooms + other_rooms) * size + 100)))
start_node A "$pa" "${flags[@]}"
start_node B "$pb" "${flags[@]}"
log "A on $pa, B on $pb; $((storm_rooms * size)) clients on B, $((other_rooms * size)) on A"

common=(--active 0.05 --interval 1s --sizes 100:90,2048:10 --warmup 3s --duration ${duration}s --drain 10s
  --series 1s --events "$events" --rss-tail 10s --connect-timeout 3m)
GOMAXPROCS=2 "$bin" bench chat --url "ws://127.0.0.1:$pa/ws" --rooms $other_rooms --room-size $size "${common[@]}" \
  --pid "A=@$work/A.pid" --verdict --report "$OUT/storm-others.json" --plot "$OUT/storm-others.svg" \
  > "$OUT/storm-others.txt" 2>&1 &
others=$!
started+=("$others")
GOMAXPROCS=2 "$bin" bench chat --url "ws://127.0.0.1:$pb/ws" --rooms $storm_rooms --room-size $size "${common[@]}" \
  --src 127.0.0.2 --reconnect next --reconnect-url "ws://127.0.0.1:$pa/ws" --retry-min 1s --retry-max 5s \
  --report "$OUT/storm-storm.json" --plot "$OUT/storm-storm.svg" > "$OUT/storm-storm.txt" 2>&1 &
storm=$!
started+=("$storm")

t0=$(date +%s)
sleep $((lead + kill_at))
reads0=$(metric roost_join_reads_total "$pa"); rejoins0=$(metric roost_join_replays_total "$pa")
acc0=$(metric roost_accepted_total "$pa")
mark "$events" "B SIGKILL: storm"
kill -9 "$(node_pid B)"
# A's accepted connections, once a second, while the storm lasts
: > "$OUT/storm-accepts.txt"
for i in $(seq 1 20); do
  sleep 1
  echo "$i $(metric roost_accepted_total "$pa")" >> "$OUT/storm-accepts.txt"
done
set +e
wait "$others"; rc1=$?
wait "$storm"; rc2=$?
set -e
reads1=$(metric roost_join_reads_total "$pa"); rejoins1=$(metric roost_join_replays_total "$pa")
acc1=$(metric roost_accepted_total "$pa")
cat "$OUT/storm-storm.txt"
echo "--- A's own members during the storm:"
cat "$OUT/storm-others.txt"
peak=$(awk 'NR > 1 {d = $2 - prev; if (d > m) m = d} {prev = $2} END {print m + 0}' "$OUT/storm-accepts.txt")
echo "A accepted $((${acc1%.*} - ${acc0%.*})) connections after the kill; peak $peak/s"
if [ -n "$reads0" ] && [ -n "$reads1" ]; then
  r=$(awk -v a="$reads0" -v b="$reads1" -v c="$rejoins0" -v d="$rejoins1" \
    'BEGIN {n = d - c; per = 0; if (n > 0) per = (b - a) / n; printf "%d store reads for %d catch-up pages: %.3f reads per rejoin", b - a, n, per}')
  echo "A: $r" | tee "$OUT/storm-reads.txt"
else
  echo "A: no join read metrics (roost_join_reads_total, roost_join_replays_total)"
fi
[ $rc1 = 0 ] || die "A's members' run failed (exit $rc1)"
[ $rc2 = 0 ] || die "the storm clients' run failed (exit $rc2)"
log "storm: done"
