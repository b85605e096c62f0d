package tuning

import (
	"math"
	"strings"
	"sync"
	"testing"
)

func TestHistogramBuckets(t *testing.T) {
	h := NewHistogram(1, 2, 4)
	for _, v := range []float64{0.5, 1, 1.5, 2, 3, 4, 5, 100} {
		h.Observe(v)
	}
	v := h.Snapshot()
	want := []uint64{2, 2, 2, 2} // <=1: 0.5,1  <=2: 1.5,2  <=4: 3,4  +Inf: 5,100
	for i := range want {
		if v.Counts[i] != want[i] {
			t.Fatalf("bucket %d = %d, want %d (all %v)", i, v.Counts[i], want[i], v.Counts)
		}
	}
	if v.Count() != 8 || v.Sum != 117 {
		t.Fatalf("count %d sum %v, want 8 and 117", v.Count(), v.Sum)
	}
}

func TestHistogramConcurrent(t *testing.T) {
	h := NewHistogram(10)
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
	if v := h.Snapshot(); v.Count() != 4000 || v.Sum != 4000 {
		t.Fatalf("count %d sum %v, want 4000 and 4000", v.Count(), v.Sum)
	}
}

func TestHotPathAllocationFree(t *testing.T) {
	h := NewHistogram(0.001, 0.01, 0.1, 1)
	var c Counter
	var g Gauge
	n := testing.AllocsPerRun(1000, func() {
		h.Observe(0.005)
		c.Inc()
		c.Add(3)
		g.Add(1)
		g.Set(7)
	})
	if n != 0 {
		t.Fatalf("Observe/Inc/Add/Set allocate %v times per run, want 0", n)
	}
}

func TestHistogramBoundsMustAscend(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("NewHistogram(2, 1) did not panic")
		}
	}()
	NewHistogram(2, 1)
}

func TestMetricsWriterFormat(t *testing.T) {
	var sb strings.Builder
	w := NewMetricsWriter(&sb)
	w.Counter("roost_frames_out_total", "Frames written.", 1234567)
	w.Gauge("roost_connections", "Open connections by app.", 3, "app", "a")
	w.Gauge("roost_connections", "Open connections by app.", 1, "app", `we"ird\app`)
	h := NewHistogram(1, 2)
	h.Observe(0.5)
	h.Observe(1.5)
	h.Observe(9)
	w.Histogram("roost_batch", "Frames per write.\nSecond line.", h.Snapshot(), "loop", "0")
	w.Gauge("roost_nan", "Not a number.", math.NaN())
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	want := `# HELP roost_frames_out_total Frames written.
# TYPE roost_frames_out_total counter
roost_frames_out_total 1234567
# HELP roost_connections Open connections by app.
# TYPE roost_connections gauge
roost_connections{app="a"} 3
roost_connections{app="we\"ird\\app"} 1
# HELP roost_batch Frames per write.\nSecond line.
# TYPE roost_batch histogram
roost_batch_bucket{loop="0",le="1"} 1
roost_batch_bucket{loop="0",le="2"} 2
roost_batch_bucket{loop="0",le="+Inf"} 3
roost_batch_sum{loop="0"} 11
roost_batch_count{loop="0"} 3
# HELP roost_nan Not a number.
# TYPE roost_nan gauge
roost_nan NaN
`
	if got := sb.String(); got != want {
		t.Fatalf("exposition:\n%s\nwant:\n%s", got, want)
	}
}

func BenchmarkHistogramObserve(b *testing.B) {
	h := NewHistogram(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		h.Observe(float64(i&7) * 0.001)
	}
}
