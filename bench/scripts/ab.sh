#!/usr/bin/env bash
# Before/after pairs of the four figures a change to the publish path must
# keep (issue 24): node CPU per delivered frame in the room of 330 (300
# members + 30 publishers, 100 B bodies) at 1,000 and 8,000 msg/s, RSS per
# idle joined connection (15,000 in 100 rooms), and PostgreSQL CPU per
# publish at 10,000/s over 1,000 rooms.
#
# Each side is built from its revision alone (git archive REV | tar -x;
# go build), the bench binary is after's for both. Then N pairs, the order
# flipped in every second pair (pair 1 before first, pair 2 after first,
# ...); within a pair each figure is measured on both sides back to back.
# Every run has a fresh node pinned to CPU 1 and the bench pinned to CPU 0;
# the PostgreSQL run has a database of its own, migrated by that side's
# binary and dropped after it. The 1-minute load average is recorded before
# and after every run: figures of a loaded machine say little.
#
# Usage: bench/scripts/ab.sh BEFORE_REV AFTER_REV [--pairs N] [--short]
#                            [--only FIG,...] [--duration SECONDS]
#   --pairs N: pairs of runs (default 3; a pair takes ~4 minutes).
#   --short: one pair of tiny loads, a few seconds each (the CI form).
#   --only: some of the figures (rate1000, rate8000, density, pg): more
#     pairs of the noisy ones in the same time.
#   --duration: seconds measured per delivery run (default 20); at 1,000
#     msg/s a run's frames per write vary with timing, and a longer run
#     averages more of it.
# Prints a markdown table: each figure, each pair's before / after, the
# medians, the change in % (after against before; lower is better for all
# four), and whether the change is within 3 % or better; then the load of
# every run. Exit 1 when some run gave no figure (its cell says "-").
# Needs: Go, git, taskset, psql and PostgreSQL at ROOST_TEST_DATABASE_URL
# (default postgres://postgres@127.0.0.1:5432/test), 2 CPUs. Loopback
# only, every run bounded, cleans up nodes and databases on any exit.
# Writes $OUT/ab.md (the tables), $OUT/ab.tsv (one line per run) and every
# run's report (pP-SIDE-FIG.json) and node log.
. "$(dirname "$0")/lib.sh"

usage() { echo "usage: bench/scripts/ab.sh BEFORE_REV AFTER_REV [--pairs N] [--short]" >&2; exit 2; }
short=0 pairs=3 revs=() only="" rdur=""
while [ $# -gt 0 ]; do
  case $1 in
    --short) short=1 ;;
    --only) [ $# -ge 2 ] || usage; only=$2; shift ;;
    --only=*) only=${1#--only=} ;;
    --duration) [ $# -ge 2 ] || usage; rdur=$2; shift ;;
    --duration=*) rdur=${1#--duration=} ;;
    --pairs) [ $# -ge 2 ] || usage; pairs=$2; shift ;;
    --pairs=*) pairs=${1#--pairs=} ;;
    -*) echo "ab.sh: unknown argument $1" >&2; usage ;;
    *) revs+=("$1") ;;
  esac
  shift
done
[ ${#revs[@]} = 2 ] || usage
[[ $pairs =~ ^[1-9][0-9]*$ ]] && [ "$pairs" -le 20 ] || { echo "ab.sh: --pairs must be 1..20" >&2; exit 2; }
[ $short = 1 ] && pairs=1

if [ $short = 1 ]; then
  members=30 pubs=3 rates=(100 400) warmup=1s dur=2s
  conns=300 drooms=10 hold=1s
  prooms=20 prate=200 pwarm=1s pdur=2s
  bound=60
else
  members=300 pubs=30 rates=(1000 8000) warmup=5s dur=20s
  conns=15000 drooms=100 hold=10s
  prooms=1000 prate=10000 pwarm=3s pdur=15s
  bound=240
fi
figs=(rate${rates[0]} rate${rates[1]} density pg)
if [ -n "$rdur" ]; then
  [[ $rdur =~ ^[1-9][0-9]*$ ]] && [ "$rdur" -le 300 ] || { echo "ab.sh: --duration must be 1..300 seconds" >&2; exit 2; }
  dur=${rdur}s
  bound=$((bound + rdur))
fi
if [ -n "$only" ]; then
  kept=()
  for f in "${figs[@]}"; do [[ ",$only," == *",$f,"* ]] && kept+=("$f"); done
  [ ${#kept[@]} -gt 0 ] || { echo "ab.sh: --only names none of: ${figs[*]}" >&2; exit 2; }
  figs=("${kept[@]}")
fi
label() {
  case $1 in
    rate*) printf 'node µs per delivered frame, room of %d, %s msg/s' $((members + pubs)) "${1#rate}" ;;
    density) printf 'node RSS bytes per idle joined connection (%d in %d rooms)' $conns $drooms ;;
    pg) printf 'PostgreSQL µs per publish, %d/s over %d rooms' $prate $prooms ;;
  esac
}

need git "git"
need taskset "util-linux"
need psql "PostgreSQL client"
[ "$(nproc)" -ge 2 ] || die "needs 2 CPUs (the node on CPU 1, the bench on CPU 0)"

commit() { git -C "$repo" rev-parse --verify --quiet "$1^{commit}" || die "no such revision: $1"; }
before_c=$(commit "${revs[0]}")
after_c=$(commit "${revs[1]}")
machine start

ab_cleanup() {
  local rc=$?
  rm -f "$work/roost-before" "$work/roost-after"
  rm -rf "$work/src-before" "$work/src-after"
  set +e
  (exit $rc) # cleanup exits with the status it finds
  cleanup
}
trap ab_cleanup EXIT

# build_side SIDE COMMIT: $work/roost-SIDE from the revision's tree alone.
build_side() {
  local src=$work/src-$1
  log "building $1 = ${2:0:12}"
  mkdir -p "$src"
  git -C "$repo" archive "$2" | tar -x -C "$src"
  (cd "$src" && go build -o "$work/roost-$1" .) || die "cannot build $1 (${2:0:12})"
  rm -rf "$src"
}
build_side after "$after_c"
if [ "$before_c" = "$after_c" ]; then
  log "before = after: one build"
  cp "$work/roost-after" "$work/roost-before"
else
  build_side before "$before_c"
fi
bench_bin=$work/roost-after

# forget PID: a process stopped here; the exit trap must not kill its PID,
# which may be someone else's by then.
forget() {
  local keep=() p
  for p in "${started[@]:-}"; do [ -n "$p" ] && [ "$p" != "$1" ] && keep+=("$p"); done
  started=("${keep[@]:-}")
}

# sole_listener PORT PID: every socket listening on the port is PID's (the
# node listens with SO_REUSEPORT: another process on the port would take
# some of the bench's connections).
sole_listener() {
  command -v ss >/dev/null || return 0
  local lines
  lines=$(ss -Hltnp "sport = :$1" 2>/dev/null) || return 0
  [ -n "$lines" ] && ! echo "$lines" | grep -qv "pid=$2,"
}

load1() { cut -d' ' -f1 /proc/loadavg; }

# bounded SECONDS CMD...: CMD in the background (its PID forgotten once it
# ends), SIGKILLed after SECONDS; returns its exit code.
bounded() {
  local secs=$1 i rc=0 pid
  shift
  "$@" &
  pid=$!
  started+=("$pid")
  for i in $(seq 1 $((secs * 5))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  if kill -0 "$pid" 2>/dev/null; then
    log "still running after ${secs}s: killed"
    kill -9 "$pid" 2>/dev/null || true
  fi
  wait "$pid" || rc=$?
  forget "$pid"
  return $rc
}

# run PAIR SIDE FIG: one run on a fresh node; appends a line to ab.tsv:
# pair side fig value load-before load-after note.
tsv=$OUT/ab.tsv
printf 'pair\tside\tfigure\tvalue\tload_before\tload_after\tnote\n' > "$tsv"
run() {
  local pair=$1 side=$2 fig=$3 name=p$1-$2-$3 port pid l0=- l1=- rc=0 v=- note="" dbflags=()
  local rep=$OUT/$name.json
  bin=$work/roost-$side # make_db migrates with it, start_node serves with it
  if [ "$fig" = pg ]; then
    make_db
    dbflags=(--database-url "$db_url")
  fi
  port=$(free_ports 1)
  NODE_PREFIX="taskset -c 1" start_node "$name" "$port" --admin off --log-level error "${dbflags[@]}"
  pid=$(node_pid "$name")
  if ! kill -0 "$pid" 2>/dev/null || ! sole_listener "$port" "$pid"; then
    note="node did not start alone on port $port"
  else
    local url=ws://127.0.0.1:$port/ws args
    case $fig in
      rate*) args=(delivery --members $members --publishers $pubs --size 100 --rate "${fig#rate}" --warmup $warmup --duration $dur) ;;
      # one bench process holds the 15,000 connections, under the
      # 20,000 open files a process may have (density's --procs would
      # split them); two source addresses keep the ephemeral ports of
      # the earlier runs' TIME_WAIT out of the way.
      density) args=(density --conns $conns --rooms $drooms --hold $hold --src 127.0.0.2,127.0.0.3) ;;
      pg) args=(publish --rooms $prooms --rate $prate --warmup $pwarm --duration $pdur --pg-db "$db") ;;
    esac
    l0=$(load1)
    log "pair $pair $side $fig (load $l0)"
    GOMAXPROCS=2 bounded $bound taskset -c 0 "$bench_bin" bench "${args[@]}" --url "$url" --pid "$pid" \
      --report "$rep" >"$OUT/$name.txt" 2>&1 || rc=$?
    l1=$(load1)
    if [ $rc != 0 ]; then
      note="bench exited $rc (see $name.txt)"
    else
      case $fig in
        rate*) v=$(json_num "$rep" node_cpu_us_per_frame)
            grep -q '"sustained": true' "$rep" || note="not sustained" ;;
        density) local r0 r1 n
          r0=$(json_num "$rep" node_rss_before_bytes); r1=$(json_num "$rep" node_rss_after_bytes)
          n=$(json_num "$rep" connections)
          [ -n "$r0" ] && [ -n "$r1" ] && [ "${n:-0}" -gt 0 ] && v=$(((r1 - r0) / n)) ;;
        pg) grep -q '"pg_measured": true' "$rep" && v=$(json_num "$rep" pg_cpu_us_per_publish) ;;
      esac
      [ -n "$v" ] || v=-
      [ "$v" = - ] && note="no figure in the report"
    fi
  fi
  stop_nodes "$name"
  forget "$pid"
  if [ -n "$db" ]; then
    psql "$pg_admin" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
    db=""
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$pair" "$side" "$fig" "$v" "${l0:--}" "${l1:--}" "$note" >> "$tsv"
  log "pair $pair $side $fig: $v${note:+ ($note)} (load $l0 -> $l1)"
}

for p in $(seq 1 "$pairs"); do
  order=(before after)
  [ $((p % 2)) = 0 ] && order=(after before)
  for f in "${figs[@]}"; do
    for s in "${order[@]}"; do run "$p" "$s" "$f"; done
  done
done
machine runs-done

# The tables, from ab.tsv.
table() {
  local f
  for f in "${figs[@]}"; do echo "$f	$(label "$f")"; done |
  awk -F'\t' -v pairs="$pairs" -v tsv="$tsv" -v before="${revs[0]} (${before_c:0:9})" -v after="${revs[1]} (${after_c:0:9})" '
    function fmt(f, v) {
      if (v == "-" || v == "") return "-"
      if (f == "density") return sprintf("%d", v)
      if (f == "pg") return sprintf("%.2f", v)
      return sprintf("%.3f", v)
    }
    function median(f, s,   n, i, j, t, a) {
      n = 0
      for (i = 1; i <= pairs; i++) if ((f, s, i) in val && val[f, s, i] != "-") a[++n] = val[f, s, i] + 0
      if (n == 0) return "-"
      for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    BEGIN {
      while ((getline line < tsv) > 0) {
        split(line, c, "\t")
        if (c[1] == "pair") continue
        val[c[3], c[2], c[1]] = c[4]
        note[c[3], c[2], c[1]] = c[7]
        lb[c[3], c[2], c[1]] = c[5]; la[c[3], c[2], c[1]] = c[6]
      }
      printf "before = %s, after = %s; %d pair(s): odd pairs ran before first, even pairs after first.\n\n", before, after, pairs
      printf "| figure |"; for (i = 1; i <= pairs; i++) printf " pair %d before / after |", i
      print " median before | median after | change | within 3 % or better |"
      printf "|---|"; for (i = 1; i <= pairs; i++) printf "---|"; print "---|---|---|---|"
    }
    {
      f = $1; rows[++nr] = f; lab[f] = $2
      printf "| %s |", $2
      for (i = 1; i <= pairs; i++) {
        b = fmt(f, val[f, "before", i]); a = fmt(f, val[f, "after", i])
        if (note[f, "before", i] != "" && b != "-") { b = b "*"; star = 1 }
        if (note[f, "after", i] != "" && a != "-") { a = a "*"; star = 1 }
        printf " %s / %s |", b, a
      }
      mb = median(f, "before"); ma = median(f, "after")
      if (mb == "-" || ma == "-" || mb == 0) { ch = "-"; ok = "n/a" }
      else { d = (ma - mb) / mb * 100; ch = sprintf("%+.1f %%", d); ok = d <= 3 ? "yes" : "NO" }
      printf " %s | %s | %s | %s |\n", fmt(f, mb), fmt(f, ma), ch, ok
    }
    END {
      if (star) print "\n\\* not sustained (the bench fell behind or a delivery was missing): CPU of a run that did less than asked."
      printf "\nLoad average (1 min) before -> after each run:\n\n"
      printf "| figure |"; for (i = 1; i <= pairs; i++) printf " pair %d before / after |", i
      print ""
      printf "|---|"; for (i = 1; i <= pairs; i++) printf "---|"; print ""
      for (k = 1; k <= nr; k++) {
        f = rows[k]; printf "| %s |", lab[f]
        for (i = 1; i <= pairs; i++) printf " %s -> %s / %s -> %s |", lb[f, "before", i], la[f, "before", i], lb[f, "after", i], la[f, "after", i]
        print ""
      }
    }'
}
table | tee "$OUT/ab.md"
missing=$(awk -F'\t' 'NR > 1 && $4 == "-"' "$tsv" | wc -l)
if [ "$missing" -gt 0 ]; then
  awk -F'\t' 'NR > 1 && $4 == "-" {print "no figure: pair " $1 " " $2 " " $3 ": " $7}' "$tsv" >&2
  die "$missing run(s) gave no figure"
fi
log "ab: done"
