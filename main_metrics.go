package main

import (
	"math"
	"strconv"
	"sync/atomic"
)

// histogram is a Prometheus histogram updated with atomics only: a bucket
// search over at most a few dozen bounds, one add, and a CAS loop for the
// float sum that retries only under contention. The metrics library's
// PrometheusHistogram takes a mutex per update instead, which measured
// slower on this hot path (every write, publish and ack), above all with
// several loops observing at once (docs/benchmarks.md); the library still
// writes these, with the node's other series. Any goroutine.
type histogram struct {
	name   string
	bounds []float64       // upper bounds, ascending; +Inf is implicit
	les    []string        // the le label of each bound
	counts []atomic.Uint64 // len(bounds)+1, per bucket (not cumulative)
	sum    atomic.Uint64   // math.Float64bits of the sum
}

// newHistogram panics unless bounds ascend: they are constants of the
// program.
func newHistogram(name string, bounds []float64) *histogram {
	h := &histogram{name: name, bounds: bounds, counts: make([]atomic.Uint64, len(bounds)+1)}
	for i, b := range bounds {
		if i > 0 && !(b > bounds[i-1]) {
			panic("BUG: histogram bounds of " + name + " must ascend")
		}
		h.les = append(h.les, strconv.FormatFloat(b, 'g', -1, 64))
	}
	return h
}

// Observe records v (fanout.Observer).
func (h *histogram) Observe(v float64) {
	// Linear search: bucket lists are short and most observations land in
	// the first few buckets, so this beats a binary search in practice.
	i := 0
	for i < len(h.bounds) && v > h.bounds[i] {
		i++
	}
	h.counts[i].Add(1)
	for {
		old := h.sum.Load()
		if h.sum.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			return
		}
	}
}

// write prints the histogram's family. Buckets are read one by one while
// observations continue, so _count may lag _sum by an observation or two;
// Prometheus tolerates that.
func (h *histogram) write(e *expo) {
	e.family(h.name, "histogram")
	var cum uint64
	for i, le := range h.les {
		cum += h.counts[i].Load()
		e.line(h.name+`_bucket{le="`+le+`"}`, float64(cum))
	}
	cum += h.counts[len(h.bounds)].Load()
	e.line(h.name+`_bucket{le="+Inf"}`, float64(cum))
	e.line(h.name+"_sum", math.Float64frombits(h.sum.Load()))
	e.line(h.name+"_count", float64(cum))
}
