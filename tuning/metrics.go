package tuning

import (
	"bufio"
	"io"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
)

// The metrics kit: counters, gauges and fixed-bucket histograms updated on
// the hot path with single atomic operations (no lock, no allocation), and a
// writer of the Prometheus text exposition format (version 0.0.4) that only
// the scrape handler pays for. It is small on purpose: the node exposes a
// few dozen series and needs no registry.

// Counter only goes up. Any goroutine.
type Counter struct{ v atomic.Uint64 }

// Inc adds one.
func (c *Counter) Inc() { c.v.Add(1) }

// Add adds n.
func (c *Counter) Add(n uint64) { c.v.Add(n) }

// Load returns the count.
func (c *Counter) Load() uint64 { return c.v.Load() }

// Gauge goes up and down. Any goroutine.
type Gauge struct{ v atomic.Int64 }

// Add adds n (negative to subtract).
func (g *Gauge) Add(n int64) { g.v.Add(n) }

// Set replaces the value.
func (g *Gauge) Set(n int64) { g.v.Store(n) }

// Load returns the value.
func (g *Gauge) Load() int64 { return g.v.Load() }

// Histogram counts observations into fixed buckets. Observe is one bucket
// search over at most a few dozen bounds and two atomic adds (plus a CAS
// loop for the float sum, which only retries under contention): no lock and
// no allocation. Any goroutine.
type Histogram struct {
	bounds []float64       // upper bounds, ascending; +Inf is implicit
	counts []atomic.Uint64 // len(bounds)+1, per bucket (not cumulative)
	sum    atomic.Uint64   // math.Float64bits of the sum
}

// NewHistogram returns a histogram with the given upper bounds, which must
// be ascending (it panics otherwise: bounds are constants of the program).
func NewHistogram(bounds ...float64) *Histogram {
	for i := 1; i < len(bounds); i++ {
		if !(bounds[i] > bounds[i-1]) {
			panic("BUG: tuning: histogram bounds must ascend")
		}
	}
	return &Histogram{bounds: append([]float64(nil), bounds...), counts: make([]atomic.Uint64, len(bounds)+1)}
}

// Observe records v.
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

// Snapshot reads the histogram for a scrape. Buckets are read one by one
// while observations continue, so Count may lag Sum by an observation or
// two; Prometheus tolerates that.
func (h *Histogram) Snapshot() HistogramValue {
	v := HistogramValue{Bounds: h.bounds, Counts: make([]uint64, len(h.counts))}
	for i := range h.counts {
		v.Counts[i] = h.counts[i].Load()
	}
	v.Sum = math.Float64frombits(h.sum.Load())
	return v
}

// HistogramValue is a histogram as read: Counts[i] counts the observations
// <= Bounds[i] (and > Bounds[i-1]); the last element counts those above every
// bound. Histograms kept elsewhere (the publish pool's batch sizes) are
// exposed by filling one directly.
type HistogramValue struct {
	Bounds []float64
	Counts []uint64 // len(Bounds)+1, per bucket
	Sum    float64
}

// Count is the number of observations.
func (v HistogramValue) Count() uint64 {
	var n uint64
	for _, c := range v.Counts {
		n += c
	}
	return n
}

// MetricsWriter writes the Prometheus text exposition format. Series of one
// family must be written one after another: HELP and TYPE are written
// before the first series of each family. Label arguments are name, value
// pairs. Write errors are sticky and returned by Flush.
type MetricsWriter struct {
	w    *bufio.Writer
	last string
	buf  []byte
}

// NewMetricsWriter writes to w; call Flush at the end.
func NewMetricsWriter(w io.Writer) *MetricsWriter {
	return &MetricsWriter{w: bufio.NewWriter(w)}
}

// Counter writes one counter series.
func (m *MetricsWriter) Counter(name, help string, v float64, labels ...string) {
	m.header(name, help, "counter")
	m.sample(name, "", labels, "", "", v)
}

// Gauge writes one gauge series.
func (m *MetricsWriter) Gauge(name, help string, v float64, labels ...string) {
	m.header(name, help, "gauge")
	m.sample(name, "", labels, "", "", v)
}

// Histogram writes one histogram series: cumulative _bucket lines with le
// labels, then _sum and _count.
func (m *MetricsWriter) Histogram(name, help string, h HistogramValue, labels ...string) {
	m.header(name, help, "histogram")
	var cum uint64
	for i, c := range h.Counts {
		cum += c
		le := "+Inf"
		if i < len(h.Bounds) {
			le = formatFloat(h.Bounds[i])
		}
		m.sample(name, "_bucket", labels, "le", le, float64(cum))
	}
	m.sample(name, "_sum", labels, "", "", h.Sum)
	m.sample(name, "_count", labels, "", "", float64(cum))
}

// Flush writes what is buffered and returns the first write error.
func (m *MetricsWriter) Flush() error { return m.w.Flush() }

func (m *MetricsWriter) header(name, help, typ string) {
	if name == m.last {
		return
	}
	m.last = name
	m.buf = append(m.buf[:0], "# HELP "...)
	m.buf = append(m.buf, name...)
	m.buf = append(m.buf, ' ')
	m.buf = appendEscaped(m.buf, help, false)
	m.buf = append(m.buf, "\n# TYPE "...)
	m.buf = append(m.buf, name...)
	m.buf = append(m.buf, ' ')
	m.buf = append(m.buf, typ...)
	m.buf = append(m.buf, '\n')
	_, _ = m.w.Write(m.buf)
}

func (m *MetricsWriter) sample(name, suffix string, labels []string, extraK, extraV string, v float64) {
	if len(labels)%2 != 0 {
		panic("BUG: tuning: metric labels must be name, value pairs")
	}
	b := append(m.buf[:0], name...)
	b = append(b, suffix...)
	if len(labels) > 0 || extraK != "" {
		b = append(b, '{')
		sep := false
		for i := 0; i < len(labels); i += 2 {
			if sep {
				b = append(b, ',')
			}
			sep = true
			b = append(b, labels[i]...)
			b = append(b, '=', '"')
			b = appendEscaped(b, labels[i+1], true)
			b = append(b, '"')
		}
		if extraK != "" {
			if sep {
				b = append(b, ',')
			}
			b = append(b, extraK...)
			b = append(b, '=', '"')
			b = append(b, extraV...)
			b = append(b, '"')
		}
		b = append(b, '}')
	}
	b = append(b, ' ')
	b = append(b, formatFloat(v)...)
	b = append(b, '\n')
	m.buf = b
	_, _ = m.w.Write(b)
}

// appendEscaped escapes as the exposition format asks: backslash and
// newline in HELP text, and the double quote too in label values.
func appendEscaped(b []byte, s string, quote bool) []byte {
	if !strings.ContainsAny(s, "\\\n\"") {
		return append(b, s...)
	}
	for i := 0; i < len(s); i++ {
		switch ch := s[i]; {
		case ch == '\\':
			b = append(b, '\\', '\\')
		case ch == '\n':
			b = append(b, '\\', 'n')
		case ch == '"' && quote:
			b = append(b, '\\', '"')
		default:
			b = append(b, ch)
		}
	}
	return b
}

func formatFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	if v == math.Trunc(v) && math.Abs(v) < 1e15 {
		return strconv.FormatInt(int64(v), 10) // counts read as counts, not 1e+06
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
