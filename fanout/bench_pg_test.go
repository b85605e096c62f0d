package fanout

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/persist/pgtest"
	"github.com/roost-chat/roost/proto"
)

// BenchmarkPoolPostgres measures publishes through the pool into
// PostgreSQL (synchronous_commit and fsync as configured on the server):
// throughput, PostgreSQL CPU per publish (this database's backends, and all
// postgres processes of the machine, which includes the WAL writer and
// whatever else runs), and the mean batch size reached.
func BenchmarkPoolPostgres(b *testing.B) {
	for _, rooms := range []int{1000, 1} {
		b.Run(fmt.Sprintf("rooms=%d", rooms), func(b *testing.B) {
			benchPG(b, rooms, benchPoolConfig(b))
		})
	}
}

// benchPoolConfig is the pool's default configuration, with Workers,
// MinFill and Window overridden by ROOST_BENCH_WORKERS, ROOST_BENCH_FILL and
// ROOST_BENCH_WINDOW (a Go duration; 0 means do not wait) so that variants can be compared without editing the code.
func benchPoolConfig(b *testing.B) PoolConfig {
	var cfg PoolConfig
	if v, err := strconv.Atoi(os.Getenv("ROOST_BENCH_WORKERS")); err == nil && v > 0 {
		cfg.Workers = v
	}
	if v, err := strconv.Atoi(os.Getenv("ROOST_BENCH_FILL")); err == nil && v > 0 {
		cfg.MinFill = v
	}
	if v, err := time.ParseDuration(os.Getenv("ROOST_BENCH_WINDOW")); err == nil {
		cfg.Window = v
		if v == 0 {
			cfg.Window = -1
		}
	}
	cfg.setDefaults()
	return cfg
}

// backendCPU measures the CPU of st's database's backends over a run,
// counting the backends that open during it (a spread commit opens more
// connections) from zero.
type backendCPU struct {
	url   string
	start map[int]time.Duration
}

func startBackendCPU(b *testing.B, url string) *backendCPU {
	c := &backendCPU{url: url, start: map[int]time.Duration{}}
	for _, pid := range pgtest.BackendPIDs(b, url) {
		c.start[pid] = pgtest.CPU([]int{pid})
	}
	return c
}

func (c *backendCPU) since(b *testing.B) time.Duration {
	var d time.Duration
	for _, pid := range pgtest.BackendPIDs(b, c.url) {
		d += pgtest.CPU([]int{pid}) - c.start[pid]
	}
	return d
}

func benchPG(b *testing.B, rooms int, cfg PoolConfig) {
	url := pgtest.NewDB(b)
	cfg.setDefaults()
	st := openPG(b, url, persist.PGConfig{MaxConns: int32(cfg.Workers*cfg.Spread + 1)})
	defer st.Close()
	sink := &countSink{}
	p := newPool(st, sink.committed, cfg)
	keys := make([]string, rooms)
	for i := range keys {
		keys[i] = proto.RoomKey("bench", fmt.Sprint("room", i))
	}
	body := []byte(`{"text":"hello, this is a chat message of some length"}`)
	froms := []string{"u0", "u1", "u2", "u3", "u4", "u5", "u6"}
	submit := func(i int) { submitBench(p, keys[i%rooms], froms[i%len(froms)], i, body, nil) }
	// Warm up: create the rooms and every worker's connection.
	for i := 0; i < rooms; i++ {
		submit(1<<40 + i)
	}
	for sink.n.Load() != int64(rooms) {
		time.Sleep(time.Millisecond)
	}
	base := sink.n.Load()
	s0 := p.stats()
	ours, cpuAll0 := startBackendCPU(b, url), pgtest.CPU(nil)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		submit(i)
	}
	for sink.n.Load() != base+int64(b.N) {
		time.Sleep(100 * time.Microsecond)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	cpuOurs, cpuAll := ours.since(b), pgtest.CPU(nil)-cpuAll0
	s1 := p.stats()
	p.close()
	if sink.errs.Load() != 0 {
		b.Fatalf("%d publishes failed", sink.errs.Load())
	}
	n := float64(b.N)
	b.ReportMetric(n/elapsed.Seconds(), "pub/s")
	b.ReportMetric(float64(cpuOurs.Microseconds())/n, "pg-backend-µs/pub")
	b.ReportMetric(float64(cpuAll.Microseconds())/n, "pg-all-µs/pub")
	b.ReportMetric(float64(s1.Requests-s0.Requests)/float64(max(1, s1.Batches-s0.Batches)), "pub/batch")
}

// BenchmarkPoolPostgresLatency publishes at a fixed rate (env
// ROOST_BENCH_RATE publishes/s, default 5000) over 1,000 rooms (in turn, or
// at random with ROOST_BENCH_SHUFFLE; bodies of ROOST_BENCH_BODY bytes) and reports
// the ack latency (submit to the answer) p50, p95 and p99 and the batch size.
func BenchmarkPoolPostgresLatency(b *testing.B) {
	rate := 5000
	if v, err := strconv.Atoi(os.Getenv("ROOST_BENCH_RATE")); err == nil && v > 0 {
		rate = v
	}
	const rooms = 1000
	url := pgtest.NewDB(b)
	cfg := benchPoolConfig(b)
	st := openPG(b, url, persist.PGConfig{MaxConns: int32(cfg.Workers*cfg.Spread + 1)})
	defer st.Close()
	lat := &latencySink{start: make([]int64, b.N+rooms)}
	ts := &timedStore{Store: st}
	p := newPool(ts, lat.committed, cfg)
	keys := make([]string, rooms)
	for i := range keys {
		keys[i] = proto.RoomKey("bench", fmt.Sprint("room", i))
	}
	body := []byte(`{"text":"hello, this is a chat message of some length"}`)
	if v, err := strconv.Atoi(os.Getenv("ROOST_BENCH_BODY")); err == nil && v > 0 {
		body = bytes.Repeat([]byte("x"), v)
	}
	// Publishes take the rooms in turn unless ROOST_BENCH_SHUFFLE is set:
	// then each goes to a random room, as a node's independent publishers
	// bring them, and a batch's rooms lie scattered over the tables.
	roomOf := func(i int) int { return i % rooms }
	if os.Getenv("ROOST_BENCH_SHUFFLE") != "" {
		rnd := rand.New(rand.NewPCG(1, 2))
		perm := make([]int, b.N)
		for i := range perm {
			perm[i] = rnd.IntN(rooms)
		}
		roomOf = func(i int) int {
			if i >= b.N { // the warm-up: every room once
				return i - b.N
			}
			return perm[i]
		}
	}
	submit := func(i int) {
		lat.start[i] = time.Now().UnixNano()
		submitBench(p, keys[roomOf(i)], "user", i, body, benchOrigin(i))
	}
	for i := 0; i < rooms; i++ {
		submit(b.N + i)
	}
	for lat.n.Load() != rooms {
		time.Sleep(time.Millisecond)
	}
	lat.lat = lat.lat[:0]
	ts.mu.Lock()
	ts.durs = ts.durs[:0]
	ts.mu.Unlock()
	s0 := p.stats()
	ours, cpuAll0 := startBackendCPU(b, url), pgtest.CPU(nil)
	b.ResetTimer()
	interval := time.Second / time.Duration(rate)
	begin := time.Now()
	for i := 0; i < b.N; i++ {
		if d := time.Until(begin.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		submit(i)
	}
	for lat.n.Load() != int64(rooms+b.N) {
		time.Sleep(100 * time.Microsecond)
	}
	b.StopTimer()
	cpuOurs, cpuAll := ours.since(b), pgtest.CPU(nil)-cpuAll0
	s1 := p.stats()
	p.close()
	n := float64(b.N)
	b.ReportMetric(float64(cpuOurs.Microseconds())/n, "pg-backend-µs/pub")
	b.ReportMetric(float64(cpuAll.Microseconds())/n, "pg-all-µs/pub")
	l := lat.lat
	sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
	b.ReportMetric(float64(b.N)/time.Since(begin).Seconds(), "pub/s")
	b.ReportMetric(float64(l[len(l)/2])/1e3, "p50-µs")
	b.ReportMetric(float64(l[len(l)*95/100])/1e3, "p95-µs")
	b.ReportMetric(float64(l[len(l)*99/100])/1e3, "p99-µs")
	b.ReportMetric(float64(s1.Requests-s0.Requests)/float64(max(1, s1.Batches-s0.Batches)), "pub/batch")
	c := ts.durs
	sort.Slice(c, func(i, j int) bool { return c[i] < c[j] })
	b.ReportMetric(float64(c[len(c)/2])/1e3, "commit-p50-µs")
	b.ReportMetric(float64(c[len(c)*99/100])/1e3, "commit-p99-µs")
}

// timedStore records how long each CommitBatch takes.
type timedStore struct {
	persist.Store
	mu   sync.Mutex
	durs []int64
}

func (t *timedStore) CommitBatch(ctx context.Context, rows []*persist.Row) error {
	start := time.Now()
	err := t.Store.CommitBatch(ctx, rows)
	d := time.Since(start)
	t.mu.Lock()
	t.durs = append(t.durs, int64(d))
	t.mu.Unlock()
	return err
}

type latencySink struct {
	start []int64
	mu    sync.Mutex
	lat   []int64 // ack latencies, ns
	n     atomic.Int64
}

func (s *latencySink) committed(batch []*PubRequest) {
	for _, req := range batch {
		d := time.Now().UnixNano() - s.start[req.Origin.(benchOrigin)]
		s.mu.Lock()
		s.lat = append(s.lat, d)
		s.mu.Unlock()
		s.n.Add(1)
		PutPubRequest(req)
	}
}
