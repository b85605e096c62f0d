//go:build linux

package bench

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// driver runs the plan's connections, in this process or in workers.
type driver interface {
	// connect opens and joins every connection of the run.
	connect() error
	// level publishes at perPublisher msgs/s for warm-up + window, then
	// drains; at and after the window it calls mark(false) and mark(true).
	// Every process times the level from start, so that the windows of all
	// workers coincide and a publish and its receipts fall in the same one.
	level(perPublisher float64, verify bool, start time.Time, mark func(end bool)) (*levelStats, time.Duration, error)
	// snapshot returns what happened since the last level without running one.
	snapshot() (*levelStats, error)
	close()
}

// localDriver runs every connection of its share in this process.
type localDriver struct {
	p          *params
	specs      []*connSpec
	e          *engine
	fixedDrain bool // workers: members of a room may live in other processes
	progress   io.Writer
	targets    []target
	sources    []unix.SockaddrInet4
	rooms      []string
}

func (d *localDriver) connect() error {
	e, err := newEngine(d.targets, d.sources, d.rooms, d.p.app, []byte(d.p.secret), d.p.loops, d.p.dialConc, d.p.sizeFunc())
	if err != nil {
		return err
	}
	switch d.p.reconnect {
	case "same":
		e.reconnect = reconnectSame
	case "next":
		e.reconnect = reconnectNext
	}
	e.retryMin, e.retryMax = int64(d.p.retryMin), int64(d.p.retryMax)
	e.sse = d.p.transport == "sse"
	e.signals = d.p.signals
	e.readMarks = d.p.readMarks
	e.placed = len(splitList(d.p.urls))
	d.e = e
	return e.connect(d.specs, d.p.connectTimeout)
}

func (d *localDriver) level(rate float64, verify bool, start time.Time, mark func(bool)) (*levelStats, time.Duration, error) {
	e := d.e
	if d.p.series > 0 {
		e.serStart.Store(start.UnixNano())
		e.serStep.Store(int64(d.p.series))
		e.serLen.Store(int64((d.p.warmup+d.p.duration+d.p.drain)/d.p.series) + 1)
	}
	e.snapshot(false) // what happened before this level is not measured
	e.serLen.Store(0) // the snapshot that ends the level needs no new series
	time.Sleep(time.Until(start))
	ws := start.Add(d.p.warmup)
	we := ws.Add(d.p.duration)
	e.winStart.Store(ws.UnixNano())
	e.winEnd.Store(we.UnixNano())
	if d.p.burst > 0 {
		e.burstOver.Store(int64(d.p.burstOver))
		e.burstStart.Store(ws.Add(d.p.burstOffset()).UnixNano())
	}
	e.setRate(rate)
	e.pubOn.Store(true)

	stopProgress := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		if d.progress == nil {
			return
		}
		d.showProgress(stopProgress, we)
	}()

	time.Sleep(time.Until(ws))
	cpu0 := selfCPU()
	if mark != nil {
		mark(false)
	}
	time.Sleep(time.Until(we))
	cpu1 := selfCPU()
	if mark != nil {
		mark(true)
	}
	e.pubOn.Store(false)
	// a loop may be between sending and publishing its counters: the live
	// counts mean something only once each loop has begun an iteration
	// after publishing stopped
	iters := e.iterations()
	deadline := time.Now().Add(d.p.drain)
	for time.Now().Before(deadline) {
		if !d.fixedDrain && e.iteratedSince(iters) && e.liveDrained() {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(stopProgress)
	<-done
	st := e.snapshot(verify)
	return st, cpu1 - cpu0, nil
}

// showProgress rewrites one terminal line per second until stop.
func (d *localDriver) showProgress(stop chan struct{}, end time.Time) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	prevSent, prevRecv, _, _ := d.e.live()
	prev := time.Now()
	for {
		select {
		case <-stop:
			fmt.Fprint(d.progress, "\r\033[K")
			return
		case now := <-t.C:
			sent, recv, errs, p99 := d.e.live()
			dt := now.Sub(prev).Seconds()
			left := time.Until(end).Round(time.Second)
			if left < 0 {
				left = 0
			}
			fmt.Fprintf(d.progress, "\r\033[K%s  pub %.0f/s  recv %.0f frames/s  p99 %v  errors %d  %v left",
				d.p.scenario, float64(sent-prevSent)/dt, float64(recv-prevRecv)/dt, p99.Round(10*time.Microsecond), errs, left)
			prevSent, prevRecv, prev = sent, recv, now
		}
	}
}

func (d *localDriver) snapshot() (*levelStats, error) { return d.e.snapshot(false), nil }

func (d *localDriver) close() {
	if d.e != nil {
		d.e.close()
	}
}

// LevelResult is one measured level (one window at one offered rate).
type LevelResult struct {
	Offered      float64 `json:"offered_per_s"`
	Window       float64 `json:"window_s"`
	Sent         uint64  `json:"sent"`
	Acked        uint64  `json:"acked"`
	SentRate     float64 `json:"sent_per_s"`
	Achieved     float64 `json:"achieved_per_s"` // acked publishes per second
	Expected     uint64  `json:"expected_deliveries"`
	Delivered    uint64  `json:"delivered"`
	DeliveryPct  float64 `json:"delivery_pct"`
	RecvFrames   uint64  `json:"frames_received"`
	FramesPerSec float64 `json:"frames_per_s"`
	BenchDropped uint64  `json:"bench_dropped"`

	// --reconnect
	Rejoins  uint64 `json:"rejoins,omitempty"`
	Unrecov  uint64 `json:"recovered_false,omitempty"`
	ToldLost uint64 `json:"told_lost,omitempty"`
	Resent   uint64 `json:"resent,omitempty"`
	Away     uint64 `json:"away_at_end,omitempty"`
	Replayed uint64 `json:"replayed,omitempty"`

	// --read-marks: marks sent in the window and answers received; the
	// database's CPU per mark, all of it charged to the marks (compare a
	// run without them for the part that is theirs)
	ReadMarks     uint64  `json:"read_marks,omitempty"`
	ReadAnswers   uint64  `json:"read_answers,omitempty"`
	PGUsPerMarkUB float64 `json:"pg_cpu_us_per_read_mark_all,omitempty"`

	Latency    Percentiles `json:"latency"`
	AckLatency Percentiles `json:"ack_latency"`

	Closes     map[int]uint64    `json:"closes_by_code"`
	Errors     map[string]uint64 `json:"errors_by_code"`
	Gaps       uint64            `json:"gaps"`
	Missing    uint64            `json:"missing"`
	Duplicates uint64            `json:"duplicates"`
	Reordered  uint64            `json:"reordered"`
	// rooms in which some open member's in-order seq is below an acked seq
	AckedNotReceived int `json:"rooms_acked_not_received"`
	// the first of those rooms (by index): the acked seq and the member
	// furthest behind, to find the miss in the store and the faults
	NotReceived []MissedRoom `json:"acked_not_received,omitempty"`

	BenchCPU         float64 `json:"bench_cpu_s"`
	BenchUsPerFrame  float64 `json:"bench_cpu_us_per_frame"`
	NodeCPU          float64 `json:"node_cpu_s,omitempty"`
	NodeUsPerFrame   float64 `json:"node_cpu_us_per_frame,omitempty"`
	NodeUsPerPublish float64 `json:"node_cpu_us_per_publish,omitempty"`
	PGMeasured       bool    `json:"pg_measured,omitempty"`
	PGCPU            float64 `json:"pg_cpu_s,omitempty"`
	PGUsPerPublish   float64 `json:"pg_cpu_us_per_publish,omitempty"`
	// each --pid over the window: where the CPU went, and memory at its end
	Nodes   []NodeUsage `json:"nodes,omitempty"`
	Watched []NodeUsage `json:"watched,omitempty"` // --watch

	Sustained bool   `json:"sustained"`
	Broken    string `json:"broken,omitempty"` // why not sustained
}

// maxMissedRooms bounds the rooms listed in a report's acked_not_received.
const maxMissedRooms = 20

// MissedRoom is a room whose highest acked seq some open member never
// received in order.
type MissedRoom struct {
	Room   int32  `json:"room"` // index: the room's name is RUNID-rINDEX
	Acked  uint64 `json:"acked_seq"`
	Member Lagger `json:"member"`
}

// NodeUsage is one node process over one window.
type NodeUsage struct {
	Name   string  `json:"name"`
	PID    int     `json:"pid"`
	CPU    float64 `json:"cpu_s"`
	CPUPct float64 `json:"cpu_pct"` // of one core, over the window
	RSS    int64   `json:"rss_bytes"`
}

// Report is a whole run.
type Report struct {
	Scenario    string        `json:"scenario"`
	Args        []string      `json:"args"`
	Connections int           `json:"connections"`
	Publishers  int           `json:"publishers"`
	Procs       int           `json:"procs"`
	Loops       int           `json:"loops_per_proc"`
	ConnectTime float64       `json:"connect_s"`
	Levels      []LevelResult `json:"levels,omitempty"`
	// the highest offered rate of a --step run that met the sustained rule
	HighestSustained float64      `json:"highest_sustained_per_s,omitempty"`
	Burst            *BurstResult `json:"burst,omitempty"`

	// publishes sent and text frames received since connect, over every
	// level and warm-up: what the node's own counters should say
	TotalSent   uint64 `json:"total_sent"`
	TotalFrames uint64 `json:"total_frames_received"`

	// --series
	SeriesStep  float64           `json:"series_step_s,omitempty"`
	SeriesNames []string          `json:"series_processes,omitempty"` // --pid then --watch, the order of rss_bytes and cpu_pct
	Series      []SeriesPoint     `json:"series,omitempty"`
	Windows     []EventWindow     `json:"event_windows,omitempty"`
	Whole       *EventWindow      `json:"whole_run,omitempty"` // the series from start to end as one window
	RSSTail     []RSSGrowth       `json:"rss_tail,omitempty"`
	Verdict     *IntegrityVerdict `json:"verdict,omitempty"`
	Targets     []TargetResult    `json:"targets,omitempty"`

	// density
	RSSBefore     int64          `json:"node_rss_before_bytes,omitempty"`
	RSSAfter      int64          `json:"node_rss_after_bytes,omitempty"`
	KiBPerConn    float64        `json:"node_kib_per_conn,omitempty"`
	HeldFor       float64        `json:"held_s,omitempty"`
	ClosesHolding map[int]uint64 `json:"closes_while_holding,omitempty"`
}

func (p *params) result(st *levelStats, offered float64, publishers int, benchCPU time.Duration, s0, s1 cpuSample) LevelResult {
	w := p.duration.Seconds()
	r := LevelResult{
		Offered: offered, Window: w,
		Sent: st.Sent, Acked: st.Acked, SentRate: float64(st.Sent) / w, Achieved: float64(st.Acked) / w,
		Expected: st.Expected, Delivered: st.Delivered, RecvFrames: st.RecvFrames,
		FramesPerSec: float64(st.RecvFrames) / w, BenchDropped: st.BenchDropped,
		Latency: st.Lat.Summary(), AckLatency: st.AckLat.Summary(),
		Closes: st.Closes, Errors: st.Errors,
		Gaps: st.Gaps, Missing: st.Missing, Duplicates: st.Duplicates, Reordered: st.Reordered,
		BenchCPU:  benchCPU.Seconds(),
		ReadMarks: st.ReadMarks, ReadAnswers: st.ReadAnswers,
		Rejoins: st.Rejoins, Unrecov: st.Unrecov, ToldLost: st.ToldLost, Resent: st.Resent, Away: st.Away, Replayed: st.Replayed,
	}
	if st.Expected > 0 {
		r.DeliveryPct = 100 * float64(st.Delivered) / float64(st.Expected)
	} else {
		r.DeliveryPct = 100
	}
	if st.RecvFrames > 0 {
		r.BenchUsPerFrame = float64(benchCPU.Microseconds()) / float64(st.RecvFrames)
	}
	for room, acked := range st.AckMax {
		if last, ok := st.LastMin[room]; ok && last < acked {
			r.AckedNotReceived++
			r.NotReceived = append(r.NotReceived, MissedRoom{Room: room, Acked: acked, Member: st.LastWho[room]})
		}
	}
	sort.Slice(r.NotReceived, func(i, j int) bool { return r.NotReceived[i].Room < r.NotReceived[j].Room })
	if len(r.NotReceived) > maxMissedRooms {
		r.NotReceived = r.NotReceived[:maxMissedRooms]
	}
	if len(p.pids) > 0 && s0.err == nil && s1.err == nil {
		for i, ref := range p.pids {
			cpu := cpuDelta(s0, s1, i).Seconds()
			r.Nodes = append(r.Nodes, NodeUsage{Name: ref.name, PID: s1.pid[i], CPU: cpu, CPUPct: 100 * cpu / w, RSS: s1.rss[i]})
		}
		for i, ref := range p.watch {
			j := len(p.pids) + i
			cpu := cpuDelta(s0, s1, j).Seconds()
			r.Watched = append(r.Watched, NodeUsage{Name: ref.name, PID: s1.pid[j], CPU: cpu, CPUPct: 100 * cpu / w, RSS: s1.rss[j]})
		}
		var node time.Duration
		for i := range p.pids {
			node += cpuDelta(s0, s1, i)
		}
		r.NodeCPU = node.Seconds()
		if st.RecvFrames > 0 {
			r.NodeUsPerFrame = float64(node.Nanoseconds()) / 1e3 / float64(st.RecvFrames)
		}
		if st.Acked > 0 {
			r.NodeUsPerPublish = float64(node.Nanoseconds()) / 1e3 / float64(st.Acked)
		}
	}
	// the sum over processes named postgres falls when backends exit during
	// the window (other clients of a shared server): then it measures nothing
	if pg := s1.pg - s0.pg; p.pg && s0.err == nil && s1.err == nil && pg >= 0 {
		r.PGMeasured = true
		r.PGCPU = pg.Seconds()
		if st.Acked > 0 {
			r.PGUsPerPublish = float64(pg.Nanoseconds()) / 1e3 / float64(st.Acked)
		}
		if st.ReadMarks > 0 {
			r.PGUsPerMarkUB = float64(pg.Nanoseconds()) / 1e3 / float64(st.ReadMarks)
		}
	}
	// the sustained rule: achieved = offered within 1%, every delivery, no
	// slow-consumer close
	// each publisher's token bucket may straddle a window edge by one
	// message, which matters only at low rates
	want := offered * w
	done := st.Acked
	if p.signals {
		// A signal has no ack: what left the bench is what was achieved,
		// and delivery says the rest.
		done = st.Sent
		r.Achieved = r.SentRate
	}
	switch {
	case float64(done) < 0.99*want-float64(publishers):
		r.Broken = fmt.Sprintf("achieved %.0f/s < offered %.0f/s", r.Achieved, offered)
		if st.BenchDropped > 0 {
			r.Broken += " (the bench fell behind: " + strconv.FormatUint(st.BenchDropped, 10) + " publishes late)"
		}
	case st.Delivered < st.Expected:
		r.Broken = fmt.Sprintf("delivery %.3f%%", r.DeliveryPct)
	case st.Closes[1013] > 0:
		// 1013 is a slow consumer, a catch-up the node gave up (its store
		// read refused in a reconnect storm) or an overload: the node's
		// roost_slow_consumer_closes_total and roost_catchups_abandoned_total
		// say which; the bench cannot.
		r.Broken = fmt.Sprintf("%d closes 1013 (try again later)", st.Closes[1013])
	case st.Gaps+st.Duplicates+st.Reordered > 0 || r.AckedNotReceived > 0:
		r.Broken = "sequence errors"
	case p.stepP99 > 0 && r.Latency.P99 > p.stepP99:
		r.Broken = fmt.Sprintf("p99 %s > --max-p99 %s", fmtDur(r.Latency.P99), fmtDur(p.stepP99))
	}
	r.Sustained = r.Broken == ""
	return r
}

// execute runs the scenario through d and fills rep.
func (p *params) execute(d driver, pl *plan, rep *Report, progress io.Writer) error {
	smp := sampler{pids: append(append([]procRef(nil), p.pids...), p.watch...), pg: p.pg, pgDB: p.pgDB}
	var rss0 int64
	if p.scenario == "density" && p.pids.first() > 0 {
		v, err := procRSS(p.pids.first())
		if err != nil {
			return err
		}
		rss0 = v
	}
	t0 := time.Now()
	if err := d.connect(); err != nil {
		return err
	}
	rep.ConnectTime = time.Since(t0).Seconds()

	if p.scenario == "density" {
		if progress != nil {
			fmt.Fprintf(progress, "%d connections joined in %.1fs; holding %v\n", rep.Connections, rep.ConnectTime, p.hold)
		}
		time.Sleep(p.hold)
		rep.HeldFor = p.hold.Seconds()
		if p.pids.first() > 0 {
			v, err := procRSS(p.pids.first())
			if err != nil {
				return err
			}
			rep.RSSBefore, rep.RSSAfter = rss0, v
			rep.KiBPerConn = float64(v-rss0) / 1024 / float64(rep.Connections)
		}
		st, err := d.snapshot()
		if err != nil {
			return err
		}
		rep.ClosesHolding = st.Closes
		rep.TotalSent, rep.TotalFrames = st.TotalSent, st.TotalFrames
		return nil
	}

	perPub := func(total float64) float64 { return total / float64(max(pl.publishers, 1)) }
	rate := pl.rate
	if p.step && p.stepStart > 0 {
		rate = p.stepStart
	}
	for {
		var s0, s1 cpuSample
		mark := func(end bool) {
			if end {
				s1 = smp.sample()
			} else {
				s0 = smp.sample()
			}
		}
		last := !p.step
		// the lead time lets every worker read the command before the start
		start := time.Now().Add(100 * time.Millisecond)
		var samples []procSample
		stopSeries, seriesDone := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(seriesDone)
			if p.series > 0 {
				samples = sampleSeries(smp, start, p.series, stopSeries)
			}
		}()
		st, benchCPU, err := d.level(perPub(rate), last || p.scenario == "soak" || p.reconnect != "", start, mark)
		close(stopSeries)
		<-seriesDone
		if err != nil {
			return err
		}
		if p.series > 0 {
			if err := p.fillSeries(rep, st, samples, start); err != nil {
				return err
			}
		}
		r := p.result(st, rate, pl.publishers, benchCPU, s0, s1)
		rep.Levels = append(rep.Levels, r)
		rep.Burst = p.burstResult(st, start)
		if p.reconnect != "" || p.scenario == "soak" || p.verdict {
			rep.Verdict = verdict(r)
		}
		if p.targets != "" && last {
			ts, _ := parseTargets(p.targets)
			rep.Targets = judge(ts, r)
		}
		rep.TotalSent, rep.TotalFrames = st.TotalSent, st.TotalFrames
		if !p.step {
			return nil
		}
		if progress != nil {
			fmt.Fprintf(progress, "level %.0f/s: achieved %.0f/s, delivery %.3f%%, p99 %v: %s\n",
				rate, r.Achieved, r.DeliveryPct, r.Latency.P99, sustainedWord(r))
		}
		if !r.Sustained {
			return nil
		}
		rep.HighestSustained = rate
		next := rate * p.stepFactor
		if p.stepAdd > 0 {
			next = rate + p.stepAdd
		}
		if next >= 10 {
			next = math.Round(next) // levels people can type back in
		}
		if next > p.stepMax || math.IsInf(next, 0) {
			return nil
		}
		rate = next
	}
}

func sustainedWord(r LevelResult) string {
	if r.Sustained {
		return "sustained"
	}
	return "not sustained: " + r.Broken
}

// fillSeries puts the level's slots, the process samples and the event
// windows into the report.
func (p *params) fillSeries(rep *Report, st *levelStats, samples []procSample, start time.Time) error {
	rep.SeriesStep = p.series.Seconds()
	for _, r := range p.pids {
		rep.SeriesNames = append(rep.SeriesNames, r.name)
	}
	for _, r := range p.watch {
		rep.SeriesNames = append(rep.SeriesNames, r.name)
	}
	// the slots past the last sample (the drain) are dropped when empty
	slots := st.Series
	for len(slots) > 0 {
		s := &slots[len(slots)-1]
		if s.Sent+s.Acked+s.Frames+s.Closes+s.Rejoined > 0 {
			break
		}
		slots = slots[:len(slots)-1]
	}
	rep.Series = points(slots, p.series, samples)
	whole := windows(slots, p.series, []Event{{T: 0, At: start.UnixNano(), Name: "whole run"}})
	if len(whole) == 1 {
		rep.Whole = &whole[0]
	}
	rep.RSSTail = rssGrowth(rep.SeriesNames, rep.Series, samples, p.rssTail, p.series)
	if p.events != "" {
		evs, err := readEvents(p.events, start)
		if err != nil {
			return err
		}
		rep.Windows = windows(slots, p.series, evs)
	}
	return nil
}

// IntegrityVerdict is the judgement of a run with faults: every publish of
// the window acked, every acked message received by every member once and
// in order (or the member told which seqs will not follow), every
// connection back at the end.
type IntegrityVerdict struct {
	OK      bool     `json:"ok"`
	Reasons []string `json:"reasons,omitempty"`
}

func verdict(r LevelResult) *IntegrityVerdict {
	v := &IntegrityVerdict{}
	add := func(format string, a ...any) { v.Reasons = append(v.Reasons, fmt.Sprintf(format, a...)) }
	if r.Gaps+r.Duplicates+r.Reordered > 0 {
		add("%d gaps (%d missing), %d duplicates, %d reordered", r.Gaps, r.Missing, r.Duplicates, r.Reordered)
	}
	if r.AckedNotReceived > 0 {
		add("%d rooms with acked messages not received", r.AckedNotReceived)
	}
	if r.Acked < r.Sent {
		add("%d of %d window publishes never acked", r.Sent-r.Acked, r.Sent)
	}
	if r.Delivered+r.ToldLost < r.Expected {
		add("%d of %d deliveries (%d seqs announced lost by recovered:false)", r.Delivered, r.Expected, r.ToldLost)
	}
	if r.Away > 0 {
		add("%d connections not back at the end", r.Away)
	}
	v.OK = len(v.Reasons) == 0
	return v
}

// figureTarget is one --targets entry: a figure of the last level and its bound.
type figureTarget struct {
	key   string
	le    bool // the figure must be <= bound (else >=)
	bound float64
	text  string
}

// TargetResult is one --targets entry judged.
type TargetResult struct {
	Target string  `json:"target"`
	Got    float64 `json:"got"`
	Unit   string  `json:"unit"`
	Met    bool    `json:"met"`
}

var targetUnits = map[string]string{"p99": "ms", "p999": "ms", "ack-p95": "ms", "ack-p99": "ms", "delivery": "%", "rss": "MiB", "node-cpu": "%"}

func parseTargets(s string) ([]figureTarget, error) {
	var out []figureTarget
	for _, f := range splitList(s) {
		t := figureTarget{text: f}
		var k, v string
		if a, b, ok := strings.Cut(f, "<="); ok {
			k, v, t.le = a, b, true
		} else if a, b, ok := strings.Cut(f, ">="); ok {
			k, v = a, b
		} else {
			return nil, usagef("--targets: %q is not KEY<=VALUE or KEY>=VALUE", f)
		}
		t.key = strings.TrimSpace(k)
		unit, ok := targetUnits[t.key]
		if !ok {
			return nil, usagef("--targets: unknown figure %q (p99, p999, ack-p95, ack-p99, delivery, rss, node-cpu)", t.key)
		}
		v = strings.TrimSpace(v)
		mult := 1.0
		switch {
		case unit == "ms" && strings.HasSuffix(v, "ms"):
			v = strings.TrimSuffix(v, "ms")
		case unit == "ms" && strings.HasSuffix(v, "s"):
			v, mult = strings.TrimSuffix(v, "s"), 1000
		case unit == "MiB" && strings.HasSuffix(v, "MiB"):
			v = strings.TrimSuffix(v, "MiB")
		case unit == "MiB" && strings.HasSuffix(v, "MB"):
			v, mult = strings.TrimSuffix(v, "MB"), 1e6/(1<<20)
		case unit == "%":
			v = strings.TrimSuffix(v, "%")
		}
		b, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return nil, usagef("--targets: bad value in %q", f)
		}
		t.bound = b * mult
		out = append(out, t)
	}
	return out, nil
}

func judge(ts []figureTarget, r LevelResult) []TargetResult {
	var out []TargetResult
	for _, t := range ts {
		var got float64
		switch t.key {
		case "p99":
			got = ms(r.Latency.P99)
		case "p999":
			got = ms(r.Latency.P999)
		case "ack-p95":
			got = ms(r.AckLatency.P95)
		case "ack-p99":
			got = ms(r.AckLatency.P99)
		case "delivery":
			got = r.DeliveryPct
		case "rss":
			for _, n := range r.Nodes {
				got += float64(n.RSS) / (1 << 20)
			}
		case "node-cpu":
			for _, n := range r.Nodes {
				got = math.Max(got, n.CPUPct)
			}
		}
		met := got <= t.bound
		if !t.le {
			met = got >= t.bound
		}
		out = append(out, TargetResult{Target: t.text, Got: got, Unit: targetUnits[t.key], Met: met})
	}
	return out
}
