package fanout

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
)

// ackSink records what the pool hands over, checks per-room seq order of
// new messages, and recycles requests the way the loop does.
type ackSink struct {
	mu      sync.Mutex
	acks    map[string]persist.Stored // key + "|" + from + "|" + id → first result
	lastNew map[string]uint64         // room → newest seq delivered
	errs    int
	bad     []string
	n       atomic.Int64
	keep    bool // keep requests (do not PutRequest)
	frames  map[string][]byte
}

func newAckSink() *ackSink {
	return &ackSink{acks: map[string]persist.Stored{}, lastNew: map[string]uint64{}, frames: map[string][]byte{}}
}

func (s *ackSink) committed(batch []*PubRequest) {
	for _, req := range batch {
		s.one(req)
	}
}

func (s *ackSink) one(res *PubRequest) {
	req := res
	s.mu.Lock()
	id := req.Key + "|" + req.From + "|" + string(req.ID)
	switch {
	case res.Err != nil:
		s.errs++
		if res.Frame != nil || res.Seq != 0 && !errors.Is(res.Err, proto.ErrOverloaded) {
			s.bad = append(s.bad, fmt.Sprintf("%s: error result %+v", id, res))
		}
	case res.Duplicate:
		if res.Frame != nil {
			s.bad = append(s.bad, id+": duplicate with a frame")
		}
		if prev, ok := s.acks[id]; ok && prev.Seq != res.Seq {
			s.bad = append(s.bad, fmt.Sprintf("%s: duplicate seq %d, first ack %d", id, res.Seq, prev.Seq))
		}
		if _, ok := s.acks[id]; !ok {
			s.acks[id] = res.Stored
		}
	default:
		if res.Seq != s.lastNew[req.Key]+1 && s.lastNew[req.Key] != 0 {
			s.bad = append(s.bad, fmt.Sprintf("%s: seq %d after %d", id, res.Seq, s.lastNew[req.Key]))
		}
		s.lastNew[req.Key] = res.Seq
		if prev, ok := s.acks[id]; ok {
			s.bad = append(s.bad, fmt.Sprintf("%s: stored twice (%d, %d)", id, prev.Seq, res.Seq))
		}
		s.acks[id] = res.Stored
		if len(res.Frame) == 0 || !bytes.Contains(res.Frame, req.Body) {
			s.bad = append(s.bad, fmt.Sprintf("%s: frame %q", id, res.Frame))
		}
		s.frames[id] = res.Frame
	}
	s.mu.Unlock()
	s.n.Add(1)
	if !s.keep {
		PutPubRequest(req)
	}
}

func (s *ackSink) check(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.bad) > 0 {
		t.Fatalf("%d bad results, first: %s", len(s.bad), s.bad[0])
	}
}

func newReq(key, from, id, body string) *PubRequest {
	r := GetPubRequest()
	r.Key, r.From = key, from
	r.ID = append(r.ID, id...)
	r.Body = append(r.Body, body...)
	return r
}

func TestPoolOrderAndFrames(t *testing.T) {
	st := persist.NewMemory(0)
	sink := newAckSink()
	p := newPool(st, sink.committed, PoolConfig{Workers: 3, MaxBatch: 16})
	const rooms, per = 10, 200
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				for r := 0; r < rooms; r++ {
					// Each goroutine publishes every key; 3 of 4 are retries.
					k := proto.RoomKey("app", fmt.Sprint("room", r))
					for p.submit(newReq(k, "u", fmt.Sprint(i), fmt.Sprintf(`{"i":%d}`, i))) != nil {
						time.Sleep(time.Millisecond)
					}
				}
			}
		}()
	}
	wg.Wait()
	p.close()
	sink.check(t)
	if got := sink.n.Load(); got != 4*rooms*per {
		t.Fatalf("%d results, want %d", got, 4*rooms*per)
	}
	for r := 0; r < rooms; r++ {
		if got := sink.lastNew[proto.RoomKey("app", fmt.Sprint("room", r))]; got != per {
			t.Fatalf("room%d: last seq %d, want %d", r, got, per)
		}
	}
	f := sink.frames["app/room3|u|7"]
	if !bytes.Contains(f, []byte(`"room":"room3"`)) || !bytes.Contains(f, []byte(`"id":"7"`)) ||
		!bytes.Contains(f, []byte(`"from":"u"`)) || !bytes.HasSuffix(f, []byte(`"body":{"i":7}}`)) {
		t.Fatalf("frame %q", f)
	}
	hdr := 2
	if f[1] == 126 {
		hdr = 4
	}
	if f[0] != 0x81 || !json.Valid(f[hdr:]) || !bytes.HasPrefix(f[hdr:], []byte(`{"op":"msg"`)) {
		t.Fatalf("not a text frame of a msg: %q", f)
	}
	s := p.stats()
	if s.Requests != 4*rooms*per || s.Duplicates != 3*rooms*per || s.Batches == 0 || s.CommitErrors != 0 {
		t.Fatalf("stats %+v", s)
	}
	var sum uint64
	for _, n := range s.BatchSizes {
		sum += n
	}
	if sum != s.Batches {
		t.Fatalf("histogram sums to %d, batches %d", sum, s.Batches)
	}
	if err := p.submit(newReq("a/b", "u", "x", "1")); !errors.Is(err, proto.ErrClosed) {
		t.Fatalf("Submit after Close: %v", err)
	}
}

// gateStore holds every CommitBatch until released and can fail them: it
// lets the tests fill a queue and exercise the error path on top of the
// real memory store.
type gateStore struct {
	*persist.Memory
	gate chan struct{}
	fail atomic.Pointer[error]
}

func (g *gateStore) CommitBatch(ctx context.Context, rows []*persist.Row) error {
	<-g.gate
	if e := g.fail.Load(); e != nil {
		err := *e
		for _, r := range rows {
			r.Err = err
		}
		return err
	}
	return g.Memory.CommitBatch(ctx, rows)
}

func TestPoolOverloadAndErrors(t *testing.T) {
	g := &gateStore{Memory: persist.NewMemory(0), gate: make(chan struct{})}
	failErr := fmt.Errorf("cannot commit: %w", proto.ErrOverloaded)
	g.fail.Store(&failErr)
	sink := newAckSink()
	var logs lockedBuf
	p := newPool(g, sink.committed, PoolConfig{Workers: 1, MaxBatch: 4, QueueLen: 8, Window: -1,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	k := proto.RoomKey("a", "r")
	accepted := 0
	var err error
	for i := 0; i < 100 && err == nil; i++ {
		if err = p.submit(newReq(k, "u", fmt.Sprint(i), "1")); err == nil {
			accepted++
		}
	}
	// Accepted before the refusal: the queue (8), plus what the worker took
	// out of it: the batch blocked in the store (4), the next batch it
	// gathers while that commit is in flight (4), and the publish in hand.
	// How much it took depends on scheduling, hence a range.
	if !errors.Is(err, proto.ErrOverloaded) || accepted < 8 || accepted > 8+2*4+1 {
		t.Fatalf("after %d accepted: %v", accepted, err)
	}
	close(g.gate) // every batch fails now
	for sink.n.Load() != int64(accepted) {
		time.Sleep(time.Millisecond)
	}
	sink.check(t)
	if sink.errs != accepted || len(sink.acks) != 0 {
		t.Fatalf("%d errors, %d acks; want %d errors", sink.errs, len(sink.acks), accepted)
	}
	if last, _ := g.LastSeq(context.Background(), k); last != 0 {
		t.Fatalf("failed batches stored up to seq %d", last)
	}
	// The database is back: the pool recovers by itself.
	g.fail.Store(nil)
	for err := p.submit(newReq(k, "u", "x", "1")); err != nil; err = p.submit(newReq(k, "u", "x", "1")) {
		time.Sleep(time.Millisecond)
	}
	p.close()
	sink.check(t)
	if r, ok := sink.acks[k+"|u|x"]; !ok || r.Seq != 1 {
		t.Fatalf("after recovery: %+v %v", r, ok)
	}
	if s := p.stats(); s.CommitErrors == 0 || s.Rejected == 0 {
		t.Fatalf("stats %+v", s)
	}
	// Failed commits are logged, throttled: a few batches failed within a
	// second, one line says so with the cause.
	if l := logs.String(); strings.Count(l, "group commit failed") != 1 || !strings.Contains(l, "cannot commit: overloaded") {
		t.Fatalf("commit failures logged as:\n%s", l)
	}
}

func TestPoolCloseDrains(t *testing.T) {
	st := persist.NewMemory(0)
	sink := newAckSink()
	p := newPool(st, sink.committed, PoolConfig{Workers: 2, Window: 50 * time.Millisecond})
	for i := 0; i < 1000; i++ {
		if err := p.submit(newReq(proto.RoomKey("a", fmt.Sprint(i%7)), "u", fmt.Sprint(i), "1")); err != nil {
			t.Fatal(err)
		}
	}
	p.close()
	if sink.n.Load() != 1000 {
		t.Fatalf("Close returned after %d of 1000", sink.n.Load())
	}
	sink.check(t)
}

func TestPoolArenaFrames(t *testing.T) {
	st := persist.NewMemory(0)
	sink := newAckSink()
	p := newPool(st, sink.committed, PoolConfig{Workers: 1, Window: -1})
	big := `"` + string(bytes.Repeat([]byte("x"), 40<<10)) + `"`
	bodies := map[string]string{}
	for i := 0; i < 3000; i++ {
		body := fmt.Sprintf(`{"i":%d,"pad":"%s"}`, i, bytes.Repeat([]byte("p"), i%300))
		if i%500 == 0 {
			body = big
		}
		bodies[fmt.Sprint(i)] = body
		for p.submit(newReq("a/r", "u", fmt.Sprint(i), body)) != nil {
			time.Sleep(time.Millisecond)
		}
	}
	p.close()
	sink.check(t)
	for id, body := range bodies {
		f := sink.frames["a/r|u|"+id]
		if !bytes.HasSuffix(f, []byte(`"body":`+body+`}`)) || cap(f) != len(f) {
			t.Fatalf("frame of %s: len %d cap %d, suffix %q", id, len(f), cap(f), f[max(0, len(f)-40):])
		}
	}
}

func BenchmarkPoolMemory(b *testing.B) {
	// budget=512MiB is serve's default (--memory-store-max): every commit
	// also moves its room to the front of its app's eviction order.
	for _, budget := range []int64{0, 512 << 20} {
		for _, rooms := range []int{1, 1000} {
			b.Run(fmt.Sprintf("budget=%dMiB/rooms=%d", budget>>20, rooms), func(b *testing.B) {
				benchPoolMemory(b, budget, rooms)
			})
		}
	}
}

func benchPoolMemory(b *testing.B, budget int64, rooms int) {
	st := persist.NewMemory(0)
	st.SetLimits(budget, 0)
	sink := &countSink{}
	p := newPool(st, sink.committed, PoolConfig{})
	keys := make([]string, rooms)
	for i := range keys {
		keys[i] = proto.RoomKey("bench", fmt.Sprint("room", i))
	}
	body := []byte(`{"text":"hello, this is a chat message"}`)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		submitBench(p, keys[i%rooms], "user", i, body, nil)
	}
	p.close()
	b.StopTimer()
	if sink.n.Load() != int64(b.N) {
		b.Fatalf("%d of %d", sink.n.Load(), b.N)
	}
}

// strconvAppend writes a decimal id without fmt's allocation.
func strconvAppend(dst []byte, i int) []byte {
	var buf [20]byte
	n := len(buf)
	for {
		n--
		buf[n] = byte('0' + i%10)
		i /= 10
		if i == 0 {
			break
		}
	}
	return append(dst, buf[n:]...)
}

type countSink struct {
	n    atomic.Int64
	errs atomic.Int64
}

func (s *countSink) committed(batch []*PubRequest) {
	for _, req := range batch {
		if req.Err != nil {
			s.errs.Add(1)
		}
		s.n.Add(1)
		PutPubRequest(req)
	}
}

// seqStore numbers publishes without storing them: it isolates the pool's
// own cost (queueing, batching, encoding, hand-off) in BenchmarkPoolOnly.
type seqStore struct {
	persist.Memory
	seq uint64
}

func (s *seqStore) CommitBatch(_ context.Context, rows []*persist.Row) error {
	for _, r := range rows {
		s.seq++
		r.Stored = persist.Stored{Seq: s.seq, TS: 1764484800123}
	}
	return nil
}

func BenchmarkPoolOnly(b *testing.B) {
	sink := &countSink{}
	p := newPool(&seqStore{}, sink.committed, PoolConfig{Workers: 1})
	body := []byte(`{"text":"hello, this is a chat message"}`)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		submitBench(p, "bench/room", "user", i, body, nil)
	}
	p.close()
	b.StopTimer()
	if sink.n.Load() != int64(b.N) {
		b.Fatalf("%d of %d", sink.n.Load(), b.N)
	}
}

// benchOrigin numbers a benchmark publish, for its latency.
type benchOrigin int

func (benchOrigin) Published(*PubRequest) {}

// submitBench submits publish number i to p, waiting while the pool's queue
// is full: a benchmark offers publishes faster than any store takes them.
func submitBench(p *pool, key, from string, i int, body []byte, origin Origin) {
	r := GetPubRequest()
	r.Key, r.From, r.Origin = key, from, origin
	r.ID = strconvAppend(r.ID, i)
	r.Body = append(r.Body, body...)
	for p.submit(r) != nil {
		time.Sleep(10 * time.Microsecond)
	}
}

// spreadStore fails every CommitBatch holding room "bad", and records the
// largest number of CommitBatch calls in flight at once.
type spreadStore struct {
	*persist.Memory
	inflight, most atomic.Int32
}

func (s *spreadStore) CommitBatch(ctx context.Context, rows []*persist.Row) error {
	n := s.inflight.Add(1)
	defer s.inflight.Add(-1)
	for m := s.most.Load(); n > m && !s.most.CompareAndSwap(m, n); m = s.most.Load() {
	}
	time.Sleep(2 * time.Millisecond) // a commit that takes time lets batches fill
	for _, r := range rows {
		if r.Key == proto.RoomKey("a", "bad") {
			for _, r := range rows {
				r.Err = proto.ErrOverloaded
			}
			return proto.ErrOverloaded
		}
	}
	return s.Memory.CommitBatch(ctx, rows)
}

// A backlog fills batches; each full batch is committed as room-disjoint
// parts in parallel. Every room keeps its order, and a failing part fails
// alone.
func TestPoolSpread(t *testing.T) {
	st := &spreadStore{Memory: persist.NewMemory(0)}
	sink := newAckSink()
	p := newPool(st, sink.committed, PoolConfig{Workers: 1, MaxBatch: 32, Spread: 3, Window: -1})
	const rooms, per = 12, 100
	submit := func(k string, i int) {
		for p.submit(newReq(k, "u", fmt.Sprint(i), fmt.Sprintf(`{"i":%d}`, i))) != nil {
			time.Sleep(time.Millisecond)
		}
	}
	for i := 0; i < per; i++ {
		for r := 0; r < rooms; r++ {
			submit(proto.RoomKey("a", fmt.Sprint("room", r)), i)
		}
	}
	for sink.n.Load() != rooms*per {
		time.Sleep(time.Millisecond)
	}
	sink.check(t)
	for r := 0; r < rooms; r++ {
		if got := sink.lastNew[proto.RoomKey("a", fmt.Sprint("room", r))]; got != per {
			t.Fatalf("room%d: last seq %d, want %d", r, got, per)
		}
	}
	if m := st.most.Load(); m < 2 || m > 3 {
		t.Fatalf("at most %d commits in flight, want 2 or 3", m)
	}

	// Now every batch holds "bad", whose part fails: the rooms of the
	// other parts are still stored when their batch was spread (the
	// ackSink checks that what is stored stays consecutive per room).
	bad := proto.RoomKey("a", "bad")
	for i := 0; i < per; i++ {
		submit(bad, i)
		for r := 0; r < rooms; r++ {
			submit(proto.RoomKey("a", fmt.Sprint("room", r)), per+i)
		}
	}
	p.close()
	sink.check(t)
	stored := 0
	for r := 0; r < rooms; r++ {
		k := proto.RoomKey("a", fmt.Sprint("room", r))
		if sink.lastNew[k] > per {
			stored++
		}
	}
	if stored == 0 {
		t.Fatal("no room outside the failing part was stored: a failing part failed the others")
	}
	if _, ok := sink.lastNew[bad]; ok {
		t.Fatal("the failing room was stored")
	}
}

// TestPublishPoolAllocations: a publish through the pool (submit, gather,
// commit, encode into the arena, answer) allocates nothing of its own.
// What remains is per commit (its timeout context) and per 64 KiB arena
// chunk of frames, far below one per publish.
func TestPublishPoolAllocations(t *testing.T) {
	if raceOn {
		t.Skip("the race detector allocates on the publish path")
	}
	sink := &countSink{}
	p := newPool(&seqStore{}, sink.committed, PoolConfig{Workers: 1})
	defer p.close()
	body := []byte(`{"text":"hello, this is a chat message"}`)
	const per = 512
	i := 0
	round := func() {
		want := sink.n.Load() + per
		for range per {
			i++
			submitBench(p, "a/r", "u", i, body, nil)
		}
		for sink.n.Load() < want {
			runtime.Gosched()
		}
	}
	round()
	n := leastAllocs(5, round)
	t.Logf("%.1f allocations per %d publishes", n, per)
	if n >= per/8 {
		t.Fatalf("%.1f allocations per %d publishes: something allocates per publish", n, per)
	}
}
