//go:build linux

package bench

import (
	"flag"
	"fmt"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// params holds every flag of every scenario; each scenario registers the
// ones it reads, with its own defaults.
type params struct {
	scenario string

	urls, srcs     string
	app            string
	secret         string // the app's secret: mint a token per connection (secure nodes)
	secretFile     string
	warmup         time.Duration
	duration       time.Duration
	drain          time.Duration
	hold           time.Duration
	connectTimeout time.Duration
	pids, watch    procList // the nodes under test, and other processes to report on
	series         time.Duration
	events         string
	rssTail        time.Duration
	reconnect      string
	reconnectURLs  string
	reportFile     string
	verdict        bool
	targets        string
	retryMin       time.Duration
	retryMax       time.Duration
	pg             bool
	pgDB           string
	jsonOut        bool
	plot           string
	procs          int
	loops          int
	dialConc       int
	transport      string // ws or sse: how receivers listen
	signals        bool   // delivery: publishers send signals, not pubs
	cpuProfile     string

	step       bool
	stepStart  float64
	stepFactor float64
	stepAdd    float64
	stepMax    float64
	stepP99    time.Duration

	members, publishers, rooms, conns, users, roomSize int
	rate                                               float64
	size, longSize                                     int
	longShare, active                                  float64
	interval                                           time.Duration
	pubJoin                                            bool
	sizes                                              string
	sizeMix                                            []sizeWeight // parsed --sizes

	// --burst: extra publishes offered on top of the rate (burst.go)
	burst              int
	burstAt, burstOver time.Duration
	readMarks          bool // receivers mark each message read (readmarks.go)

	// set by the parent for worker processes
	workerIndex, workerCount int
	runID                    string
}

// scenario is one `roost bench` subcommand.
type scenario struct {
	name    string
	summary string
	flags   func(fs *flag.FlagSet, p *params)
}

var scenarios = []scenario{
	{"delivery", "fan-out in one room: --members receivers plus --publishers publishing into it", func(fs *flag.FlagSet, p *params) {
		fs.BoolVar(&p.signals, "signals", false, "publishers send signals (typing: never stored, no ack) instead of messages; the node needs --signal-rate 0 or a rate per publisher above --rate/--publishers")
		fs.IntVar(&p.members, "members", 300, "receivers joined to the room")
		fs.IntVar(&p.publishers, "publishers", 30, "publishers (joined too unless --publishers-join=false)")
		fs.BoolVar(&p.pubJoin, "publishers-join", true, "publishers are members of the room and receive as well")
		fs.Float64Var(&p.rate, "rate", 1000, "publishes per second, all publishers together")
		fs.IntVar(&p.size, "size", 100, "body size in bytes")
	}},
	{"publish", "the store-bound test: --rooms rooms of one publisher and one receiver (on different nodes when several --url)", func(fs *flag.FlagSet, p *params) {
		fs.IntVar(&p.rooms, "rooms", 1000, "rooms, each with one publisher and one receiver")
		fs.Float64Var(&p.rate, "rate", 1000, "publishes per second, all rooms together")
		fs.IntVar(&p.size, "size", 100, "body size in bytes")
	}},
	{"hotroom", "many publishers into one room", func(fs *flag.FlagSet, p *params) {
		fs.IntVar(&p.publishers, "publishers", 1000, "publishers into the room")
		fs.IntVar(&p.members, "members", 10, "receivers joined to the room")
		fs.BoolVar(&p.pubJoin, "publishers-join", false, "publishers are members of the room and receive as well")
		fs.Float64Var(&p.rate, "rate", 5000, "publishes per second, all publishers together")
		fs.IntVar(&p.size, "size", 100, "body size in bytes")
	}},
	{"density", "--conns idle connections, each joined to one of --rooms rooms; node RSS per connection with --pid", func(fs *flag.FlagSet, p *params) {
		fs.IntVar(&p.conns, "conns", 15000, "connections")
		fs.IntVar(&p.rooms, "rooms", 100, "rooms the connections join, round-robin")
		fs.DurationVar(&p.hold, "hold", 10*time.Second, "how long to hold the connections after the last joined")
	}},
	{"mixed", "the chat pattern: --active share of --users each sending every --interval, 90% short and 10% long bodies", func(fs *flag.FlagSet, p *params) {
		fs.IntVar(&p.users, "users", 10000, "users, one connection each (100,000 needs --procs and --src)")
		fs.Float64Var(&p.active, "active", 0.1, "share of users that publish")
		fs.DurationVar(&p.interval, "interval", 3*time.Second, "time between two messages of an active user")
		fs.IntVar(&p.roomSize, "room-size", 50, "users per room")
		fs.IntVar(&p.size, "short", 100, "short body size in bytes")
		fs.IntVar(&p.longSize, "long", 2048, "long body size in bytes")
		fs.Float64Var(&p.longShare, "long-share", 0.1, "share of long messages")
	}},
	{"chat", "many rooms: --active share of --rooms x --room-size users each sending every --interval, bodies mixed by --sizes", func(fs *flag.FlagSet, p *params) {
		fs.IntVar(&p.rooms, "rooms", 1000, "rooms")
		fs.IntVar(&p.roomSize, "room-size", 100, "users per room, one connection each, spread round-robin over --url")
		fs.Float64Var(&p.active, "active", 0.1, "share of each room's users that publish")
		fs.DurationVar(&p.interval, "interval", 5*time.Second, "time between two messages of an active user")
		fs.StringVar(&p.sizes, "sizes", "100:90,2048:10", "body sizes in bytes with their weights, SIZE:WEIGHT,...")
	}},
	{"soak", "a fixed load for a long time, checking every seq for gaps and duplicates and every ack against receipts", func(fs *flag.FlagSet, p *params) {
		fs.IntVar(&p.rooms, "rooms", 10, "rooms")
		fs.IntVar(&p.members, "members", 30, "receivers per room")
		fs.IntVar(&p.publishers, "publishers", 3, "publishers per room (joined too)")
		fs.Float64Var(&p.rate, "rate", 300, "publishes per second, all rooms together")
		fs.IntVar(&p.size, "size", 100, "body size in bytes")
	}},
}

func findScenario(name string) *scenario {
	for i := range scenarios {
		if scenarios[i].name == name {
			return &scenarios[i]
		}
	}
	return nil
}

// newFlagSet builds the flag set of one scenario.
func newFlagSet(sc *scenario, p *params) *flag.FlagSet {
	fs := flag.NewFlagSet("roost bench "+sc.name, flag.ContinueOnError)
	p.scenario = sc.name
	fs.StringVar(&p.urls, "url", "ws://127.0.0.1:8080/ws", "node URLs, comma-separated; connections go round-robin")
	fs.StringVar(&p.srcs, "src", "", "source addresses to bind, comma-separated (127.0.0.2,127.0.0.3,…); connections go round-robin")
	fs.StringVar(&p.app, "app", "bench", "app id of every connection")
	fs.StringVar(&p.secret, "secret", "", "the app's `SECRET`: each connection gets its own token (a node in token mode); prefer ROOST_SECRET or --secret-file, the command line is visible to every user. Empty: ?user=&app= (insecure mode)")
	fs.StringVar(&p.secretFile, "secret-file", "", "read --secret from `FILE`")
	fs.DurationVar(&p.warmup, "warmup", 5*time.Second, "warm-up before each measurement window")
	defDur := 20 * time.Second
	if sc.name == "soak" {
		defDur = 15 * time.Minute
	}
	fs.DurationVar(&p.duration, "duration", defDur, "measurement window")
	fs.DurationVar(&p.drain, "drain", 2*time.Second, "longest wait after the window for acks and deliveries")
	fs.DurationVar(&p.connectTimeout, "connect-timeout", 2*time.Minute, "longest wait for every connection to be joined")
	fs.Var(&p.pids, "pid", "node PIDs ([NAME=]PID or [NAME=]@PIDFILE, comma-separated): their CPU per frame and publish, each one's CPU and RSS (and RSS per connection for density)")
	fs.Var(&p.watch, "watch", "other processes to report CPU and RSS of (Redis, …): NAME=PID or NAME=@PIDFILE, comma-separated")
	fs.DurationVar(&p.series, "series", 0, "keep rates, latencies and --pid/--watch CPU and RSS per step of this length over the run (0: off)")
	fs.StringVar(&p.events, "events", "", "file of \"UNIX_NS NAME\" lines (faults) to mark on the --series plot and to give latencies per window of")
	fs.DurationVar(&p.rssTail, "rss-tail", 10*time.Minute, "with --series: report each process's RSS growth over this last stretch of the run")
	fs.StringVar(&p.reportFile, "report", "", "also write the JSON report to this file (the table still goes to stdout)")
	fs.BoolVar(&p.verdict, "verdict", false, "exit 1 unless every window publish was acked and delivered to every member once and in order (always on for soak and --reconnect)")
	fs.StringVar(&p.targets, "targets", "", "figures to judge the last level by, comma-separated: p99<=15ms, p999<=, ack-p95<=, ack-p99<=, delivery>=100, rss<=300MiB (all --pid together), node-cpu<=PCT (busiest --pid)")
	fs.StringVar(&p.reconnect, "reconnect", "", "a connection the node or the network closed comes back after its retry delay and rejoins with since (unacked publishes sent again with their ids): same (the node it was on) or next (the next --url at each attempt); empty: it stays closed")
	fs.StringVar(&p.reconnectURLs, "reconnect-url", "", "with --reconnect next: the node URLs reconnections go to, round-robin by attempt (default: --url)")
	fs.DurationVar(&p.retryMin, "retry-min", 500*time.Millisecond, "with --reconnect: shortest jittered delay when the close carries no retry=MS hint")
	fs.DurationVar(&p.retryMax, "retry-max", 3*time.Second, "with --reconnect: longest such delay (also the cap of the doubling after failed attempts)")
	fs.BoolVar(&p.pg, "pg", false, "report the CPU of all processes named postgres")
	fs.StringVar(&p.pgDB, "pg-db", "", "with --pg (implies it): count only this database's backends and the server's own processes, not other databases' clients on a shared server")
	fs.BoolVar(&p.jsonOut, "json", false, "print the report as JSON")
	fs.StringVar(&p.plot, "plot", "", "write latency against offered rate of a --step run to this SVG file")
	fs.IntVar(&p.procs, "procs", 1, "worker processes sharing the connections (each holds under 20,000 open files)")
	fs.IntVar(&p.loops, "loops", 0, "event loops per process (default: half the CPUs this process may run on, shared among --procs, at least 1)")
	fs.IntVar(&p.dialConc, "dial-concurrency", 256, "handshakes in flight per process")
	fs.StringVar(&p.transport, "transport", "ws", "how receivers (joined connections that do not publish) listen: ws, or sse (GET /sse?room=R on the --url's host; publishers stay on WebSocket)")
	fs.StringVar(&p.cpuProfile, "cpuprofile", "", "write the bench's own CPU profile to this file")
	fs.BoolVar(&p.step, "step", false, "raise the rate level by level until the sustained rule breaks")
	fs.Float64Var(&p.stepStart, "step-start", 0, "first level in publishes/s (default: --rate)")
	fs.Float64Var(&p.stepFactor, "step-factor", 1.25, "each level multiplies the rate by this")
	fs.Float64Var(&p.stepAdd, "step-add", 0, "each level adds this to the rate instead of multiplying")
	fs.Float64Var(&p.stepMax, "step-max", 1e6, "highest level tried")
	fs.DurationVar(&p.stepP99, "max-p99", 0, "a level whose p99 publish -> receipt is above this is not sustained (0: no latency bound)")
	fs.BoolVar(&p.readMarks, "read-marks", false, "receivers (joined connections that do not publish) send a read mark ({\"op\":\"read\"}) for each message they receive: what read positions cost the node and the database")
	fs.IntVar(&p.burst, "burst", 0, "publishes offered on top of the rate within --burst-over, spread over the publishers; those answered overloaded are sent again until acked; the report gives the time until the last is acked and the others' latencies meanwhile (0: none)")
	fs.DurationVar(&p.burstAt, "burst-at", 0, "when the --burst starts, after the window's start (0: the window's middle)")
	fs.DurationVar(&p.burstOver, "burst-over", time.Second, "how long the --burst's publishes take to be offered")
	sc.flags(fs, p)
	// worker-only flags, set by the parent
	fs.IntVar(&p.workerIndex, "worker-index", 0, "internal")
	fs.IntVar(&p.workerCount, "worker-count", 1, "internal")
	fs.StringVar(&p.runID, "run-id", "", "internal")
	return fs
}

// defaultLoops leaves half the CPUs to the node under test: a bench run on
// the node's machine with a loop per CPU put loops on the node's CPUs, and
// on 2 CPUs spent 1.1-1.2 µs per received frame at 2,000 msg/s in the
// 300-member room against 0.77 with one loop (the node: 0.81-0.88). A bench
// on a machine of its own can take every CPU with --loops.
func defaultLoops(cpus, procs int) int {
	return max(1, cpus/2/max(procs, 1))
}

// errUsage marks a bad flag value; Main answers it with exit code 2.
type errUsage struct{ msg string }

func (e errUsage) Error() string { return e.msg }

func usagef(format string, a ...any) error { return errUsage{fmt.Sprintf(format, a...)} }

func (p *params) validate() error {
	if p.secretFile != "" {
		b, err := os.ReadFile(p.secretFile)
		if err != nil {
			return usagef("cannot read --secret-file: %v", err)
		}
		p.secret = strings.TrimSpace(string(b))
	}
	if p.secret == "" {
		p.secret = os.Getenv("ROOST_SECRET")
	}
	if p.loops == 0 {
		p.loops = defaultLoops(runtime.NumCPU(), max(p.procs, p.workerCount))
	}
	switch {
	case p.warmup < 0 || p.drain < 0 || p.hold < 0:
		return usagef("--warmup, --drain and --hold must not be negative")
	case p.duration <= 0 && p.scenario != "density":
		return usagef("--duration must be positive")
	case p.procs < 1 || p.procs > 64:
		return usagef("--procs must be 1..64")
	case p.loops < 0 || p.loops > 256:
		return usagef("--loops must be 1..256")
	case p.transport != "ws" && p.transport != "sse":
		return usagef("invalid --transport %q: want ws or sse", p.transport)
	case p.dialConc < 1:
		return usagef("--dial-concurrency must be positive")
	case p.rate < 0:
		return usagef("--rate must not be negative")
	case p.size < 0 || p.longSize < 0 || p.size > 60000 || p.longSize > 60000:
		return usagef("body sizes must be 0..60000 bytes")
	case p.step && p.scenario == "density":
		return usagef("--step does not apply to density")
	case p.step && (p.stepAdd < 0 || (p.stepAdd == 0 && p.stepFactor <= 1)):
		return usagef("--step needs --step-factor > 1 or --step-add > 0")
	case p.workerCount < 1 || p.workerIndex < 0 || p.workerIndex >= p.workerCount:
		return usagef("bad worker index")
	case p.reconnect != "" && p.reconnect != "same" && p.reconnect != "next":
		return usagef("--reconnect is same, next or empty")
	case p.reconnectURLs != "" && p.reconnect != "next":
		return usagef("--reconnect-url needs --reconnect next")
	case p.retryMin <= 0 || p.retryMax < p.retryMin:
		return usagef("--retry-min must be positive and at most --retry-max")
	case p.series < 0 || (p.series > 0 && p.series < 100*time.Millisecond):
		return usagef("--series must be 0 or at least 100ms")
	case p.series > 0 && p.step:
		return usagef("--series applies to a run of one level, not --step")
	case p.events != "" && p.series == 0:
		return usagef("--events needs --series")
	}
	if _, err := parseTargets(p.targets); err != nil {
		return err
	}
	if err := p.validateBurst(); err != nil {
		return err
	}
	switch p.scenario {
	case "delivery", "hotroom":
		if p.members < 0 || p.publishers < 1 {
			return usagef("--members must be >= 0 and --publishers >= 1")
		}
	case "publish", "density":
		if p.rooms < 1 {
			return usagef("--rooms must be positive")
		}
		if p.scenario == "density" && p.conns < 1 {
			return usagef("--conns must be positive")
		}
	case "mixed":
		if p.users < 1 || p.roomSize < 1 || p.active <= 0 || p.active > 1 || p.interval <= 0 || p.longShare < 0 || p.longShare > 1 {
			return usagef("mixed needs --users >= 1, --room-size >= 1, 0 < --active <= 1, --interval > 0, 0 <= --long-share <= 1")
		}
	case "chat":
		if p.rooms < 1 || p.roomSize < 1 || p.active <= 0 || p.active > 1 || p.interval <= 0 {
			return usagef("chat needs --rooms >= 1, --room-size >= 1, 0 < --active <= 1, --interval > 0")
		}
		mix, err := parseSizes(p.sizes)
		if err != nil {
			return err
		}
		p.sizeMix = mix
	case "soak":
		if p.rooms < 1 || p.members < 0 || p.publishers < 1 {
			return usagef("soak needs --rooms >= 1, --members >= 0, --publishers >= 1")
		}
	}
	return nil
}

// plan is the whole run: every connection of every process, so that each
// worker derives the same plan and takes its share.
type plan struct {
	specs      []*connSpec
	rooms      []string
	publishers int
	rate       float64 // total publishes/s at the base level
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func (p *params) buildPlan(ntargets, nsrcs int) *plan {
	pl := &plan{}
	room := func(i int) int32 {
		for len(pl.rooms) <= i {
			pl.rooms = append(pl.rooms, p.runID+"-r"+strconv.Itoa(len(pl.rooms)))
		}
		return int32(i)
	}
	add := func(s connSpec) *connSpec {
		i := len(pl.specs)
		s.user = "u" + strconv.Itoa(i)
		if ntargets > 0 && s.target < 0 {
			s.target = i % ntargets
		}
		s.src = -1
		if nsrcs > 0 {
			s.src = i % nsrcs
		}
		if s.publish {
			pl.publishers++
		}
		sp := &s
		pl.specs = append(pl.specs, sp)
		return sp
	}
	oneRoom := func(r int32, members, pubs int, pubJoin bool) {
		var ps []*connSpec
		for i := 0; i < members; i++ {
			add(connSpec{target: -1, room: r, join: true})
		}
		for i := 0; i < pubs; i++ {
			ps = append(ps, add(connSpec{target: -1, room: r, join: pubJoin, publish: true}))
		}
		recv := members
		if pubJoin {
			recv += pubs
		}
		for _, s := range ps {
			s.receivers = recv
		}
	}
	switch p.scenario {
	case "delivery", "hotroom":
		oneRoom(room(0), p.members, p.publishers, p.pubJoin)
		pl.rate = p.rate
	case "soak":
		for r := 0; r < p.rooms; r++ {
			oneRoom(room(r), p.members, p.publishers, true)
		}
		pl.rate = p.rate
	case "publish":
		for r := 0; r < p.rooms; r++ {
			rr := room(r)
			// receiver first so that it is joined before the publisher sends
			add(connSpec{target: (r + 1) % max(ntargets, 1), room: rr, join: true})
			add(connSpec{target: r % max(ntargets, 1), room: rr, publish: true, receivers: 1})
		}
		pl.rate = p.rate
	case "density":
		for i := 0; i < p.conns; i++ {
			add(connSpec{target: -1, room: room(i % p.rooms), join: true})
		}
	case "chat":
		// A room's users are consecutive, so that round-robin over the
		// nodes (and over --procs) spreads every room over all of them;
		// every --active-th user of a room publishes.
		every := max(1, int(1/p.active+0.5))
		for r := 0; r < p.rooms; r++ {
			rr := room(r)
			var ps []*connSpec
			for k := 0; k < p.roomSize; k++ {
				s := add(connSpec{target: -1, room: rr, join: true, publish: k%every == 0})
				if s.publish {
					ps = append(ps, s)
				}
			}
			for _, s := range ps {
				s.receivers = p.roomSize
			}
		}
		pl.rate = float64(pl.publishers) / p.interval.Seconds()
	case "mixed":
		nrooms := (p.users + p.roomSize - 1) / p.roomSize
		every := int(1/p.active + 0.5)
		if every < 1 {
			every = 1
		}
		var ps []*connSpec
		counts := make([]int, nrooms)
		for i := 0; i < p.users; i++ {
			r := i % nrooms
			counts[r]++
			s := add(connSpec{target: -1, room: room(r), join: true, publish: i%every == 0})
			if s.publish {
				ps = append(ps, s)
			}
		}
		for _, s := range ps {
			s.receivers = counts[s.room]
		}
		pl.rate = float64(pl.publishers) / p.interval.Seconds()
	}
	pl.spreadBurst(p.burst)
	return pl
}

// share returns the specs worker index of count runs.
func (pl *plan) share(index, count int) []*connSpec {
	if count == 1 {
		return pl.specs
	}
	var out []*connSpec
	for i, s := range pl.specs {
		if i%count == index {
			out = append(out, s)
		}
	}
	return out
}

// sizeFunc returns the body size chooser of the scenario.
func (p *params) sizeFunc() func(*uint64) int {
	if len(p.sizeMix) > 0 {
		return mixFunc(p.sizeMix)
	}
	if p.scenario != "mixed" {
		size := p.size
		return func(*uint64) int { return size }
	}
	short, long := p.size, p.longSize
	threshold := uint64(p.longShare * 1e6)
	return func(rng *uint64) int {
		*rng ^= *rng << 13
		*rng ^= *rng >> 7
		*rng ^= *rng << 17
		if *rng%1000000 < threshold {
			return long
		}
		return short
	}
}

// sizeWeight is one entry of --sizes; cum is the running total of the
// weights up to and including this one, scaled to 1e6.
type sizeWeight struct {
	size int
	cum  uint64
}

// parseSizes reads SIZE:WEIGHT,... (weights need not add up to 100).
func parseSizes(s string) ([]sizeWeight, error) {
	var sizes []int
	var weights []float64
	total := 0.0
	for _, f := range splitList(s) {
		sz, w, ok := strings.Cut(f, ":")
		if !ok {
			w = "1"
		}
		n, err := strconv.Atoi(sz)
		if err != nil || n < 0 || n > 60000 {
			return nil, usagef("--sizes: bad size %q (want 0..60000 bytes)", sz)
		}
		v, err := strconv.ParseFloat(w, 64)
		if err != nil || v <= 0 || math.IsInf(v, 0) {
			return nil, usagef("--sizes: bad weight %q of size %d (want a positive number)", w, n)
		}
		sizes = append(sizes, n)
		weights = append(weights, v)
		total += v
	}
	if len(sizes) == 0 {
		return nil, usagef("--sizes is empty (want SIZE:WEIGHT,...)")
	}
	out := make([]sizeWeight, len(sizes))
	run := 0.0
	for i := range sizes {
		run += weights[i]
		out[i] = sizeWeight{size: sizes[i], cum: uint64(run / total * 1e6)}
	}
	out[len(out)-1].cum = 1e6
	return out, nil
}

func mixFunc(mix []sizeWeight) func(*uint64) int {
	return func(rng *uint64) int {
		*rng ^= *rng << 13
		*rng ^= *rng >> 7
		*rng ^= *rng << 17
		v := *rng % 1000000
		for _, m := range mix {
			if v < m.cum {
				return m.size
			}
		}
		return mix[len(mix)-1].size
	}
}

// procRef is one process to watch: a PID, or a file holding the PID of a
// process that may be restarted during the run (read at every sample).
type procRef struct {
	name string
	pid  int
	file string
}

// resolve returns the process's PID now, 0 when there is none.
func (r procRef) resolve() int {
	if r.file == "" {
		return r.pid
	}
	b, err := os.ReadFile(r.file)
	if err != nil {
		return 0
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || v <= 0 {
		return 0
	}
	return v
}

// procList is --pid and --watch: [NAME=]PID or [NAME=]@PIDFILE,
// comma-separated; a PID of 0 means none.
type procList []procRef

func (l *procList) String() string {
	if l == nil {
		return ""
	}
	parts := make([]string, len(*l))
	for i, r := range *l {
		v := strconv.Itoa(r.pid)
		if r.file != "" {
			v = "@" + r.file
		}
		if r.name != "" {
			v = r.name + "=" + v
		}
		parts[i] = v
	}
	return strings.Join(parts, ",")
}

func (l *procList) Set(s string) error {
	*l = nil
	for _, f := range splitList(s) {
		var r procRef
		if name, v, ok := strings.Cut(f, "="); ok {
			r.name, f = name, v
		}
		if strings.HasPrefix(f, "@") && len(f) > 1 {
			r.file = f[1:]
		} else {
			v, err := strconv.Atoi(f)
			if err != nil || v < 0 {
				return fmt.Errorf("bad PID %q (want [NAME=]PID or [NAME=]@PIDFILE)", f)
			}
			if v == 0 {
				continue
			}
			r.pid = v
		}
		if r.name == "" {
			r.name = "pid" + strconv.Itoa(r.pid)
			if r.file != "" {
				r.name = r.file
			}
		}
		*l = append(*l, r)
	}
	return nil
}

// first is the first process's PID, 0 when there is none.
func (l procList) first() int {
	if len(l) == 0 {
		return 0
	}
	return l[0].resolve()
}
