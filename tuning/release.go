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
// nothing else to do. Under steady load it returns only free pages the
// load has left unused for a while (releaseSpareFor, below).

const (
	releaseMinBurst = 4 << 20 // bytes allocated since the last release, at least
	releaseQuiet    = 1 << 20 // bytes allocated per second, at most, to be quiet
	releaseMinGap   = 10 * time.Second
)

// Spare pages under steady load. The runtime keeps the heap's free pages
// up to 10% over the heap goal, and a collection that falls behind its
// goal (a mark slowed by a shared core while the load allocates on)
// grows the heap past it: pages the steady cycle never uses again, which
// the runtime then keeps. With 16,700 connections and 334 publishes a
// second the node held 1.7-2.9 MB of such free pages, and each of a few
// such overshoots on a loaded machine added 1-2 MiB of RSS for the rest
// of the run (docs/bench-notes/2026-12-06.md, "rss29"). Pages that stay
// free through every sample of releaseSpareFor, across at least two
// collections, are not the cycle's: they are returned, at most once per
// releaseSpareGap (a forced collection each time, next to the ~40 a
// minute such a load makes anyway).
const (
	releaseMinSpare = 1 << 20 // free pages kept back, at least (and live/16)
	releaseSpareFor = 10 * time.Second
	releaseSpareGap = 30 * time.Second
)

// heapSample is what the releaser reads each period.
type heapSample struct {
	allocs uint64 // the process' cumulative allocated bytes
	live   uint64 // the heap's live bytes after the last collection
	free   uint64 // the heap's free pages not returned to the OS
	cycles uint64 // collections so far
}

// releaser decides when; ReleaseAfterBursts samples and acts.
type releaser struct {
	prev    uint64 // allocated bytes at the last sample
	pending uint64 // bytes allocated in busy periods since the last release
	last    time.Time
	started bool
	// spareSince: since when every sample found spare free pages (zero:
	// the last did not); spareCycles: the collections by then.
	spareSince  time.Time
	spareCycles uint64
}

// step takes a sample h every period of every. It reports whether to
// release now.
func (r *releaser) step(now time.Time, every time.Duration, h heapSample) bool {
	if !r.started {
		r.started, r.prev, r.last = true, h.allocs, now
		return false
	}
	d := h.allocs - r.prev
	r.prev = h.allocs
	if r.spare(now, h) {
		r.pending, r.last, r.spareSince = 0, now, time.Time{}
		return true
	}
	if float64(d) > float64(releaseQuiet)*every.Seconds() {
		// Busy: the burst goes on. (A quiet period's trickle is not
		// counted: an idle node does not collect every so often.)
		r.pending += d
		return false
	}
	if r.pending < releaseMinBurst || r.pending < h.live/4 || now.Sub(r.last) < releaseMinGap {
		return false
	}
	r.pending, r.last, r.spareSince = 0, now, time.Time{}
	return true
}

// spare follows the heap's free pages (see releaseSpareFor) and reports
// whether they have been spare long enough to return.
func (r *releaser) spare(now time.Time, h heapSample) bool {
	if h.free < max(releaseMinSpare, h.live/16) {
		r.spareSince = time.Time{}
		return false
	}
	if r.spareSince.IsZero() {
		r.spareSince, r.spareCycles = now, h.cycles
		return false
	}
	return now.Sub(r.spareSince) >= releaseSpareFor && h.cycles >= r.spareCycles+2 &&
		now.Sub(r.last) >= releaseSpareGap
}

// ReleaseAfterBursts samples the allocation rate every period until ctx
// ends, and gives the heap's free pages back to the OS once the process
// is quiet after a burst of allocation (see above). log may be nil.
func ReleaseAfterBursts(ctx context.Context, every time.Duration, log *slog.Logger) {
	samples := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}, {Name: "/gc/heap/live:bytes"},
		{Name: "/memory/classes/heap/free:bytes"}, {Name: "/gc/cycles/total:gc-cycles"}}
	value := func(i int) uint64 {
		if samples[i].Value.Kind() == metrics.KindUint64 {
			return samples[i].Value.Uint64()
		}
		return 0
	}
	var r releaser
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		metrics.Read(samples)
		if r.step(time.Now(), every, heapSample{allocs: value(0), live: value(1), free: value(2), cycles: value(3)}) {
			t0 := time.Now()
			debug.FreeOSMemory()
			if log != nil {
				log.Debug("heap's free pages returned (quiet after a burst, or spare under load)", "took", time.Since(t0))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
