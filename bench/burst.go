//go:build linux

package bench

import (
	"fmt"
	"math"
	"time"
)

// A --burst offers N publishes on top of the run's rate within
// --burst-over, from --burst-at after the window's start: the game chat's
// bursts of 90,000 requests in a second on top of its 18,000 a second
// (bench/scripts/capacity.sh). Each publisher sends its share evenly
// over the interval, as its loop gets to it; a publish answered
// overloaded is sent again with its id after the engine's jittered,
// doubling wait (pubFailed), until acked. The burst's publishes count in
// the window's sent, acked, expected and delivered (so --verdict holds
// them to "every one acked and delivered"), but their ack latencies are
// kept out of the window's and the series' ack percentiles: those are the
// others', the load that was there before the burst. The report's
// BurstResult says how many were sent and acked, when the last was acked
// (the backlog gone), and, with --series, the others' ack percentiles and
// every receipt's p99 from the burst's start to then. Receivers cannot
// tell a burst's message from another, so the receipt p99 is everyone's.

// BurstResult is the --burst of a run.
type BurstResult struct {
	Offered int     `json:"offered"`
	AtS     float64 `json:"at_s"`   // after the window's start
	OverS   float64 `json:"over_s"` // how long its publishes took to be offered
	Sent    uint64  `json:"sent"`
	Acked   uint64  `json:"acked"`
	// BacklogGoneS is from the burst's start to its last publish acked
	// (0 when not every one was).
	BacklogGoneS float64 `json:"backlog_gone_s"`
	// During is the series from the burst's start to its last ack (with
	// --series): the others' ack percentiles, everyone's receipt p99.
	During *EventWindow `json:"during,omitempty"`
	// Before is the series from the window's start to the burst's: the
	// steady load alone (with --series).
	Before *EventWindow `json:"before,omitempty"`
}

func (p *params) validateBurst() error {
	switch {
	case p.burst < 0:
		return usagef("--burst must not be negative")
	case p.burst == 0:
		return nil
	case p.scenario == "density":
		return usagef("--burst needs publishers: not density")
	case p.step:
		return usagef("--burst applies to a run of one level, not --step")
	case p.burstOver <= 0 || p.burstAt < 0:
		return usagef("--burst-over must be positive and --burst-at not negative")
	case p.burstAt+p.burstOver > p.duration:
		return usagef("--burst-at + --burst-over (%v) must fit in --duration (%v)", p.burstAt+p.burstOver, p.duration)
	}
	return nil
}

// burstOffset is when the burst starts after the window's start.
func (p *params) burstOffset() time.Duration {
	if p.burstAt > 0 {
		return p.burstAt
	}
	return (p.duration - p.burstOver) / 2
}

// spreadBurst gives each publisher its share of n publishes, the first
// n % publishers one more, in plan order (every worker derives the same).
func (pl *plan) spreadBurst(n int) {
	if n <= 0 || pl.publishers == 0 {
		return
	}
	k := 0
	for _, s := range pl.specs {
		if !s.publish {
			continue
		}
		s.burst = n / pl.publishers
		if k < n%pl.publishers {
			s.burst++
		}
		k++
	}
}

// publishBurst sends what each publisher owes of its share by now: the
// share times the part of --burst-over past since bs, rounded up.
func (l *loop) publishBurst(now, bs int64) {
	frac := 1.0
	if over := l.e.burstOver.Load(); now < bs+over {
		frac = float64(now-bs) / float64(over)
	}
	inWin := l.inWindow(now)
	for _, c := range l.pubs {
		if c.spec.burst == 0 || c.burstSent >= c.spec.burst || c.state != stReady {
			continue
		}
		due := min(c.spec.burst, int(math.Ceil(frac*float64(c.spec.burst))))
		if due <= c.burstSent {
			continue
		}
		for ; c.burstSent < due; c.burstSent++ {
			l.appendPub(c, now)
			c.inflight[c.nextID&uint64(len(c.inflight)-1)].burst = true
			if inWin {
				l.st.Sent++
				l.st.BurstSent++
				l.winSent++
				l.st.Expected += uint64(c.spec.receivers)
				l.winExp += uint64(c.spec.receivers)
			}
			if s := l.slotAt(now); s != nil {
				s.Sent++
			}
			l.sent++
		}
		l.markDirty(c)
	}
}

// burstResult judges the level's burst; start is the level's start.
func (p *params) burstResult(st *levelStats, start time.Time) *BurstResult {
	if p.burst == 0 {
		return nil
	}
	at := start.Add(p.warmup + p.burstOffset())
	b := &BurstResult{Offered: p.burst, AtS: p.burstOffset().Seconds(), OverS: p.burstOver.Seconds(),
		Sent: st.BurstSent, Acked: st.BurstAcked}
	if p.series > 0 && p.burstOffset() > 0 {
		w := windows(st.Series, p.series, []Event{
			{T: p.warmup.Seconds(), At: start.Add(p.warmup).UnixNano(), Name: "steady"},
			{T: at.Sub(start).Seconds(), At: at.UnixNano(), Name: "burst"},
		})
		b.Before = &w[0]
	}
	if b.Acked == uint64(p.burst) && st.BurstLastAck > 0 {
		b.BacklogGoneS = float64(st.BurstLastAck-at.UnixNano()) / 1e9
		if p.series > 0 {
			t0 := at.Sub(start).Seconds()
			w := windows(st.Series, p.series, []Event{
				{T: t0, At: at.UnixNano(), Name: "burst"},
				{T: t0 + math.Max(b.BacklogGoneS, p.series.Seconds()), At: st.BurstLastAck, Name: "backlog gone"},
			})
			b.During = &w[0]
		}
	}
	return b
}

// burstLine is the table's line for a burst.
func burstLine(b *BurstResult) string {
	s := ""
	if d := b.Before; d != nil {
		s = fmt.Sprintf("before the burst: ack p50 %.2fms p95 %.2fms p99 %.2fms, receipt p99 %.2fms\n", d.AckP50, d.AckP95, d.AckP99, d.LatP99)
	}
	s += fmt.Sprintf("burst: %d offered over %.1fs at %.1fs; %d sent, %d acked", b.Offered, b.OverS, b.AtS, b.Sent, b.Acked)
	if b.BacklogGoneS > 0 {
		s += fmt.Sprintf("; backlog gone %.2fs after its start", b.BacklogGoneS)
	} else {
		s += "; NOT every one acked"
	}
	if d := b.During; d != nil {
		s += fmt.Sprintf("; meanwhile the others' ack p50 %.2fms p95 %.2fms p99 %.2fms, every receipt's p99 %.2fms", d.AckP50, d.AckP95, d.AckP99, d.LatP99)
	}
	return s
}
