#!/usr/bin/env bash
# A soak with faults: 2 nodes x 15,000 connections sharing PostgreSQL and a
# private Redis, 15 minutes of chat at 6,000 publishes/s (3,000 rooms of 10,
# a fifth of the users sending every second: 60,000 frames/s), and on a
# schedule in the first five minutes:
#   Redis restarted; PostgreSQL's backends of the run's database terminated;
#   node n1 SIGKILLed and started again 2 s later (its clients come back
#   after their jittered retry, 1-5 s, and rejoin with since); node n0
#   drained (SIGTERM) and started again; with --cluster, Redis runs as a
#   cluster of three masters (the restart is of one of them) and a fourth
#   shard is added and a quarter of the slots moved to it under load.
# The last ten minutes run without faults: each node's RSS must stay flat.
#
# Verdict (exit 1 otherwise): every publish acked and stored once (the
# database holds exactly the publishes the bench made, each room's seqs
# 1..n), every member received every message exactly once and in order (or
# was told recovered:false), every connection back at the end, node RSS
# growth <= 5% over the last 10 minutes. Ack p95/p99 over the run and per
# fault window are in the report, and the plot marks the faults.
#
# Usage: bench/scripts/soak.sh [--short] [--cluster]
#   --short: 2 x 1,000 connections, 30 s, the same faults 4-6 s apart (CI).
#   ROOMS, DURATION (seconds), RSSTAIL (a Go duration) and FAULTS_AT (five
#   offsets in seconds) in the environment override the full run's shape,
#   e.g. a 60 s run at the full rate: DURATION=60 RSSTAIL=30s
#   FAULTS_AT="10 20 30 40 50" (its RSS verdict then means little).
# Needs: Go, PostgreSQL (ROOST_TEST_DATABASE_URL), psql, redis-server
# (and redis-cli for --cluster). Loopback only, bounded, cleans up.
# Writes $OUT/soak.{json,svg,txt}, the events file and every node's log; the
# report also holds pg_deadlocks (PostgreSQL's count for the run's
# database). Ends with a SUMMARY line and the report's path (RESULTS).
. "$(dirname "$0")/lib.sh"

short=0 cluster=0
for a in "$@"; do
  case $a in
    --short) short=1 ;;
    --cluster) cluster=1 ;;
    *) die "unknown argument $a (want --short, --cluster)" ;;
  esac
done
if [ $short = 1 ]; then
  # the nodes drain in 2 s and hint retries of at most 2 s, so that every
  # client is back inside the 30 s window
  rooms=200 warmup=3s duration=30 rsstail=8s lead=4 drain=10s
  at=(5 9 13 19 23)
  short_flags=(--drain 2s --retry-max 2s)
else
  rooms=${ROOMS:-3000} warmup=20s duration=${DURATION:-900} rsstail=${RSSTAIL:-10m} lead=25 drain=20s
  at=(${FAULTS_AT:-60 120 180 240 280})
  short_flags=(--drain 5s)
fi
size=10
events=$OUT/soak.events
: > "$events"

build
make_db

redis_url() { echo "redis://127.0.0.1:$redis_port"; }
if [ $cluster = 1 ]; then
  need redis-cli "Redis"
  # A cluster node also listens on its port + 10000 (the cluster bus).
  # free_ports' range (20000-29999) would put that bus port in the
  # ephemeral range, where the run's own outgoing connections can take it
  # before the fourth node starts mid-run (it then cannot bind: "nothing
  # listening"). These ports keep both below it and apart from the nodes'.
  cports=()
  cp=$((14000 + RANDOM % 3000))
  while [ ${#cports[@]} -lt 4 ]; do
    cp=$((cp + 1))
    port_free "$cp" && port_free $((cp + 10000)) && cports+=("$cp")
  done
  start_cluster_node() {
    mkdir -p "$work/redis/$1"
    redis-server --port "$1" --bind 127.0.0.1 --cluster-enabled yes --cluster-config-file "$work/redis/$1/nodes.conf" \
      --save "" --appendonly no --dir "$work/redis/$1" --logfile "$work/redis/$1/redis.log" &
    started+=("$!")
    [ -s "$work/redis.pid" ] || echo "$!" > "$work/redis.pid"
    wait_listen "$1"
  }
  for p in "${cports[@]:0:3}"; do start_cluster_node "$p"; done
  redis-cli --cluster create 127.0.0.1:${cports[0]} 127.0.0.1:${cports[1]} 127.0.0.1:${cports[2]} \
    --cluster-replicas 0 --cluster-yes >"$OUT/cluster-create.log" 2>&1 || die "cannot create the Redis Cluster"
  for _ in $(seq 1 50); do
    redis-cli -p "${cports[0]}" cluster info | grep -q cluster_state:ok && break
    sleep 0.2
  done
  redis_port=${cports[0]}
  redis_url() { echo "redis://127.0.0.1:${cports[0]},127.0.0.1:${cports[1]},127.0.0.1:${cports[2]}"; }
else
  start_redis
fi

ports=($(free_ports 2))
node_flags=(--loops 1 --publish-workers 2 "${short_flags[@]}" --database-url "$db_url" --redis-url "$(redis_url)"
  --connections $((rooms * size / 2 + 100)))
start_node n0 "${ports[0]}" "${node_flags[@]}"
start_node n1 "${ports[1]}" "${node_flags[@]}"
urls="ws://127.0.0.1:${ports[0]}/ws,ws://127.0.0.1:${ports[1]}/ws"
log "2 nodes up; $((rooms * size)) connections; $((rooms * size / 5)) publishes/s for ${duration}s"

GOMAXPROCS=2 "$bin" bench chat --url "$urls" --src "$(sources 2)" --procs 2 \
  --rooms $rooms --room-size $size --active 0.2 --interval 1s --sizes 100:90,2048:10 \
  --reconnect same --retry-min 1s --retry-max 5s \
  --warmup $warmup --duration ${duration}s --drain $drain --connect-timeout 5m \
  --pid "n0=@$work/n0.pid,n1=@$work/n1.pid" --watch "redis=@$work/redis.pid" --pg \
  --series 1s --events "$events" --rss-tail $rsstail --targets 'ack-p95<=6.6ms,ack-p99<=50ms' \
  --report "$OUT/soak.json" --plot "$OUT/soak.svg" > "$OUT/soak.txt" 2>&1 &
bench=$!
started+=("$bench")

# the faults, at their offsets from the bench's start (the bench places
# each event on its own clock from the times written here)
t0=$(date +%s)
sleep_until() { local d=$(($1 + lead - ($(date +%s) - t0))); [ $d -gt 0 ] && sleep $d || true; }

sleep_until "${at[0]}"
if [ $cluster = 1 ]; then
  # one master of the cluster: it keeps its identity (nodes.conf) and its
  # slots, and the nodes' cluster client finds it again
  mark "$events" "redis master restart"
  kill -9 "$(cat "$work/redis.pid")"
  wait "$(cat "$work/redis.pid")" 2>/dev/null || true
  rm -f "$work/redis.pid"
  sleep 1
  start_cluster_node "${cports[0]}"
else
  mark "$events" "redis restart"
  stop_redis
  sleep 1
  start_redis
fi

sleep_until "${at[1]}"
mark "$events" "postgres backends terminated"
psql "$pg_admin" -qtAc "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = '$db' AND pid <> pg_backend_pid()" >>"$OUT/faults.log" 2>&1 || true

sleep_until "${at[2]}"
mark "$events" "n1 SIGKILL"
kill -9 "$(node_pid n1)"
wait "$(node_pid n1)" 2>/dev/null || true
sleep 2
start_node n1 "${ports[1]}" "${node_flags[@]}"
mark "$events" "n1 started"

sleep_until "${at[3]}"
mark "$events" "n0 drain (SIGTERM)"
kill -TERM "$(node_pid n0)"
wait "$(node_pid n0)" 2>/dev/null || true
start_node n0 "${ports[0]}" "${node_flags[@]}"
mark "$events" "n0 started"

if [ $cluster = 1 ]; then
  sleep_until "${at[4]}"
  mark "$events" "redis shard added, slots moving"
  start_cluster_node "${cports[3]}"
  redis-cli --cluster add-node 127.0.0.1:${cports[3]} 127.0.0.1:${cports[0]} >>"$OUT/faults.log" 2>&1
  sleep 2
  new_id=$(redis-cli -p "${cports[3]}" cluster myid)
  redis-cli --cluster reshard 127.0.0.1:${cports[0]} --cluster-from all --cluster-to "$new_id" \
    --cluster-slots 4096 --cluster-yes >>"$OUT/faults.log" 2>&1 || log "reshard failed: see faults.log"
  mark "$events" "slots moved"
fi

log "faults done; steady load until the end"
set +e
wait "$bench"
rc=$?
set -e
cat "$OUT/soak.txt"
[ -s "$OUT/soak.json" ] || die "the bench wrote no report (exit $rc)"
stop_nodes n0 n1
deadlocks=$(pg_deadlocks)
json_add "$OUT/soak.json" pg_deadlocks "$deadlocks"

# stored once: the database holds exactly the distinct publishes the bench
# made (it counts each once, however often it sent it again), each room's
# seqs 1..n
sent=$(json_num "$OUT/soak.json" total_sent)
stored=$(psql "$db_url" -qtAc "SELECT count(*) FROM messages")
holey=$(psql "$db_url" -qtAc "SELECT count(*) FROM (SELECT room_id FROM messages GROUP BY room_id HAVING max(seq) <> count(*)) x")
log "stored $stored messages for $sent distinct publishes; $holey rooms with holes in their seqs; $deadlocks deadlocks in PostgreSQL"
fail=0
[ "$rc" = 0 ] || { log "bench verdict failed (exit $rc)"; fail=1; }
[ "$stored" = "$sent" ] && [ "$holey" = 0 ] || { log "stored-once check failed"; fail=1; }
# RSS flat over the tail: every node within 5% (a node restarted inside the
# tail is reported, not judged; --short's tail is too short to tell a leak
# from the restarted node filling up again, so it only reports)
while read -r name growth restarted; do
  if [ $short = 0 ] && [ "$restarted" != "true" ] && awk -v g="$growth" 'BEGIN{exit !(g > 5)}'; then
    log "RSS of $name grew $growth% over the tail"; fail=1
  fi
done < <(tr -d '\n ' < "$OUT/soak.json" | grep -o '"rss_tail":\[[^]]*\]' | grep -o '{[^}]*}' |
  sed -E 's/.*"name":"([^"]*)".*"growth_pct":(-?[0-9.e+-]+)(,"restarted":(true))?.*/\1 \2 \4/' | grep -v '^redis ')
summary soak "$OUT/soak.json"
[ $fail = 0 ] || die "soak verdict: FAILED"
log "soak verdict: ok"
