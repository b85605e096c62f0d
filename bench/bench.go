//go:build linux

// Package bench owns `roost bench`, the load generator: it drives tens of
// thousands of WebSocket connections from one process on a few epoll loops
// (no goroutine per connection), speaks protocol v1 to one or more nodes,
// and measures what operators compare nodes by: offered against achieved
// publish rate, delivery, latency from the publisher's send timestamp to each
// receiver's receipt (the time its kernel queued the bytes; log-linear
// histograms, never samples), ack latency,
// per-room sequence integrity, closes by code, and the CPU the node, the
// database and the bench itself spend per frame. --procs coordinates several
// worker processes of itself (open files are capped per process) and merges
// their histograms and counts; --step searches for the highest sustained
// rate.
package bench

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// workerArg is the hidden subcommand a worker process runs.
const workerArg = "__worker"

// WorkerEnv is set in a worker's environment. A binary that embeds bench
// under another command line (a test binary) checks it and calls Main with
// the arguments after os.Args[1] ("bench").
const WorkerEnv = "ROOST_BENCH_WORKER"

// modeFlags is the flag set of `roost bench NAME`, whose errors and usage
// go to stderr.
func modeFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("roost bench "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parseMode parses a mode's args with fs. When the mode must stop there
// it returns false and the exit code: 0 after -h (the usage is what was
// asked for), 2 for a bad flag or an argument that is not one.
func parseMode(fs *flag.FlagSet, args []string) (int, bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, false
		}
		return 2, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "%s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		return 2, false
	}
	return 0, true
}

// Main runs `roost bench`; args are the arguments after "bench". It returns
// the exit code: 0 done, 1 the run failed (or a soak found errors), 2 bad
// usage.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		listScenarios(stdout)
		return 0
	}
	if args[0] == "proxy-backend" {
		return proxyBackend(args[1:], stdout, stderr)
	}
	if args[0] == "presence" {
		return presenceBench(args[1:], stdout, stderr)
	}
	if args[0] == "reads" {
		return readsBench(args[1:], stdout, stderr)
	}
	if args[0] == "kinds" {
		return kindsBench(args[1:], stdout, stderr)
	}
	if args[0] == "broker" {
		return brokerBench(args[1:], stdout, stderr)
	}
	worker := false
	if args[0] == workerArg {
		worker = true
		args = args[1:]
		if len(args) == 0 {
			fmt.Fprintln(stderr, "roost bench: worker needs a scenario")
			return 2
		}
	}
	sc := findScenario(args[0])
	if sc == nil {
		fmt.Fprintf(stderr, "roost bench: unknown scenario %q\n", args[0])
		listScenarios(stderr)
		return 2
	}
	p := &params{}
	fs := newFlagSet(sc, p)
	fs.SetOutput(stderr)
	if code, ok := parseMode(fs, args[1:]); !ok {
		return code
	}
	if p.pgDB != "" {
		p.pg = true
	}
	if p.runID == "" {
		p.runID = "b" + strconv.FormatInt(time.Now().UnixNano(), 36)
	}
	if err := p.validate(); err != nil {
		fmt.Fprintf(stderr, "roost bench %s: %v\n", sc.name, err)
		return 2
	}
	// A loop keeps its P through raw syscalls and its paced sleep (sys.go),
	// so the runtime (timers, the progress line, the coordinator) gets one
	// of its own unless GOMAXPROCS was set by hand.
	if os.Getenv("GOMAXPROCS") == "" && runtime.GOMAXPROCS(0) < p.loops+1 {
		runtime.GOMAXPROCS(p.loops + 1)
	}
	var targets []target
	for _, u := range splitList(p.urls) {
		t, err := parseTarget(u)
		if err != nil {
			fmt.Fprintf(stderr, "roost bench %s: %v\n", sc.name, err)
			return 2
		}
		targets = append(targets, t)
	}
	if len(targets) == 0 {
		fmt.Fprintf(stderr, "roost bench %s: --url is empty\n", sc.name)
		return 2
	}
	placed := len(targets) // connections are placed on --url only
	for _, u := range splitList(p.reconnectURLs) {
		t, err := parseTarget(u)
		if err != nil {
			fmt.Fprintf(stderr, "roost bench %s: --reconnect-url: %v\n", sc.name, err)
			return 2
		}
		targets = append(targets, t)
	}
	var sources []unix.SockaddrInet4
	for _, s := range splitList(p.srcs) {
		a, err := parseSource(s)
		if err != nil {
			fmt.Fprintf(stderr, "roost bench %s: %v\n", sc.name, err)
			return 2
		}
		sources = append(sources, a)
	}
	pl := p.buildPlan(placed, len(sources))
	if worker {
		return runWorker(p, pl, targets, sources, os.Stdin, stdout, stderr)
	}

	rep := &Report{Scenario: sc.name, Args: args, Connections: len(pl.specs), Publishers: pl.publishers,
		Procs: p.procs, Loops: p.loops}
	var progress io.Writer
	if isTerminal(stdout) && !p.jsonOut {
		progress = stdout
	}
	var d driver
	if p.procs > 1 {
		pd, err := startWorkers(p, args[1:], stderr)
		if err != nil {
			fmt.Fprintf(stderr, "roost bench %s: %v\n", sc.name, err)
			return 1
		}
		d = pd
	} else {
		d = &localDriver{p: p, specs: pl.specs, progress: progress, targets: targets, sources: sources, rooms: pl.rooms}
	}
	if p.cpuProfile != "" {
		f, err := os.Create(p.cpuProfile)
		if err != nil {
			fmt.Fprintf(stderr, "roost bench %s: cannot create --cpuprofile: %v\n", sc.name, err)
			return 1
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(stderr, "roost bench %s: cannot start --cpuprofile: %v\n", sc.name, err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}
	err := p.execute(d, pl, rep, progress)
	d.close()
	if err != nil {
		fmt.Fprintf(stderr, "roost bench %s: %v\n", sc.name, err)
		return 1
	}
	if p.reportFile != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err == nil {
			err = os.WriteFile(p.reportFile, append(b, '\n'), 0o644)
		}
		if err != nil {
			fmt.Fprintf(stderr, "roost bench %s: cannot write --report: %v\n", sc.name, err)
			return 1
		}
	}
	if p.jsonOut {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			fmt.Fprintf(stderr, "roost bench %s: cannot write JSON: %v\n", sc.name, err)
			return 1
		}
	} else {
		writeTable(stdout, rep)
	}
	if p.plot != "" {
		svg := plotSVG(rep)
		if len(rep.Series) > 0 {
			svg = plotSeries(rep)
		}
		if err := os.WriteFile(p.plot, svg, 0o644); err != nil {
			fmt.Fprintf(stderr, "roost bench %s: cannot write --plot: %v\n", sc.name, err)
			return 1
		}
	}
	if v := rep.Verdict; v != nil && !v.OK {
		fmt.Fprintf(stderr, "roost bench %s: integrity errors: %s\n", sc.name, strings.Join(v.Reasons, "; "))
		return 1
	}
	return 0
}

func listScenarios(w io.Writer) {
	fmt.Fprintln(w, "usage: roost bench <scenario> [flags]   (roost bench <scenario> -h lists its flags)")
	fmt.Fprintln(w, "scenarios:")
	for _, s := range scenarios {
		fmt.Fprintf(w, "  %-9s %s\n", s.name, s.summary)
	}
	fmt.Fprintln(w, "tools:")
	fmt.Fprintf(w, "  %-9s %s\n", "broker", "Redis CPU per message per subscribing node, N brokers as N nodes, no node (roost bench broker -h)")
	fmt.Fprintf(w, "  %-9s %s\n", "kinds", "reactions into one hot room (ack latency, node and PostgreSQL CPU per reaction) or folded history reads (roost bench kinds -h)")
	fmt.Fprintf(w, "  %-9s %s\n", "presence", "users moving between rooms: node CPU and Redis commands per presence join+leave (roost bench presence -h)")
	fmt.Fprintf(w, "  %-9s %s\n", "reads", "read positions under a publish load: ack latency and PostgreSQL CPU per publish and per read mark, unread round trips (roost bench reads -h)")
	fmt.Fprintf(w, "  %-9s %s\n", "proxy-backend", "an app backend for the proxy hooks: allows every call after --delay (prints its URL; stops after --for)")
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// fmtDur prints a latency with three significant digits.
func fmtDur(d time.Duration) string {
	switch {
	case d == 0:
		return "-"
	case d < time.Millisecond:
		return strconv.FormatFloat(float64(d)/1e3, 'f', 0, 64) + "µs"
	case d < 10*time.Millisecond:
		return strconv.FormatFloat(float64(d)/1e6, 'f', 2, 64) + "ms"
	case d < time.Second:
		return strconv.FormatFloat(float64(d)/1e6, 'f', 1, 64) + "ms"
	default:
		return strconv.FormatFloat(d.Seconds(), 'f', 2, 64) + "s"
	}
}

func writeTable(w io.Writer, rep *Report) {
	fmt.Fprintf(w, "roost bench %s: %d connections (%d publishers), %d proc(s) × %d loops, connected in %.1fs\n",
		rep.Scenario, rep.Connections, rep.Publishers, rep.Procs, rep.Loops, rep.ConnectTime)
	if rep.Scenario == "density" {
		fmt.Fprintf(w, "held %.0fs", rep.HeldFor)
		if rep.RSSAfter > 0 {
			fmt.Fprintf(w, "; node RSS %.1f MiB -> %.1f MiB: %.2f KiB per connection",
				float64(rep.RSSBefore)/(1<<20), float64(rep.RSSAfter)/(1<<20), rep.KiBPerConn)
		}
		fmt.Fprintln(w)
		fmt.Fprintf(w, "closes while holding: %s\n", fmtCloses(rep.ClosesHolding))
		return
	}
	fmt.Fprintf(w, "%10s %10s %10s %12s %8s %8s %8s %8s %8s %8s %8s %10s %10s  %s\n",
		"offered/s", "achieved/s", "sent/s", "frames/s", "deliv%", "p50", "p90", "p99", "p999", "max", "ack p99",
		"node µs/f", "bench µs/f", "result")
	for _, r := range rep.Levels {
		node := "-"
		if r.NodeUsPerFrame > 0 {
			node = strconv.FormatFloat(r.NodeUsPerFrame, 'f', 3, 64)
		}
		fmt.Fprintf(w, "%10.0f %10.0f %10.0f %12.0f %8.3f %8s %8s %8s %8s %8s %8s %10s %10.3f  %s\n",
			r.Offered, r.Achieved, r.SentRate, r.FramesPerSec, r.DeliveryPct,
			fmtDur(r.Latency.P50), fmtDur(r.Latency.P90), fmtDur(r.Latency.P99), fmtDur(r.Latency.P999), fmtDur(r.Latency.Max),
			fmtDur(r.AckLatency.P99), node, r.BenchUsPerFrame, sustainedWord(r))
	}
	if len(rep.Levels) == 0 {
		return
	}
	r := rep.Levels[len(rep.Levels)-1]
	fmt.Fprintf(w, "last level: %d sent, %d acked, %d of %d deliveries, %d frames received in %.0fs window; bench late on %d publishes\n",
		r.Sent, r.Acked, r.Delivered, r.Expected, r.RecvFrames, r.Window, r.BenchDropped)
	fmt.Fprintf(w, "ack latency: p50 %s p90 %s p99 %s p999 %s max %s\n",
		fmtDur(r.AckLatency.P50), fmtDur(r.AckLatency.P90), fmtDur(r.AckLatency.P99), fmtDur(r.AckLatency.P999), fmtDur(r.AckLatency.Max))
	fmt.Fprintf(w, "sequence: %d gaps (%d missing), %d duplicates, %d reordered, %d rooms with acked messages not received\n",
		r.Gaps, r.Missing, r.Duplicates, r.Reordered, r.AckedNotReceived)
	for _, m := range r.NotReceived {
		fmt.Fprintf(w, "  not received: room r%d acked up to seq %d; %s on url %d has seq %d (joined at %.1fs, rejoin %v)\n",
			m.Room, m.Acked, m.Member.User, m.Member.Node, m.Member.Last, m.Member.JoinedS, m.Member.Rejoin)
	}
	fmt.Fprintf(w, "closes: %s; errors: %s\n", fmtCloses(r.Closes), fmtErrors(r.Errors))
	fmt.Fprintf(w, "bench CPU %.2fs (%.3f µs per received frame)", r.BenchCPU, r.BenchUsPerFrame)
	if r.NodeCPU > 0 {
		fmt.Fprintf(w, "; node CPU %.2fs (%.3f µs per delivered frame, %.2f µs per publish)", r.NodeCPU, r.NodeUsPerFrame, r.NodeUsPerPublish)
	}
	if r.PGMeasured {
		fmt.Fprintf(w, "; postgres CPU %.2fs (%.2f µs per publish)", r.PGCPU, r.PGUsPerPublish)
	}
	fmt.Fprintln(w)
	if len(r.Nodes) > 1 || (len(r.Nodes) == 1 && rep.Scenario != "density") {
		var rss int64
		for _, n := range r.Nodes {
			fmt.Fprintf(w, "node %s (pid %d): CPU %.1f%% of a core, RSS %.1f MiB\n", n.Name, n.PID, n.CPUPct, float64(n.RSS)/(1<<20))
			rss += n.RSS
		}
		fmt.Fprintf(w, "nodes together: RSS %.1f MiB\n", float64(rss)/(1<<20))
		for _, n := range r.Watched {
			fmt.Fprintf(w, "%s (pid %d): CPU %.1f%% of a core, RSS %.1f MiB\n", n.Name, n.PID, n.CPUPct, float64(n.RSS)/(1<<20))
		}
		fmt.Fprintf(w, "bench (all its processes): CPU %.1f%% of a core\n", 100*r.BenchCPU/r.Window)
		if r.PGMeasured {
			fmt.Fprintf(w, "postgres (every process of that name on the machine): CPU %.1f%% of a core\n", 100*r.PGCPU/r.Window)
		}
	}
	if rep.HighestSustained > 0 {
		fmt.Fprintf(w, "highest sustained rate: %.0f publishes/s\n", rep.HighestSustained)
	}
	if r.Rejoins+r.Resent+r.Away > 0 {
		fmt.Fprintf(w, "reconnections: %d rejoined (%d told recovered:false, %d seqs announced lost), %d publishes sent again, %d deliveries as catch-up, %d not back at the end\n",
			r.Rejoins, r.Unrecov, r.ToldLost, r.Resent, r.Replayed, r.Away)
	}
	evs := rep.Windows
	if rep.Whole != nil {
		evs = append([]EventWindow{*rep.Whole}, evs...)
	}
	for _, ev := range evs {
		fmt.Fprintf(w, "window %6.1fs-%6.1fs %-28s ack p50 %.2fms p95 %.2fms p99 %.2fms (+%d acked after a resend); live p99 %.2fms; %d closes, %d rejoined (peak %.0f/s, p99 %.0fms, max %.0fms)\n",
			ev.T, ev.Until, ev.Name, ev.AckP50, ev.AckP95, ev.AckP99, ev.AckedAgain, ev.LatP99, ev.Closes, ev.Rejoined, ev.RejoinPerS, ev.RejoinP99, ev.RejoinMax)
	}
	for _, g := range rep.RSSTail {
		note := ""
		if g.Restarted {
			note = " (restarted inside the stretch)"
		}
		fmt.Fprintf(w, "RSS of %s from %.0fs: %.1f -> %.1f MiB (%+.1f%%)%s\n", g.Name, g.From, g.FirstMiB, g.LastMiB, g.GrowthPct, note)
	}
	if rep.Burst != nil {
		fmt.Fprintln(w, burstLine(rep.Burst))
	}
	for _, t := range rep.Targets {
		word := "met"
		if !t.Met {
			word = "MISSED"
		}
		fmt.Fprintf(w, "target %-16s %10.2f %-3s %s\n", t.Target, t.Got, t.Unit, word)
	}
	if v := rep.Verdict; v != nil {
		if v.OK {
			fmt.Fprintln(w, "verdict: every window publish acked, every delivery received once and in order, every connection back")
		} else {
			fmt.Fprintf(w, "verdict: FAILED: %s\n", strings.Join(v.Reasons, "; "))
		}
	}
}

func fmtCloses(m map[int]uint64) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for _, code := range []int{1000, 1001, 1002, 1003, 1005, 1006, 1007, 1008, 1009, 1011, 1013} {
		if n := m[code]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d×%d", n, code))
		}
	}
	for code, n := range m {
		switch code {
		case 1000, 1001, 1002, 1003, 1005, 1006, 1007, 1008, 1009, 1011, 1013:
		default:
			parts = append(parts, fmt.Sprintf("%d×%d", n, code))
		}
	}
	return strings.Join(parts, " ")
}

func fmtErrors(m map[string]uint64) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d×%s", m[k], k))
	}
	return strings.Join(parts, " ")
}
