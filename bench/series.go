//go:build linux

package bench

import (
	"bufio"
	"fmt"
	"math"
	"math/bits"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// A run with --series keeps, besides the window's totals, one slot per
// --series step from the level's start: what was sent, acked and received
// in it and its latencies. A long run with faults is judged by these: the
// rates and latency around each fault, node memory over time.

// slotHist is a coarse latency histogram for time slots: 16 buckets per
// power of two (a value is off by at most 1/16 of itself) from 1 µs to
// 68 s, 1.7 KB, so that a 15-minute run keeps a pair per second per loop.
type slotHist struct {
	Counts [slotBuckets]uint32
	N      uint64
	Max    int64
}

const (
	slotMinExp  = 10 // values below 2^10 ns share bucket 0
	slotMaxExp  = 36
	slotBuckets = 1 + (slotMaxExp-slotMinExp+1)*16
)

func slotIndex(v uint64) int {
	if v < 1<<slotMinExp {
		return 0
	}
	e := bits.Len64(v) - 1
	if e > slotMaxExp {
		return slotBuckets - 1
	}
	return 1 + (e-slotMinExp)*16 + int((v>>uint(e-4))&15)
}

// slotLow is the smallest value of bucket i.
func slotLow(i int) uint64 {
	if i == 0 {
		return 0
	}
	i--
	e := i/16 + slotMinExp
	return (16 + uint64(i%16)) << uint(e-4)
}

func (h *slotHist) record(ns int64) {
	if ns < 0 {
		ns = 0
	}
	h.Counts[slotIndex(uint64(ns))]++
	h.N++
	if ns > h.Max {
		h.Max = ns
	}
}

func (h *slotHist) merge(o *slotHist) {
	if o.N == 0 {
		return
	}
	for i, c := range o.Counts {
		h.Counts[i] += c
	}
	h.N += o.N
	if o.Max > h.Max {
		h.Max = o.Max
	}
}

func (h *slotHist) quantile(q float64) time.Duration {
	if h.N == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.N)))
	rank = max(1, min(rank, h.N))
	var seen uint64
	for i, c := range h.Counts {
		seen += uint64(c)
		if seen >= rank {
			lo, hi := slotLow(i), slotLow(i+1)
			if i == slotBuckets-1 {
				hi = lo
			}
			return time.Duration(min(int64(lo+(hi-lo)/2), h.Max))
		}
	}
	return time.Duration(h.Max)
}

// slot is what all loops saw in one step of the series.
type slot struct {
	Sent       uint64 // publishes sent
	Acked      uint64 // acks received
	AckedAgain uint64 // of those, of publishes sent more than once (AckLat leaves them out)
	Frames     uint64 // msg frames received
	Live       uint64 // of those, messages published after the receiver's last (re)join
	Replayed   uint64 // catch-up after a rejoin: published while the receiver was away
	Closes     uint64
	Rejoined   uint64 // reconnections joined again
	Unrecov    uint64 // rejoins answered recovered:false
	ErrFrames  uint64
	Lat        slotHist // live deliveries, publish -> receipt
	AckLat     slotHist // publishes acked on their first send
	RejoinTime slotHist // close -> joined again, by the rejoin's slot
}

func (s *slot) merge(o *slot) {
	s.Sent += o.Sent
	s.Acked += o.Acked
	s.AckedAgain += o.AckedAgain
	s.Frames += o.Frames
	s.Live += o.Live
	s.Replayed += o.Replayed
	s.Closes += o.Closes
	s.Rejoined += o.Rejoined
	s.Unrecov += o.Unrecov
	s.ErrFrames += o.ErrFrames
	s.Lat.merge(&o.Lat)
	s.AckLat.merge(&o.AckLat)
	s.RejoinTime.merge(&o.RejoinTime)
}

// slotJSON is the sparse wire form between bench processes.
type slotJSON struct {
	C   [10]uint64  `json:"c"`
	Lat [][2]uint64 `json:"l,omitempty"` // [index, count]; the last pair is [-1 as max, n] (see pack)
	Ack [][2]uint64 `json:"a,omitempty"`
	Rej [][2]uint64 `json:"r,omitempty"`
}

func packHist(h *slotHist) [][2]uint64 {
	if h.N == 0 {
		return nil
	}
	var out [][2]uint64
	for i, c := range h.Counts {
		if c != 0 {
			out = append(out, [2]uint64{uint64(i), uint64(c)})
		}
	}
	return append(out, [2]uint64{math.MaxUint64, uint64(h.Max)})
}

func unpackHist(p [][2]uint64, h *slotHist) {
	for _, b := range p {
		if b[0] == math.MaxUint64 {
			h.Max = int64(b[1])
			continue
		}
		if b[0] < slotBuckets {
			h.Counts[b[0]] += uint32(b[1])
			h.N += b[1]
		}
	}
}

func packSlots(s []slot) []slotJSON {
	out := make([]slotJSON, len(s))
	for i := range s {
		x := &s[i]
		out[i] = slotJSON{C: [10]uint64{x.Sent, x.Acked, x.Frames, x.Live, x.Replayed, x.Closes, x.Rejoined, x.Unrecov, x.ErrFrames, x.AckedAgain},
			Lat: packHist(&x.Lat), Ack: packHist(&x.AckLat), Rej: packHist(&x.RejoinTime)}
	}
	return out
}

func unpackSlots(in []slotJSON) []slot {
	out := make([]slot, len(in))
	for i, j := range in {
		x := &out[i]
		x.Sent, x.Acked, x.Frames, x.Live, x.Replayed, x.Closes, x.Rejoined, x.Unrecov, x.ErrFrames, x.AckedAgain =
			j.C[0], j.C[1], j.C[2], j.C[3], j.C[4], j.C[5], j.C[6], j.C[7], j.C[8], j.C[9]
		unpackHist(j.Lat, &x.Lat)
		unpackHist(j.Ack, &x.AckLat)
		unpackHist(j.Rej, &x.RejoinTime)
	}
	return out
}

// mergeSlots adds o into s slot by slot.
func mergeSlots(s, o []slot) []slot {
	for len(s) < len(o) {
		s = append(s, slot{})
	}
	for i := range o {
		s[i].merge(&o[i])
	}
	return s
}

// SeriesPoint is one step of the series in the report.
type SeriesPoint struct {
	T          float64       `json:"t_s"` // seconds from the level's start to the step's start
	SentPerS   float64       `json:"sent_per_s"`
	AckedPerS  float64       `json:"acked_per_s"`
	FramesPerS float64       `json:"frames_per_s"`
	Replayed   uint64        `json:"replayed"`
	Closes     uint64        `json:"closes"`
	Rejoined   uint64        `json:"rejoined"`
	Unrecov    uint64        `json:"recovered_false"`
	Errors     uint64        `json:"err_frames"`
	P50        time.Duration `json:"p50_ns"`
	P99        time.Duration `json:"p99_ns"`
	AckP99     time.Duration `json:"ack_p99_ns"`
	RejoinMax  time.Duration `json:"rejoin_max_ns,omitempty"`
	// each watched process (--pid, then --watch) at the step's end
	RSS    []int64   `json:"rss_bytes,omitempty"`
	CPUPct []float64 `json:"cpu_pct,omitempty"`
}

// Event is one line of --events: a moment the operator marked (a fault).
type Event struct {
	T    float64 `json:"t_s"` // from the level's start
	At   int64   `json:"unix_ns"`
	Name string  `json:"name"`
}

// EventWindow is what happened from one event to the next (or the end).
type EventWindow struct {
	Event
	Until      float64 `json:"until_s"`
	Sent       uint64  `json:"sent"`
	Acked      uint64  `json:"acked"`
	AckedAgain uint64  `json:"acked_after_resend"` // not in the ack percentiles: their latency is the outage's
	Closes     uint64  `json:"closes"`
	Rejoined   uint64  `json:"rejoined"`
	Unrecov    uint64  `json:"recovered_false"`
	Replayed   uint64  `json:"replayed"`
	AckP50     float64 `json:"ack_p50_ms"`
	AckP95     float64 `json:"ack_p95_ms"`
	AckP99     float64 `json:"ack_p99_ms"`
	LatP99     float64 `json:"p99_ms"`
	RejoinP99  float64 `json:"rejoin_p99_ms,omitempty"`
	RejoinMax  float64 `json:"rejoin_max_ms,omitempty"`
	RejoinPerS float64 `json:"rejoined_per_s_peak,omitempty"`
}

// readEvents reads --events: lines of "UNIX_NS NAME..." ('#' starts a
// comment), written by whoever injects the faults.
func readEvents(path string, start time.Time) ([]Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read --events: %w", err)
	}
	defer f.Close()
	var out []Event
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		ts, name, _ := strings.Cut(line, " ")
		v, err := strconv.ParseInt(ts, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("--events line %d: want UNIX_NS NAME, got %q", n, line)
		}
		out = append(out, Event{At: v, T: float64(v-start.UnixNano()) / 1e9, Name: strings.TrimSpace(name)})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("cannot read --events: %w", err)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].At < out[j].At })
	return out, nil
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// windows sums the slots from each event to the next.
func windows(slots []slot, step time.Duration, events []Event) []EventWindow {
	end := float64(len(slots)) * step.Seconds()
	var out []EventWindow
	for i, ev := range events {
		until := end
		if i+1 < len(events) {
			until = events[i+1].T
		}
		w := EventWindow{Event: ev, Until: until}
		var ack, lat, rej slotHist
		for k := range slots {
			// a slot belongs to the window its middle falls in
			t := (float64(k) + 0.5) * step.Seconds()
			if t < ev.T || t >= until {
				continue
			}
			s := &slots[k]
			w.Sent += s.Sent
			w.Acked += s.Acked
			w.AckedAgain += s.AckedAgain
			w.Closes += s.Closes
			w.Rejoined += s.Rejoined
			w.Unrecov += s.Unrecov
			w.Replayed += s.Replayed
			ack.merge(&s.AckLat)
			lat.merge(&s.Lat)
			rej.merge(&s.RejoinTime)
			w.RejoinPerS = math.Max(w.RejoinPerS, float64(s.Rejoined)/step.Seconds())
		}
		w.AckP50, w.AckP95, w.AckP99 = ms(ack.quantile(0.5)), ms(ack.quantile(0.95)), ms(ack.quantile(0.99))
		w.LatP99 = ms(lat.quantile(0.99))
		w.RejoinP99, w.RejoinMax = ms(rej.quantile(0.99)), ms(time.Duration(rej.Max))
		out = append(out, w)
	}
	return out
}

// points turns slots and process samples into the report's series.
func points(slots []slot, step time.Duration, samples []procSample) []SeriesPoint {
	sec := step.Seconds()
	out := make([]SeriesPoint, len(slots))
	for i := range slots {
		s := &slots[i]
		out[i] = SeriesPoint{T: float64(i) * sec, SentPerS: float64(s.Sent) / sec, AckedPerS: float64(s.Acked) / sec,
			FramesPerS: float64(s.Frames) / sec, Replayed: s.Replayed, Closes: s.Closes, Rejoined: s.Rejoined,
			Unrecov: s.Unrecov, Errors: s.ErrFrames,
			P50: s.Lat.quantile(0.5), P99: s.Lat.quantile(0.99), AckP99: s.AckLat.quantile(0.99),
			RejoinMax: time.Duration(s.RejoinTime.Max)}
		if i < len(samples) {
			out[i].RSS, out[i].CPUPct = samples[i].rss, samples[i].cpuPct
		}
	}
	return out
}

// RSSGrowth is one process's memory over the tail of a run.
type RSSGrowth struct {
	Name      string  `json:"name"`
	From      float64 `json:"from_s"`
	FirstMiB  float64 `json:"first_mib"` // mean over the tail's first tenth
	LastMiB   float64 `json:"last_mib"`  // mean over its last tenth
	GrowthPct float64 `json:"growth_pct"`
	Restarted bool    `json:"restarted,omitempty"` // the PID changed inside the tail: not comparable
}

// rssGrowth compares the start and the end of the last tail of the series.
func rssGrowth(names []string, pts []SeriesPoint, samples []procSample, tail time.Duration, step time.Duration) []RSSGrowth {
	if len(pts) == 0 || tail <= 0 {
		return nil
	}
	n := min(len(pts), len(samples))
	k := min(n, int(tail/step))
	if k < 2 {
		return nil
	}
	first := n - k
	tenth := max(1, k/10)
	var out []RSSGrowth
	for p, name := range names {
		g := RSSGrowth{Name: name, From: pts[first].T}
		var a, b float64
		var na, nb int
		for i := first; i < n; i++ {
			if p >= len(samples[i].rss) || samples[i].rss[p] <= 0 {
				continue
			}
			if i > first && samples[i].pid[p] != samples[i-1].pid[p] {
				g.Restarted = true
			}
			v := float64(samples[i].rss[p]) / (1 << 20)
			if i < first+tenth {
				a += v
				na++
			}
			if i >= n-tenth {
				b += v
				nb++
			}
		}
		if na > 0 && nb > 0 {
			g.FirstMiB, g.LastMiB = a/float64(na), b/float64(nb)
			g.GrowthPct = 100 * (g.LastMiB - g.FirstMiB) / g.FirstMiB
		}
		out = append(out, g)
	}
	return out
}
