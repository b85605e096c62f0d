package hist

import (
	"math"
	"strings"
	"sync"
	"testing"

	vm "github.com/VictoriaMetrics/metrics"
)

// The node turns the library's metadata on (main); the expositions below
// are written as a scrape writes them.
func init() { vm.ExposeMetadata(true) }

// Observing a histogram is on the hot path (every write, publish and ack).
func TestHistogramObserveAllocationFree(t *testing.T) {
	h, f := New("roost_test_seconds", LatencyBuckets), NewFamily("roost_test_phase_seconds", "phase", []string{"a", "b"}, LatencyBuckets)
	n := testing.AllocsPerRun(1000, func() {
		h.Observe(3)
		h.Observe(0.004)
		f.Get(1).Observe(0.002)
	})
	if n != 0 {
		t.Fatalf("Observe allocates %v times per run, want 0", n)
	}
}

// The cost of one histogram update on the hot path, as the loops make it
// (through the fanout.Observer interface).
func BenchmarkHistogramObserve(b *testing.B) {
	var o interface{ Observe(float64) } = New("x", LatencyBuckets)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		o.Observe(float64(i&7) * 0.001)
	}
}

// Every loop updates the same histograms.
func BenchmarkHistogramObserveParallel(b *testing.B) {
	var o interface{ Observe(float64) } = New("x", LatencyBuckets)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for i := 0; pb.Next(); i++ {
			o.Observe(float64(i&7) * 0.001)
		}
	})
}

func TestHistogramExposition(t *testing.T) {
	h := New("roost_test_seconds", []float64{1, 2, 4})
	for _, v := range []float64{0.5, 1, 1.5, 2, 3, 4, 5, 100} {
		h.Observe(v)
	}
	var b strings.Builder
	h.Write(&b)
	want := `# HELP roost_test_seconds
# TYPE roost_test_seconds histogram
roost_test_seconds_bucket{le="1"} 2
roost_test_seconds_bucket{le="2"} 4
roost_test_seconds_bucket{le="4"} 6
roost_test_seconds_bucket{le="+Inf"} 8
roost_test_seconds_sum 117
roost_test_seconds_count 8
`
	if b.String() != want {
		t.Fatalf("exposition:\n%s\nwant:\n%s", b.String(), want)
	}
}

// A family of labelled histograms: one TYPE line, the label before le
// and on _sum and _count.
func TestHistFamilyExposition(t *testing.T) {
	f := NewFamily("roost_test_phase_seconds", "phase", []string{"a", "b"}, []float64{1})
	f.Get(0).Observe(0.5)
	f.Get(1).Observe(2)
	var b strings.Builder
	f.Write(&b)
	want := `# HELP roost_test_phase_seconds
# TYPE roost_test_phase_seconds histogram
roost_test_phase_seconds_bucket{phase="a",le="1"} 1
roost_test_phase_seconds_bucket{phase="a",le="+Inf"} 1
roost_test_phase_seconds_sum{phase="a"} 0.5
roost_test_phase_seconds_count{phase="a"} 1
roost_test_phase_seconds_bucket{phase="b",le="1"} 0
roost_test_phase_seconds_bucket{phase="b",le="+Inf"} 1
roost_test_phase_seconds_sum{phase="b"} 2
roost_test_phase_seconds_count{phase="b"} 1
`
	if b.String() != want {
		t.Fatalf("exposition:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestHistogramConcurrent(t *testing.T) {
	h := New("roost_test", []float64{10})
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 1000; i++ {
				h.Observe(1)
			}
		}()
	}
	wg.Wait()
	if n, sum := h.counts[0].Load(), math.Float64frombits(h.sum.Load()); n != 4000 || sum != 4000 {
		t.Fatalf("count %d sum %v, want 4000 and 4000", n, sum)
	}
}

func TestHistogramBoundsMustAscend(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("New with bounds 2, 1 did not panic")
		}
	}()
	New("roost_bad", []float64{2, 1})
}

// libraryObserver is the metrics library's own Prometheus histogram behind
// the same interface: the alternative the node measured and did not take
// (docs/benchmarks.md).
type libraryObserver struct{ h *vm.PrometheusHistogram }

func (o libraryObserver) Observe(v float64) { o.h.Update(v) }

func BenchmarkHistogramObserveLibrary(b *testing.B) {
	var o interface{ Observe(float64) } = libraryObserver{vm.NewSet().NewPrometheusHistogramExt("x", LatencyBuckets)}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			o.Observe(float64(i&7) * 0.001)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for i := 0; pb.Next(); i++ {
				o.Observe(float64(i&7) * 0.001)
			}
		})
	})
}
