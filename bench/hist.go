//go:build linux

package bench

import (
	"math/bits"
	"time"
)

// Log-linear buckets in the HDR style: values below 2^histSubBits are exact,
// above that every power of two is split into 2^histSubBits equal buckets, so
// a recorded value is off by less than 1/128 (0.8%) of itself. The array is
// fixed, so Record never allocates and two histograms merge by adding counts.
const (
	histSubBits  = 7
	histSubCount = 1 << histSubBits
	histBuckets  = (64 - histSubBits + 1) * histSubCount
)

// Hist is a latency histogram of nanosecond values. The zero value is
// empty and ready. It is not safe for concurrent use: each event loop owns
// its own and they are merged once the loops have stopped.
type Hist struct {
	counts [histBuckets]uint64
	n      uint64
	max    int64
	sum    float64
}

func histIndex(v uint64) int {
	if v < histSubCount {
		return int(v)
	}
	e := bits.Len64(v) - histSubBits - 1
	sub := (v >> uint(e)) & (histSubCount - 1)
	return (e+1)<<histSubBits + int(sub)
}

// histLow is the smallest value that falls into bucket i.
func histLow(i int) uint64 {
	if i < histSubCount {
		return uint64(i)
	}
	e := i>>histSubBits - 1
	sub := uint64(i & (histSubCount - 1))
	return (histSubCount + sub) << uint(e)
}

// Record adds one value in nanoseconds; negative values (clock skew between
// processes) count as zero.
func (h *Hist) Record(ns int64) {
	if ns < 0 {
		ns = 0
	}
	h.counts[histIndex(uint64(ns))]++
	h.n++
	h.sum += float64(ns)
	if ns > h.max {
		h.max = ns
	}
}

// Count is the number of recorded values.
func (h *Hist) Count() uint64 { return h.n }

// Max is the largest recorded value, exact.
func (h *Hist) Max() time.Duration { return time.Duration(h.max) }

// Mean is the exact arithmetic mean.
func (h *Hist) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.n))
}

// Merge adds every value of o to h.
func (h *Hist) Merge(o *Hist) {
	if o.n == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
	if o.max > h.max {
		h.max = o.max
	}
}

// Reset empties h.
func (h *Hist) Reset() { *h = Hist{} }

// Quantile returns the value at quantile q (0..1): the middle of the bucket
// holding the ceil(q·n)-th smallest value, never above the exact maximum.
func (h *Hist) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q*float64(h.n) + 0.9999999)
	if rank < 1 {
		rank = 1
	}
	if rank > h.n {
		rank = h.n
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			lo := histLow(i)
			hi := histLow(i + 1)
			v := int64(lo + (hi-lo)/2)
			if v > h.max {
				v = h.max
			}
			return time.Duration(v)
		}
	}
	return time.Duration(h.max)
}

// histJSON is the sparse wire form used between bench processes.
type histJSON struct {
	N       uint64     `json:"n"`
	Max     int64      `json:"max"`
	Sum     float64    `json:"sum"`
	Buckets [][2]int64 `json:"b,omitempty"` // [index, count]
}

func (h *Hist) toJSON() histJSON {
	j := histJSON{N: h.n, Max: h.max, Sum: h.sum}
	for i, c := range h.counts {
		if c != 0 {
			j.Buckets = append(j.Buckets, [2]int64{int64(i), int64(c)})
		}
	}
	return j
}

func (h *Hist) fromJSON(j histJSON) {
	*h = Hist{n: j.N, max: j.Max, sum: j.Sum}
	for _, b := range j.Buckets {
		if b[0] >= 0 && b[0] < histBuckets {
			h.counts[b[0]] += uint64(b[1])
		}
	}
}

// Percentiles is the summary the reports print.
type Percentiles struct {
	Count uint64        `json:"count"`
	P50   time.Duration `json:"p50_ns"`
	P90   time.Duration `json:"p90_ns"`
	P95   time.Duration `json:"p95_ns"`
	P99   time.Duration `json:"p99_ns"`
	P999  time.Duration `json:"p999_ns"`
	Max   time.Duration `json:"max_ns"`
	Mean  time.Duration `json:"mean_ns"`
}

// Summary computes the reported percentiles.
func (h *Hist) Summary() Percentiles {
	return Percentiles{
		Count: h.n,
		P50:   h.Quantile(0.50),
		P90:   h.Quantile(0.90),
		P95:   h.Quantile(0.95),
		P99:   h.Quantile(0.99),
		P999:  h.Quantile(0.999),
		Max:   h.Max(),
		Mean:  h.Mean(),
	}
}
