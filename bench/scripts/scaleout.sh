#!/usr/bin/env bash
# Scale-out on equal CPU shares, as the design documents' engine measured
# it: 1, 2, 3 and 4 nodes, each confined to the same quota (25% of a core
# by default) by a cgroup of its own, all pinned to CPU 1; one room of 300
# members + 30 publishers spread round-robin over the nodes (every node
# holds members and publishers, so every message crosses the broker); the
# nodes share a private Redis and one PostgreSQL database. For each node
# count, a --step run finds the highest sustained publish rate (achieved =
# offered, 100% delivered, no slow-consumer close), and its frames/s per
# vCPU (frames/s at that level / (nodes x quota)).
#
# Linear scale-out means each count's highest sustained rate >= 0.95 x N x
# one node's; the design documents' engine reached 30,000 frames/s per vCPU.
#
# The quota: cgroup v2 cpu.max when /sys/fs/cgroup is the unified hierarchy,
# else cgroup v1 cpu.cfs_quota_us/cpu.cfs_period_us (its equivalent), with a
# 10 ms period: a node throttled for the rest of a period then waits at most
# 7.5 ms, not 75 ms with the default 100 ms period.
#
# Usage (as root): bench/scripts/scaleout.sh [--short]
#   --short: 1 and 2 nodes, levels 200, 400, 800 publishes/s of 1+3 s (CI).
#   COUNTS (default "1 2 3 4"), QUOTA_PCT (25), STEP_START (400),
#   STEP_FACTOR (1.25), STEP_MAX (40000) in the environment override the
#   full run. The bench runs on CPU 0 (GOMAXPROCS=2).
# Needs: Go, root (cgroups), taskset, jq, PostgreSQL (ROOST_TEST_DATABASE_URL),
# psql, redis-server. Loopback only; bounded; removes its cgroups and
# database on any exit.
# Writes $OUT/scaleout-N.{json,svg,txt} per node count and $OUT/scaleout.json
# (one row per count); ends with one SCALEOUT line per count, a SUMMARY
# line and the path of scaleout.json (RESULTS).
. "$(dirname "$0")/lib.sh"

parse_short "$@"
quota=${QUOTA_PCT:-25}
if [ $short = 1 ]; then
  counts=(1 2) start=200 factor=2 max=800 warmup=1s duration=3s
else
  counts=(${COUNTS:-1 2 3 4}) start=${STEP_START:-400} factor=${STEP_FACTOR:-1.25} max=${STEP_MAX:-40000} warmup=2s duration=6s
fi
need taskset "util-linux"
need jq "jq"
[ "$(nproc)" -ge 2 ] || die "needs 2 CPUs: the nodes on CPU 1, the bench on CPU 0"
[ "$(id -u)" = 0 ] || die "needs root: each node gets a cgroup of its own"

# The cgroup root: v2 when /sys/fs/cgroup is cgroup2 (its cpu controller
# enabled for our parent), else v1's cpu hierarchy.
period=10000
if [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then
  cgv=2 cgroot=/sys/fs/cgroup/roost-scaleout-$$
  grep -qw cpu /sys/fs/cgroup/cgroup.controllers || die "cgroup v2 without the cpu controller"
  echo +cpu > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
  mkdir "$cgroot"
  echo +cpu > "$cgroot/cgroup.subtree_control"
elif [ -d /sys/fs/cgroup/cpu ] && [ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]; then
  cgv=1 cgroot=/sys/fs/cgroup/cpu/roost-scaleout-$$
  mkdir "$cgroot"
else
  die "no cgroup cpu controller (v2 cpu.max or v1 cpu.cfs_quota_us)"
fi
remove_cgroups() {
  local d
  for d in "$cgroot"/n*/; do [ -d "$d" ] && rmdir "$d" 2>/dev/null; done
  rmdir "$cgroot" 2>/dev/null || true
}
exit_hooks+=(remove_cgroups)

# confine NAME PID: a cgroup of NAME's own with the quota, PID moved into it
# (all of its threads).
confine() {
  local d=$cgroot/$1
  mkdir -p "$d"
  if [ $cgv = 2 ]; then
    echo "$((quota * period / 100)) $period" > "$d/cpu.max"
  else
    echo $period > "$d/cpu.cfs_period_us"
    echo $((quota * period / 100)) > "$d/cpu.cfs_quota_us"
  fi
  echo "$2" > "$d/cgroup.procs"
}

build
make_db
start_redis
log "cgroup v$cgv, quota $quota% of a core per node (period ${period} µs), nodes on CPU 1, bench on CPU 0"

rows=()
one=""
for n in "${counts[@]}"; do
  ports=($(free_ports "$n"))
  urls="" pids="" names=()
  for k in $(seq 0 $((n - 1))); do
    NODE_PREFIX="taskset -c 1" start_node "n$k" "${ports[$k]}" --loops 1 --database-url "$db_url" \
      --redis-url "redis://127.0.0.1:$redis_port"
    confine "n$k" "$(node_pid "n$k")"
    urls="${urls:+$urls,}ws://127.0.0.1:${ports[$k]}/ws"
    pids="${pids:+$pids,}n$k=@$work/n$k.pid"
    names+=("n$k")
  done
  log "$n node(s): step from $start/s x $factor up to $max/s"
  set +e
  GOMAXPROCS=2 taskset -c 0 "$bin" bench delivery --url "$urls" --members 300 --publishers 30 --size 100 \
    --step --step-start "$start" --step-factor "$factor" --step-max "$max" --warmup $warmup --duration $duration \
    --pid "$pids" --watch "redis=@$work/redis.pid" --pg-db "$db" \
    --report "$OUT/scaleout-$n.json" --plot "$OUT/scaleout-$n.svg" > "$OUT/scaleout-$n.txt" 2>&1
  rc=$?
  set -e
  stop_nodes "${names[@]}"
  for k in $(seq 0 $((n - 1))); do rmdir "$cgroot/n$k" 2>/dev/null || true; done
  [ $rc = 0 ] || { cat "$OUT/scaleout-$n.txt"; die "roost bench delivery exited $rc with $n node(s)"; }
  # the highest sustained level's row; none: the first level broke
  row=$(jq -c --argjson n "$n" --argjson q "$quota" '
    (.highest_sustained_per_s // 0) as $h
    | ([.levels[] | select(.offered_per_s == $h)][0]) as $l
    | {nodes: $n, quota_pct: $q, highest_sustained_per_s: $h,
       frames_per_s: ($l.frames_per_s // 0),
       frames_per_s_per_vcpu: (($l.frames_per_s // 0) / ($n * $q / 100) | floor),
       p99_ms: (($l.latency.p99_ns // 0) / 1e6),
       node_us_per_frame: ($l.node_cpu_us_per_frame // 0), node_cpu_pct: ([$l.nodes[]?.cpu_pct] | add // 0 | . * 10 | round / 10),
       first_broken: ([.levels[] | select(.sustained | not)][0].broken // "none up to --step-max")}' "$OUT/scaleout-$n.json")
  [ -n "$one" ] || one=$(echo "$row" | jq '.highest_sustained_per_s')
  row=$(echo "$row" | jq -c --argjson one "$one" '. + {vs_n_times_one: (if $one > 0 then (.highest_sustained_per_s / (.nodes * $one) * 1000 | round / 1000) else null end)}')
  rows+=("$row")
  echo "$row" | jq -r '"SCALEOUT \(.nodes) node(s) at \(.quota_pct)% each: highest sustained \(.highest_sustained_per_s)/s, \(.frames_per_s | floor) frames/s, \(.frames_per_s_per_vcpu) frames/s per vCPU, p99 \(.p99_ms * 100 | round / 100) ms, node \(.node_us_per_frame * 1000 | round / 1000) µs/frame, nodes \(.node_cpu_pct)% of a core together; \(.vs_n_times_one) x (N x one node); next level: \(.first_broken)"'
done
printf '%s\n' "${rows[@]}" | jq -s '{quota_pct: '"$quota"', period_us: '"$period"', cgroup: '"$cgv"', counts: .}' > "$OUT/scaleout.json"
jq -r '"SUMMARY scaleout: " + ([.counts[] | "\(.nodes): \(.highest_sustained_per_s)/s (\(.vs_n_times_one)x)"] | join(", ")) + "; frames/s per vCPU " + ([.counts[] | .frames_per_s_per_vcpu | tostring] | join(", "))' "$OUT/scaleout.json"
echo "RESULTS scaleout: $OUT/scaleout.json"
log "scaleout: done"
