package fanout

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/persist/pgtest"
	"github.com/roost-chat/roost/proto"
)

// BenchmarkPoolPostgresNodes: several nodes (a store and a pool each, one
// database) publish at a fixed total rate (ROOST_BENCH_RATE, default
// 3000/s) over 1,000 rooms that every node writes to, as a chat load
// spread over nodes does (ROOST_BENCH_NODES, default 3; the pool's
// defaults with 2 workers, as the bench scripts run nodes). Reports
// PostgreSQL CPU per publish (this database's backends), commit and ack
// latency, the mean batch, and the deadlocks PostgreSQL detected.
func BenchmarkPoolPostgresNodes(b *testing.B) {
	rate, nodes := 3000, 3
	if v, err := strconv.Atoi(os.Getenv("ROOST_BENCH_RATE")); err == nil && v > 0 {
		rate = v
	}
	if v, err := strconv.Atoi(os.Getenv("ROOST_BENCH_NODES")); err == nil && v > 0 {
		nodes = v
	}
	const rooms = 1000
	url := pgtest.NewDB(b)
	cfg := benchPoolConfig(b)
	if os.Getenv("ROOST_BENCH_WORKERS") == "" {
		cfg.Workers = 2
	}
	sink := &nodesSink{start: make([]int64, b.N+nodes*rooms)}
	pools := make([]*pool, nodes)
	stores := make([]*persist.Postgres, nodes)
	timed := make([]*timedStore, nodes)
	for k := range pools {
		stores[k] = openPG(b, url, persist.PGConfig{MaxConns: int32(cfg.Workers*cfg.Spread + 1)})
		defer stores[k].Close()
		timed[k] = &timedStore{Store: stores[k]}
		pools[k] = newPool(timed[k], sink.committed, cfg)
	}
	body := []byte(`{"text":"hello, this is a chat message of some length"}`)
	key := func(i int) string { return proto.RoomKey("bench", fmt.Sprint("room", i*7919%rooms)) }
	submit := func(i, k int) {
		sink.start[i] = time.Now().UnixNano()
		submitBench(pools[k], key(i), "user"+strconv.Itoa(k), i, body, benchOrigin(i))
	}
	// Warm up: every node makes (or finds) every room and opens its
	// connections.
	for k := range pools {
		for r := 0; r < rooms; r++ {
			submit(b.N+k*rooms+r, k)
		}
	}
	for sink.n.Load() != int64(nodes*rooms) {
		time.Sleep(time.Millisecond)
	}
	sink.mu.Lock()
	sink.lat = sink.lat[:0]
	sink.mu.Unlock()
	for _, t := range timed {
		t.mu.Lock()
		t.durs = t.durs[:0]
		t.mu.Unlock()
	}
	dead0 := benchDeadlocks(b, url)
	pids := pgtest.BackendPIDs(b, url)
	var s0 []PoolStats
	for _, p := range pools {
		s0 = append(s0, p.stats())
	}
	cpu0 := pgtest.CPU(pids)
	b.ResetTimer()
	interval := time.Second / time.Duration(rate)
	begin := time.Now()
	for i := 0; i < b.N; i++ {
		if d := time.Until(begin.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		submit(i, i%nodes)
	}
	for sink.n.Load() != int64(nodes*rooms+b.N) {
		time.Sleep(100 * time.Microsecond)
	}
	b.StopTimer()
	elapsed := time.Since(begin)
	cpu := pgtest.CPU(pids) - cpu0
	var reqs, batches uint64
	for k, p := range pools {
		s := p.stats()
		reqs += s.Requests - s0[k].Requests
		batches += s.Batches - s0[k].Batches
		p.close()
	}
	for _, st := range stores {
		st.Close() // a backend reports its statistics when it exits
	}
	time.Sleep(200 * time.Millisecond)
	dead := benchDeadlocks(b, url) - dead0
	n := float64(b.N)
	b.ReportMetric(n/elapsed.Seconds(), "pub/s")
	b.ReportMetric(float64(cpu.Microseconds())/n, "pg-backend-µs/pub")
	b.ReportMetric(float64(reqs)/float64(max(1, batches)), "pub/batch")
	b.ReportMetric(float64(dead), "deadlocks")
	b.ReportMetric(float64(sink.errs.Load()), "failed")
	l := sink.lat
	sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
	b.ReportMetric(float64(l[len(l)/2])/1e3, "ack-p50-µs")
	b.ReportMetric(float64(l[len(l)*99/100])/1e3, "ack-p99-µs")
	var c []int64
	for _, t := range timed {
		c = append(c, t.durs...)
	}
	sort.Slice(c, func(i, j int) bool { return c[i] < c[j] })
	b.ReportMetric(float64(c[len(c)/2])/1e3, "commit-p50-µs")
	b.ReportMetric(float64(c[len(c)*99/100])/1e3, "commit-p99-µs")
}

// benchDeadlocks reads pg_stat_database's deadlocks of url's database.
func benchDeadlocks(b *testing.B, url string) int64 {
	c, err := pgx.Connect(context.Background(), url)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close(context.Background())
	var n int64
	if err := c.QueryRow(context.Background(), `SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()`).Scan(&n); err != nil {
		b.Fatal(err)
	}
	return n
}

// nodesSink records ack latencies and counts failed publishes.
type nodesSink struct {
	start []int64
	mu    sync.Mutex
	lat   []int64
	n     atomic.Int64
	errs  atomic.Int64
}

func (s *nodesSink) committed(batch []*PubRequest) {
	now := time.Now().UnixNano()
	s.mu.Lock()
	for _, req := range batch {
		if req.Err != nil {
			s.errs.Add(1)
		}
		s.lat = append(s.lat, now-s.start[req.Origin.(benchOrigin)])
		PutPubRequest(req)
	}
	s.mu.Unlock()
	s.n.Add(int64(len(batch)))
}
