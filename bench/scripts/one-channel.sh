#!/usr/bin/env bash
# The design documents' one-channel load: one room of 6,000 listeners and
# 100 msg/s of 500-byte bodies (600,000 frames/s) on one node pinned to one
# core (CPU 1; the bench on CPU 0), for a minute: 0 loss, p99, node CPU and
# RSS. Then the rate is raised level by level (x1.5) to the highest one held
# with p99 <= 50 ms, every publish acked and every frame delivered.
# The node runs on its memory store and in-process broker: one node, as in
# the design documents' run.
#
# Usage: bench/scripts/one-channel.sh [--short] [--steer]
#   --short: 600 listeners, 10 s, two step levels (the CI form).
#   --steer: run in a network namespace of its own whose loopback steers
#     received packets to the bench's CPUs (Receive Packet Steering), so
#     that the listeners' TCP receive runs on the bench's core, as it would
#     at a real network's far end. On one loopback the kernel runs the
#     receiver's side of every send in the sender's context: nearly half
#     of the node's CPU per frame is then the bench's receive
#     (docs/bench-notes/2026-12-04.md, "one-channel: where a pass's CPU goes"). The
#     machine's own loopback is not touched. Needs root (unshare, a sysfs
#     mount in the namespace) and ip (iproute2); the reports say
#     "steered": true.
# Needs: Go, taskset (util-linux). Loopback only, bounded, cleans up.
# Writes $OUT/one-channel.{json,svg,txt} and one-channel-step.{json,svg,txt};
# each run ends with a SUMMARY line and its report's path (RESULTS).
short=0 steer=0
for a in "$@"; do
  case $a in
  --short) short=1 ;;
  --steer) steer=1 ;;
  *) echo "one-channel.sh: unknown argument $a (want --short, --steer)" >&2; exit 2 ;;
  esac
done
if [ $steer = 1 ] && [ -z "${ONE_CHANNEL_STEERED:-}" ]; then
  # The CPUs the bench runs on, as the hexadecimal mask rps_cpus takes.
  n=$(nproc); mask=1
  [ "$n" -gt 2 ] && mask=$(printf '%x' $(( (1 << (n - 1)) - 1 )))
  command -v unshare >/dev/null && command -v ip >/dev/null || { echo "one-channel.sh --steer needs unshare and ip" >&2; exit 1; }
  exec unshare --net --mount -- bash -c '
    set -e
    m=$1; shift
    mount -t sysfs sysfs /sys
    ip link set lo up
    echo "$m" > /sys/class/net/lo/queues/rx-0/rps_cpus
    ONE_CHANNEL_STEERED=$m exec bash "$@"' steer "$mask" "$0" "$@"
fi
. "$(dirname "$0")/lib.sh"
if [ $short = 1 ]; then
  members=600 duration=10s warmup=2s step_dur=3s step_start=200 step_max=400 factor=2
else
  # from a quarter of the design documents' rate, so that a limit below it
  # is found too
  members=6000 duration=60s warmup=5s step_dur=10s step_start=5 step_max=40000 factor=1.5
fi
need taskset "util-linux"
cpus=$(nproc)
node_cpu=$((cpus - 1)) bench_cpus=0
[ "$cpus" -gt 2 ] && bench_cpus=0-$((cpus - 2))

build
port=$(free_ports 1)
NODE_PREFIX="taskset -c $node_cpu" start_node one "$port" --connections $((members + 100))
url=ws://127.0.0.1:$port/ws
pid="one=@$work/one.pid"
log "node pinned to CPU $node_cpu; bench on CPU $bench_cpus; $members listeners${ONE_CHANNEL_STEERED:+; received packets steered to CPUs (mask) $ONE_CHANNEL_STEERED}"

set +e
# ten publishers share the rate: a publisher is one connection of a real
# app's backend, and ten keep each one's bucket smooth
GOMAXPROCS=2 taskset -c $bench_cpus "$bin" bench delivery --url "$url" --members $members \
  --publishers 10 --publishers-join=false --rate 100 --size 500 \
  --warmup $warmup --duration $duration --drain 5s --pid "$pid" --series 1s --rss-tail $duration --verdict \
  --targets 'delivery>=100,p99<=50ms' \
  --report "$OUT/one-channel.json" --plot "$OUT/one-channel.svg" | tee "$OUT/one-channel.txt"
rc=${PIPESTATUS[0]}
[ -n "${ONE_CHANNEL_STEERED:-}" ] && json_add "$OUT/one-channel.json" steered true
summary one-channel "$OUT/one-channel.json"
[ $rc = 0 ] || die "the 100 msg/s run exited $rc"

GOMAXPROCS=2 taskset -c $bench_cpus "$bin" bench delivery --url "$url" --members $members \
  --publishers 10 --publishers-join=false --size 500 \
  --step --step-start $step_start --step-factor $factor --step-max $step_max --max-p99 50ms \
  --warmup 2s --duration $step_dur --drain 5s --pid "$pid" \
  --report "$OUT/one-channel-step.json" --plot "$OUT/one-channel-step.svg" | tee "$OUT/one-channel-step.txt"
rc=${PIPESTATUS[0]}
set -e
[ -n "${ONE_CHANNEL_STEERED:-}" ] && json_add "$OUT/one-channel-step.json" steered true
summary one-channel-step "$OUT/one-channel-step.json"
[ $rc = 0 ] || die "the step run exited $rc"
log "one-channel: done"
