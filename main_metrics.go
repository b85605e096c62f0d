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
	labels string          // the series' labels besides le (`phase="commit"`), "" for none
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
	h.series(e)
}

// series prints the histogram's lines without the family's metadata: a
// family of several labelled histograms (histFamily) prints that once.
func (h *histogram) series(e *expo) {
	bucket, other := h.name+`_bucket{`, ""
	if h.labels != "" {
		bucket += h.labels + ","
		other = "{" + h.labels + "}"
	}
	var cum uint64
	for i, le := range h.les {
		cum += h.counts[i].Load()
		e.line(bucket+`le="`+le+`"}`, float64(cum))
	}
	cum += h.counts[len(h.bounds)].Load()
	e.line(bucket+`le="+Inf"}`, float64(cum))
	e.line(h.name+"_sum"+other, math.Float64frombits(h.sum.Load()))
	e.line(h.name+"_count"+other, float64(cum))
}

// histFamily is one histogram family whose series differ by one label.
type histFamily struct {
	name string
	hs   []*histogram
}

// newHistFamily returns a family of histograms named name, one per value
// of label, in that order (see get).
func newHistFamily(name, label string, values []string, bounds []float64) *histFamily {
	f := &histFamily{name: name}
	for _, v := range values {
		h := newHistogram(name, bounds)
		h.labels = label + `="` + v + `"`
		f.hs = append(f.hs, h)
	}
	return f
}

// get returns the family's histogram of the i-th label value.
func (f *histFamily) get(i int) *histogram { return f.hs[i] }

func (f *histFamily) write(e *expo) {
	e.family(f.name, "histogram")
	for _, h := range f.hs {
		h.series(e)
	}
}
