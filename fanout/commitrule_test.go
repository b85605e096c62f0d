package fanout

import (
	"math/rand"
	"slices"
	"testing"
	"time"
)

// The commit rule on a synthetic clock: simulate replays a worker's
// gatherer (the same holdUntil and arrivals as the pool) over given
// publish arrival times, with every commit taking commit, and reports for
// each publish how long it waited to be handed off and for each batch its
// size and what bound its hand-off.

var simEpoch = time.Unix(1_000_000_000, 0)

type simBatch struct {
	n        int
	first    time.Time // its first publish
	freed    time.Time // when the commit before it had finished (or first, if none was in flight)
	handedAt time.Time
}

type simResult struct {
	batches []simBatch
	waits   []time.Duration // per publish: hand-off - arrival
}

func simulate(cfg PoolConfig, at []time.Duration, commit time.Duration) simResult {
	cfg.setDefaults()
	seen := newArrivals(cfg.Window)
	var (
		res      simResult
		lastHand time.Time
		inflight time.Time // the commit in flight ends then
		batch    []time.Time
		now      = simEpoch
	)
	i := 0
	add := func() {
		batch = append(batch, simEpoch.Add(at[i]))
		i++
	}
	for i < len(at) || len(batch) > 0 {
		next := simEpoch.Add(365 * 24 * time.Hour)
		if i < len(at) {
			next = simEpoch.Add(at[i])
		}
		if now.Before(inflight) {
			// A commit is in flight: the batch gathers until it ends.
			if inflight.Before(next) {
				now = inflight
			} else {
				now = next
				add()
			}
			continue
		}
		if len(batch) == 0 {
			now = next
			add()
			continue
		}
		due := cfg.holdUntil(len(batch), batch[0], seen.rate(len(batch), now.Sub(lastHand)))
		if !now.Before(due) {
			freed := later(inflight, batch[0])
			res.batches = append(res.batches, simBatch{n: len(batch), first: batch[0], freed: freed, handedAt: now})
			for _, t := range batch {
				res.waits = append(res.waits, now.Sub(t))
			}
			if !lastHand.IsZero() {
				seen.handOff(len(batch), now.Sub(lastHand))
			}
			lastHand, inflight, batch = now, now.Add(commit), batch[:0]
			continue
		}
		if due.Before(next) {
			now = due
		} else {
			now = next
			add()
		}
	}
	return res
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// paced returns n arrivals at rate per second starting at from.
func paced(from time.Duration, rate float64, n int) []time.Duration {
	out := make([]time.Duration, n)
	for k := range out {
		out[k] = from + time.Duration(float64(k)*float64(time.Second)/rate)
	}
	return out
}

func poisson(rng *rand.Rand, from time.Duration, rate float64, n int) []time.Duration {
	out := make([]time.Duration, n)
	t := float64(from)
	for k := range out {
		t += rng.ExpFloat64() / rate * float64(time.Second)
		out[k] = time.Duration(t)
	}
	return out
}

func sizes(r simResult, skip int) []int {
	var s []int
	for _, b := range r.batches[skip:] {
		s = append(s, b.n)
	}
	return s
}

func median(s []int) int {
	s = slices.Clone(s)
	slices.Sort(s)
	return s[len(s)/2]
}

func TestCommitRuleFullBatchAndNoWindowGoAtOnce(t *testing.T) {
	var cfg PoolConfig
	cfg.setDefaults()
	if got := cfg.holdUntil(cfg.MinFill, simEpoch, 5000); !got.Equal(simEpoch) {
		t.Fatalf("a batch of MinFill is held until %v after its first publish", got.Sub(simEpoch))
	}
	cfg.Window = -1
	if got := cfg.holdUntil(1, simEpoch, 1e6); !got.Equal(simEpoch) {
		t.Fatalf("with no window a publish is held %v", got.Sub(simEpoch))
	}
}

func TestCommitRuleHoldFollowsRateUpToWindow(t *testing.T) {
	var cfg PoolConfig
	cfg.setDefaults()
	prev := time.Duration(0)
	for rate := 100.0; rate <= 1e6; rate *= 1.25 {
		hold := cfg.holdUntil(1, simEpoch, rate).Sub(simEpoch)
		if hold < prev {
			t.Fatalf("at %.0f/s the hold %v is shorter than at a lower rate (%v)", rate, hold, prev)
		}
		if hold > cfg.Window {
			t.Fatalf("at %.0f/s the hold %v is longer than the window %v", rate, hold, cfg.Window)
		}
		if rate < 600 && hold != 0 {
			t.Fatalf("at %.0f/s (no company due) a publish is held %v", rate, hold)
		}
		prev = hold
	}
	// Below the rate at which the window fills a batch, the hold is the
	// window's share of MinFill (less one arrival): 1,500/s brings 15 of
	// 48 in 10 ms, so 3.125 ms - 0.667 ms.
	if hold := cfg.holdUntil(3, simEpoch, 1500).Sub(simEpoch); hold < 2400*time.Microsecond || hold > 2500*time.Microsecond {
		t.Fatalf("at 1,500/s a batch is held %v, want 2.46 ms", hold)
	}
}

func TestCommitRuleLonePublishAfterPauseGoesAtOnce(t *testing.T) {
	for _, pause := range []time.Duration{100 * time.Millisecond, time.Second, time.Minute} {
		// A second at 10,000/s (batches fill and are held the whole
		// window), then one publish after the pause.
		at := paced(0, 10000, 10000)
		lone := at[len(at)-1] + pause
		at = append(at, lone)
		r := simulate(PoolConfig{}, at, time.Millisecond)
		if med := median(sizes(r, 10)); med < 48 {
			t.Fatalf("at 10,000/s the median batch is %d, want >= 48", med)
		}
		last := r.batches[len(r.batches)-1]
		if last.n != 1 || !last.first.Equal(simEpoch.Add(lone)) {
			t.Fatalf("pause %v: the lone publish was not a batch of its own: %+v", pause, last)
		}
		if w := r.waits[len(r.waits)-1]; w != 0 {
			t.Fatalf("pause %v: the lone publish after the pause waited %v", pause, w)
		}
	}
	// The very first publish of a worker too.
	if r := simulate(PoolConfig{}, []time.Duration{time.Second}, time.Millisecond); r.waits[0] != 0 {
		t.Fatalf("a worker's first publish waited %v", r.waits[0])
	}
}

func TestCommitRuleNeverPastWindow(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for _, window := range []time.Duration{2 * time.Millisecond, 10 * time.Millisecond, 50 * time.Millisecond} {
		for _, rate := range []float64{200, 1000, 1500, 3000, 4000, 5000, 10000, 50000} {
			for _, commit := range []time.Duration{200 * time.Microsecond, time.Millisecond, 5 * time.Millisecond} {
				// Poisson arrivals, with a burst and a pause in the middle.
				at := poisson(rng, 0, rate, 2000)
				end := at[len(at)-1]
				at = append(at, paced(end+time.Millisecond, 1e6, 30)...)
				at = append(at, poisson(rng, end+200*time.Millisecond, rate, 2000)...)
				r := simulate(PoolConfig{Window: window}, at, commit)
				for _, b := range r.batches {
					// A batch waits for the commit in flight; beyond that,
					// never past its first publish + the window.
					if limit := later(b.freed, b.first.Add(window)); b.handedAt.After(limit) {
						t.Fatalf("window %v, %.0f/s, commit %v: a batch of %d handed off %v after its first publish (the commit before it ended %v after)",
							window, rate, commit, b.n, b.handedAt.Sub(b.first), b.freed.Sub(b.first))
					}
				}
			}
		}
	}
}

func TestCommitRuleShortHoldWhereTheWindowCannotFill(t *testing.T) {
	// One soak node's worker: 1,500/s, so the 10 ms window would bring 15
	// of 48: a batch is held ~2.5 ms, not 10.
	r := simulate(PoolConfig{}, paced(0, 1500, 3000), time.Millisecond)
	var worst time.Duration
	for _, w := range r.waits[100:] {
		worst = max(worst, w)
	}
	if worst > 2600*time.Microsecond {
		t.Fatalf("at 1,500/s a publish waited up to %v, want <= the 2.46 ms hold", worst)
	}
	if med := median(sizes(r, 10)); med < 3 {
		t.Fatalf("at 1,500/s the median batch is %d: the hold gathered no company", med)
	}
	// 5,000/s: the window brings 50, so the batch waits for its 48.
	r = simulate(PoolConfig{}, paced(0, 5000, 5000), time.Millisecond)
	if med := median(sizes(r, 10)); med < 48 {
		t.Fatalf("at 5,000/s the median batch is %d, want >= 48", med)
	}
	// 400/s: no company is due within the window, every publish goes as
	// soon as no commit is in flight.
	r = simulate(PoolConfig{}, paced(0, 400, 400), time.Millisecond)
	for k, w := range r.waits {
		if w != 0 {
			t.Fatalf("at 400/s publish %d waited %v", k, w)
		}
	}
}
