package tuning

import (
	"context"
	"log/slog"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// Burst release. A burst of connections (an accept and upgrade storm:
// thousands joining after a deploy or a network blip) allocates several
// times what the connections then hold: handshakes, maps and lists that
// grow while they join. Once it is over, what the last collection did not
// see stays in the heap as garbage, and the runtime keeps the pages of a
// heap up to its goal (twice the live heap at GOGC=100) rather than give
// them back: an idle node's RSS stayed ~1.3 × its live heap (density:
// docs/bench-notes/2026-12-06.md, "density2"). ReleaseAfterBursts
// collects and returns those pages (debug.FreeOSMemory) once the node is
// quiet after such a burst: one collection per burst, at a moment with
// nothing else to do, never under steady load.

const (
	releaseMinBurst = 4 << 20 // bytes allocated since the last release, at least
	releaseQuiet    = 1 << 20 // bytes allocated per second, at most, to be quiet
	releaseMinGap   = 10 * time.Second
)

// releaser decides when; ReleaseAfterBursts samples and acts.
type releaser struct {
	prev    uint64 // allocated bytes at the last sample
	pending uint64 // bytes allocated in busy periods since the last release
	last    time.Time
	started bool
}

// step takes a sample: allocs, the process' cumulative allocated bytes,
// and live, the heap's live bytes after the last collection, every period
// of every. It reports whether to release now.
func (r *releaser) step(now time.Time, every time.Duration, allocs, live uint64) bool {
	if !r.started {
		r.started, r.prev, r.last = true, allocs, now
		return false
	}
	d := allocs - r.prev
	r.prev = allocs
	if float64(d) > float64(releaseQuiet)*every.Seconds() {
		// Busy: the burst goes on. (A quiet period's trickle is not
		// counted: an idle node does not collect every so often.)
		r.pending += d
		return false
	}
	if r.pending < releaseMinBurst || r.pending < live/4 || now.Sub(r.last) < releaseMinGap {
		return false
	}
	r.pending, r.last = 0, now
	return true
}

// ReleaseAfterBursts samples the allocation rate every period until ctx
// ends, and gives the heap's free pages back to the OS once the process
// is quiet after a burst of allocation (see above). log may be nil.
func ReleaseAfterBursts(ctx context.Context, every time.Duration, log *slog.Logger) {
	samples := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}, {Name: "/gc/heap/live:bytes"}}
	var r releaser
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		metrics.Read(samples)
		var allocs, live uint64
		if samples[0].Value.Kind() == metrics.KindUint64 {
			allocs = samples[0].Value.Uint64()
		}
		if samples[1].Value.Kind() == metrics.KindUint64 {
			live = samples[1].Value.Uint64()
		}
		if r.step(time.Now(), every, allocs, live) {
			t0 := time.Now()
			debug.FreeOSMemory()
			if log != nil {
				log.Debug("quiet after a burst of allocation: heap's free pages returned", "took", time.Since(t0))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
