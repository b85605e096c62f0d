#!/usr/bin/env bash
# The design documents' delivery experiment at 1, 2 and 3 nodes: one room of
# 300 members + 30 publishers spread round-robin over the nodes, every node
# held to the same CPU share (cgroup v1 cpu quota, pinned), sharing one
# PostgreSQL database and one Redis. For each N it finds the highest
# sustained publish rate (--step), then reruns that level once with every
# node's CPU read from /proc to give node CPU per delivered frame.
#
# Usage (as root, from the repository): bench/scripts/delivery-nodes.sh [QUOTA_PCT]
# Needs: PostgreSQL on 127.0.0.1:5432 (user postgres), Redis on :6379,
# cgroup v1 cpu controller at /sys/fs/cgroup/cpu. Loopback only; every run
# is bounded (--step-max, 10 s windows) and stops by itself.
set -euo pipefail
quota=${1:-25}
bin=$(mktemp -d)/roost
go build -o "$bin" .
db=roost_figs_$$
psql -h 127.0.0.1 -U postgres -d test -qc "CREATE DATABASE $db"
url="postgres://postgres@127.0.0.1:5432/$db?sslmode=disable"
"$bin" migrate --database-url "$url" >/dev/null 2>&1
pids=()
cleanup() {
  for p in "${pids[@]:-}"; do kill -9 "$p" 2>/dev/null || true; done
  for k in 0 1 2; do rmdir "/sys/fs/cgroup/cpu/roost-figs-$k" 2>/dev/null || true; done
  psql -h 127.0.0.1 -U postgres -d test -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" || true
}
trap cleanup EXIT

cpu_ticks() { # utime+stime of the given PIDs, in clock ticks
  local t=0
  for p in "$@"; do t=$((t + $(awk '{print $14+$15}' "/proc/$p/stat"))); done
  echo "$t"
}

for n in 1 2 3; do
  pids=(); urls=""
  for k in $(seq 0 $((n - 1))); do
    cg=/sys/fs/cgroup/cpu/roost-figs-$k
    mkdir -p "$cg"
    echo 10000 > "$cg/cpu.cfs_period_us"
    echo $((quota * 100)) > "$cg/cpu.cfs_quota_us"
    port=$((19300 + 10 * n + k))
    # (killed with -9 between runs: a draining node would keep its
    # SO_REUSEPORT listener and share the port with the next run)
    sh -c "echo \$\$ > $cg/cgroup.procs; exec taskset -c $((1 - k % 2)) $bin serve --insecure --database-url '$url' \
      --redis-url 'redis://127.0.0.1:6379?prefix=figs$$n' --loops 1 --listen 127.0.0.1:$port --admin off --api off --log-level error" &
    pids+=($!)
    urls="${urls:+$urls,}ws://127.0.0.1:$port/ws"
  done
  sleep 2
  step=$(GOMAXPROCS=2 "$bin" bench delivery --url "$urls" --members 300 --publishers 30 \
    --step --step-start 500 --step-factor 1.25 --step-max 40000 --warmup 2s --duration 6s 2>&1)
  best=$(echo "$step" | sed -n 's/^highest sustained rate: \([0-9]*\).*/\1/p')
  [ -n "$best" ] || { echo "nodes=$n: no sustained level"; echo "$step" | tail -5; continue; }
  echo "nodes=$n step row at the highest sustained level:"
  echo "$step" | awk -v b="$best" '$1 == b'

  # The fixed level again, with every node's CPU sampled over exactly the
  # 10 s measurement window (after the 3 s warm-up; connecting takes ms).
  out=$(mktemp)
  GOMAXPROCS=2 "$bin" bench delivery --url "$urls" --members 300 --publishers 30 \
    --rate "$best" --warmup 3s --duration 10s > "$out" 2>&1 &
  bp=$!
  sleep 3.2
  before=$(cpu_ticks "${pids[@]}")
  sleep 10
  after=$(cpu_ticks "${pids[@]}")
  wait "$bp" || true
  row=$(sed -n 3p "$out")
  fps=$(echo "$row" | awk '{print $4}')
  echo "nodes=$n highest_sustained=$best $(echo "$row" | awk '{print "frames/s="$4, "deliv%="$5, "p50="$6, "p99="$8, "result="$NF}')" \
    "node_cpu_us_per_frame=$(echo "scale=3; ($after-$before)*10000/($fps*10)" | bc)"
  for p in "${pids[@]}"; do kill -9 "$p"; done
  wait 2>/dev/null || true
  sleep 1
done
