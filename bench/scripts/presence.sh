#!/usr/bin/env bash
# Presence under churn: two nodes on a private Redis hold 15,000 users over
# 100 rooms (three bench processes of 5,000), with one presence subscriber
# per room; users then move from room to room at 200/s for 15 s (each move
# is a presence join and a presence leave), and, as the A/B baseline, the
# same traffic as reloads (leave and rejoin the same room within the grace
# period: no presence change). Reported per move: the nodes' CPU and the
# private Redis's commands (INFO commandstats, commands that scripts run
# included), each net of the same window without moves.
#
# Usage: bench/scripts/presence.sh [--short]
#   --short: 1,500 users over 10 rooms at 50/s for 5 s.
# Needs: Go, redis-server. Loopback only, bounded, cleans up. Writes
# $OUT/presence-{move,reload}-N.txt.
. "$(dirname "$0")/lib.sh"

short=0
[ "${1:-}" = "--short" ] && short=1
if [ $short = 1 ]; then
  users=1500 rooms=10 rate=50 dur=5s rounds=1
else
  users=15000 rooms=100 rate=200 dur=15s rounds=${ROUNDS:-2}
fi

build
start_redis
read -r pa pb < <(free_ports 2)
flags=(--loops 1 --redis-url "redis://127.0.0.1:$redis_port" --connections $((users + 200)))
start_node A "$pa" "${flags[@]}"
start_node B "$pb" "${flags[@]}"
pids="$(node_pid A),$(node_pid B)"
for round in $(seq 1 "$rounds"); do
  for mode in move reload; do
    extra=()
    [ $mode = reload ] && extra=(--reload)
    log "round $round: $mode"
    echo "loadavg before: $(cat /proc/loadavg)" > "$OUT/presence-$mode-$round.txt"
    timeout 300 "$bin" bench presence --url "ws://127.0.0.1:$pa/ws,ws://127.0.0.1:$pb/ws" --node-pids "$pids" \
      --redis "127.0.0.1:$redis_port" --users $users --rooms $rooms --procs 3 --rate $rate --for $dur "${extra[@]}" \
      | tee -a "$OUT/presence-$mode-$round.txt"
    echo "loadavg after: $(cat /proc/loadavg)" >> "$OUT/presence-$mode-$round.txt"
    sleep 6 # the last users' grace period, before the next round joins
  done
done
