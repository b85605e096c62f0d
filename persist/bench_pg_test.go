package persist

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/roost-chat/roost/proto"
)

// pgCPU returns the CPU time (user+system) spent so far by the given
// processes, or by every process named postgres when pids is nil.
func pgCPU(pids []int) time.Duration {
	if pids == nil {
		matches, _ := filepath.Glob("/proc/[0-9]*/stat")
		for _, m := range matches {
			pid, _ := strconv.Atoi(strings.Split(m, "/")[2])
			pids = append(pids, pid)
		}
	}
	var ticks int64
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(b)
		open, close := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || close < 0 || s[open+1:close] != "postgres" {
			continue
		}
		f := strings.Fields(s[close+2:])
		// Fields after the command: state is f[0]; utime and stime are
		// fields 14 and 15 of the whole line, f[11] and f[12] here.
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += ut + st
	}
	return time.Duration(ticks) * 10 * time.Millisecond // USER_HZ is 100 on Linux
}

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

// backendPIDs lists the PostgreSQL backends serving st's database.
func backendPIDs(b *testing.B, st *Postgres) []int {
	rows, err := st.pool.Query(context.Background(), `SELECT pid FROM pg_stat_activity WHERE datname = current_database()`)
	if err != nil {
		b.Fatal(err)
	}
	defer rows.Close()
	var pids []int
	for rows.Next() {
		var pid int
		_ = rows.Scan(&pid)
		pids = append(pids, pid)
	}
	return pids
}

// backendCPU measures the CPU of st's database's backends over a run,
// counting the backends that open during it (a spread commit opens more
// connections) from zero.
type backendCPU struct {
	st    *Postgres
	start map[int]time.Duration
}

func startBackendCPU(b *testing.B, st *Postgres) *backendCPU {
	c := &backendCPU{st: st, start: map[int]time.Duration{}}
	for _, pid := range backendPIDs(b, st) {
		c.start[pid] = pgCPU([]int{pid})
	}
	return c
}

func (c *backendCPU) since(b *testing.B) time.Duration {
	var d time.Duration
	for _, pid := range backendPIDs(b, c.st) {
		d += pgCPU([]int{pid}) - c.start[pid]
	}
	return d
}

func benchPG(b *testing.B, rooms int, cfg PoolConfig) {
	url := newTestDB(b)
	cfg.setDefaults()
	st := openTestPG(b, url, PGConfig{MaxConns: int32(cfg.Workers*cfg.Spread + 1)})
	defer st.Close()
	sink := &countSink{}
	p := NewPool(st, sink, cfg)
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
	s0 := p.Stats()
	ours, cpuAll0 := startBackendCPU(b, st), pgCPU(nil)
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
	cpuOurs, cpuAll := ours.since(b), pgCPU(nil)-cpuAll0
	s1 := p.Stats()
	p.Close()
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
// the ack latency (Submit to Committed) p50, p95 and p99 and the batch size.
func BenchmarkPoolPostgresLatency(b *testing.B) {
	rate := 5000
	if v, err := strconv.Atoi(os.Getenv("ROOST_BENCH_RATE")); err == nil && v > 0 {
		rate = v
	}
	const rooms = 1000
	url := newTestDB(b)
	cfg := benchPoolConfig(b)
	st := openTestPG(b, url, PGConfig{MaxConns: int32(cfg.Workers*cfg.Spread + 1)})
	defer st.Close()
	lat := &latencySink{start: make([]int64, b.N+rooms)}
	ts := &timedStore{Store: st}
	p := NewPool(ts, lat, cfg)
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
	s0 := p.Stats()
	ours, cpuAll0 := startBackendCPU(b, st), pgCPU(nil)
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
	cpuOurs, cpuAll := ours.since(b), pgCPU(nil)-cpuAll0
	s1 := p.Stats()
	p.Close()
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
	Store
	mu   sync.Mutex
	durs []int64
}

func (t *timedStore) CommitBatch(ctx context.Context, reqs []*proto.PubRequest, res []proto.PubResult) error {
	start := time.Now()
	err := t.Store.CommitBatch(ctx, reqs, res)
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

func (s *latencySink) Committed(reqs []*proto.PubRequest, res []proto.PubResult) {
	for i, req := range reqs {
		s.committed(req, &res[i])
	}
}

func (s *latencySink) committed(req *proto.PubRequest, res *proto.PubResult) {
	d := time.Now().UnixNano() - s.start[req.Origin.(benchOrigin)]
	s.mu.Lock()
	s.lat = append(s.lat, d)
	s.mu.Unlock()
	s.n.Add(1)
	proto.PutPubRequest(req)
}
