// Package hist owns the node's latency histogram type: a Prometheus
// histogram updated with atomics only, which the package that records
// into one creates and registers with its other series (RegisterMetrics
// of loop, fanout, fanout/api, fanout/proxy, fanout/webhook). It is a
// leaf: it imports none of the module's packages.
package hist

import (
	"io"
	"math"
	"strconv"
	"sync/atomic"

	vm "github.com/VictoriaMetrics/metrics"
)

// LatencyBuckets are the bucket bounds of the node's latency histograms
// (seconds).
var LatencyBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5}

// Histogram is a Prometheus histogram updated with atomics only: a bucket
// search over at most a few dozen bounds, one add, and a CAS loop for the
// float sum that retries only under contention. The metrics library's
// PrometheusHistogram takes a mutex per update instead, which measured
// slower on this hot path (every write, publish and ack), above all with
// several loops observing at once (docs/benchmarks.md); the library still
// writes these, with the node's other series. Any goroutine.
type Histogram struct {
	name   string
	labels string          // the series' labels besides le (`phase="commit"`), "" for none
	bounds []float64       // upper bounds, ascending; +Inf is implicit
	les    []string        // the le label of each bound
	counts []atomic.Uint64 // len(bounds)+1, per bucket (not cumulative)
	sum    atomic.Uint64   // math.Float64bits of the sum
}

// New panics unless bounds ascend: they are constants of the program.
func New(name string, bounds []float64) *Histogram {
	h := &Histogram{name: name, bounds: bounds, counts: make([]atomic.Uint64, len(bounds)+1)}
	for i, b := range bounds {
		if i > 0 && !(b > bounds[i-1]) {
			panic("BUG: histogram bounds of " + name + " must ascend")
		}
		h.les = append(h.les, strconv.FormatFloat(b, 'g', -1, 64))
	}
	return h
}

// Observe records v (fanout.Observer). It neither blocks nor allocates.
func (h *Histogram) Observe(v float64) {
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

// Write prints the histogram's family in the Prometheus text format, with
// the library's HELP/TYPE metadata (vm.ExposeMetadata) once per family.
// Buckets are read one by one while observations continue, so _count may
// lag _sum by an observation or two; Prometheus tolerates that.
func (h *Histogram) Write(w io.Writer) {
	vm.WriteMetadataIfNeeded(w, h.name, "histogram")
	h.series(w)
}

// series prints the histogram's lines without the family's metadata: a
// family of several labelled histograms (Family) prints that once.
func (h *Histogram) series(w io.Writer) {
	bucket, other := h.name+`_bucket{`, ""
	if h.labels != "" {
		bucket += h.labels + ","
		other = "{" + h.labels + "}"
	}
	var cum uint64
	for i, le := range h.les {
		cum += h.counts[i].Load()
		line(w, bucket+`le="`+le+`"}`, float64(cum))
	}
	cum += h.counts[len(h.bounds)].Load()
	line(w, bucket+`le="+Inf"}`, float64(cum))
	line(w, h.name+"_sum"+other, math.Float64frombits(h.sum.Load()))
	line(w, h.name+"_count"+other, float64(cum))
}

// line writes one series (name with its labels) without metadata.
func line(w io.Writer, series string, v float64) {
	num := strconv.FormatFloat(v, 'g', -1, 64)
	if v == math.Trunc(v) && math.Abs(v) < 1<<53 {
		num = strconv.FormatInt(int64(v), 10) // counts read better without an exponent
	}
	_, _ = io.WriteString(w, series+" "+num+"\n")
}

// Family is one histogram family whose series differ by one label.
type Family struct {
	name string
	hs   []*Histogram
}

// NewFamily returns a family of histograms named name, one per value of
// label, in that order (see Get).
func NewFamily(name, label string, values []string, bounds []float64) *Family {
	f := &Family{name: name}
	for _, v := range values {
		h := New(name, bounds)
		h.labels = label + `="` + v + `"`
		f.hs = append(f.hs, h)
	}
	return f
}

// Get returns the family's histogram of the i-th label value.
func (f *Family) Get(i int) *Histogram { return f.hs[i] }

// Write prints the family: its metadata once, then each label value's
// series in order.
func (f *Family) Write(w io.Writer) {
	vm.WriteMetadataIfNeeded(w, f.name, "histogram")
	for _, h := range f.hs {
		h.series(w)
	}
}
