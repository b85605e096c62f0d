package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/persist/pgtest"
	"github.com/roost-chat/roost/proto"
	"github.com/roost-chat/roost/proto/prototest"
)

// pgStore opens a migrated database of the test's own.
func pgStore(t testing.TB) (*persist.Postgres, string) {
	t.Helper()
	url := pgtest.NewDB(t)
	ctx := context.Background()
	if err := persist.Migrate(ctx, url); err != nil {
		t.Fatal(err)
	}
	p, err := persist.OpenPostgres(ctx, url, persist.PGConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p, url
}

// publish commits n messages to each room in batches of 50, as the
// publish pool does (one CommitBatch, then each new message's frame
// encoded once), and hands each answered batch to the dispatchers given
// (none: a node that crashed between commit and delivery).
func publish(t testing.TB, p *persist.Postgres, rooms []string, n int, ds ...*Dispatcher) {
	t.Helper()
	var reqs []*persist.Row
	flush := func() {
		if len(reqs) == 0 {
			return
		}
		if err := p.CommitBatch(context.Background(), reqs); err != nil {
			t.Fatal(err)
		}
		frames := make([][]byte, len(reqs))
		for i, r := range reqs {
			_, room := proto.SplitKey(r.Key)
			frames[i] = proto.AppendMsgFrame(nil, room, r.Seq, r.ID, r.From, r.TS, r.Body)
		}
		for _, d := range ds {
			hand(d, reqs, frames)
		}
		reqs = nil
	}
	for i := 1; i <= n; i++ {
		for _, room := range rooms {
			reqs = append(reqs, &persist.Row{Key: proto.RoomKey("chat", room), From: "alice", ID: []byte(fmt.Sprintf("m-%d-%d", i, time.Now().UnixNano())), Body: []byte(fmt.Sprintf(`{"n":%d}`, i))})
			if len(reqs) == 50 {
				flush()
			}
		}
	}
	flush()
}

func durableCfg(p *persist.Postgres, owner string) Config {
	cfg := Defaults()
	cfg.Store, cfg.Owner = p, owner
	cfg.RetryMin, cfg.RetryMax = 10*time.Millisecond, 200*time.Millisecond
	cfg.Sweep, cfg.Idle = 200*time.Millisecond, 500*time.Millisecond
	return cfg
}

func serve(t testing.TB, h http.Handler) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String() + "/hook"
}

// registered creates the app in the store (its webhook starts the
// cursors of rooms that exist) and returns it.
func registered(t testing.TB, p *persist.Postgres, a proto.App) proto.App {
	if err := p.CreateApp(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	return a
}

// dupes counts (room, seq) pairs the receiver got more than once.
func (rc *receiver) dupes() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	n := 0
	for _, seqs := range rc.seen {
		seen := map[uint64]bool{}
		for _, s := range seqs {
			if seen[s] {
				n++
			}
			seen[s] = true
		}
	}
	return n
}

// TestDurableBurst: a 10,000-message burst over four rooms with
// PostgreSQL: every message at least once, in seq order per room, many
// per POST, each POST signed with both secrets of a rotation; the first
// POSTs fail and are retried; the cursors end at the rooms' last seqs.
func TestDurableBurst(t *testing.T) {
	p, _ := pgStore(t)
	secrets := []string{"current-secret-0123456789", "previous-secret-0123456789"}
	rc := newReceiver(t, secrets...)
	rc.fail = 3
	url := serve(t, rc)
	d := New(durableCfg(p, "node-a"))
	defer d.Close()
	d.SetApps([]proto.App{registered(t, p, app(url, secrets...))})
	rooms := []string{"r1", "r2", "r3", "r4"}
	publish(t, p, append(rooms, "other"), 2500, d)
	prototest.WaitFor(t, 60*time.Second, func() error { return rc.check(rooms, 2500) })
	rc.mu.Lock()
	if rc.sigCount[2] == 0 || rc.sigCount[1] != 0 {
		t.Errorf("signatures per POST: %v, want 2 on every POST during the rotation", rc.sigCount)
	}
	if _, ok := rc.seen["other"]; ok {
		t.Error("a room outside the webhook's patterns was delivered")
	}
	if rc.posts*10 > rc.events {
		t.Errorf("%d POSTs for %d events: the burst was not batched", rc.posts, rc.events)
	}
	t.Logf("%d events in %d POSTs; %d read back from the store", rc.events, rc.posts, d.Stats.Read.Load())
	rc.mu.Unlock()
	prototest.WaitFor(t, 10*time.Second, func() error {
		owed, err := p.OwedHookRooms(context.Background(), "chat", "nobody", 10)
		if err != nil || len(owed) > 0 && !(len(owed) == 1 && strings.HasSuffix(owed[0].Key, "/other")) {
			return fmt.Errorf("owed rooms %v, %v", owed, err)
		}
		return nil
	})
}

// TestDurableReceiverDown30s: the receiver is down (connection refused)
// for 30 s while messages are committed; when it is back everything
// arrives, in order.
func TestDurableReceiverDown30s(t *testing.T) {
	if testing.Short() {
		t.Skip("30 s")
	}
	p, _ := pgStore(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cfg := durableCfg(p, "node-a")
	cfg.RetryMax = 2 * time.Second
	d := New(cfg)
	defer d.Close()
	d.SetApps([]proto.App{registered(t, p, app("http://"+addr+"/hook", "current-secret-0123456789"))})
	rooms := []string{"r1", "r2"}
	down := time.Now()
	for time.Since(down) < 30*time.Second {
		publish(t, p, rooms, 50, d)
		time.Sleep(time.Second)
	}
	if d.Stats.Failures.Load() < 5 || d.Stats.Delivered.Load() != 0 {
		t.Fatalf("while down: %d failures, %d delivered", d.Stats.Failures.Load(), d.Stats.Delivered.Load())
	}
	var last uint64
	last, _ = p.LastSeq(context.Background(), "chat/r1")
	rc := newReceiver(t, "current-secret-0123456789")
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("cannot listen on %s again: %v", addr, err)
	}
	srv := &http.Server{Handler: rc}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	back := time.Now()
	prototest.WaitFor(t, 20*time.Second, func() error { return rc.check(rooms, last) })
	t.Logf("%d messages per room owed for 30 s, all delivered %v after the receiver came back, %d POSTs", last, time.Since(back), rc.posts)
}

// TestDurableOwedAfterCrash: messages committed by a node that died
// before handing them to its dispatcher (nothing in memory anywhere) are
// found in the store and delivered by the next dispatcher.
func TestDurableOwedAfterCrash(t *testing.T) {
	p, _ := pgStore(t)
	rc := newReceiver(t, "current-secret-0123456789")
	url := serve(t, rc)
	a := registered(t, p, app(url, "current-secret-0123456789"))
	publish(t, p, []string{"r1", "r2"}, 300) // no dispatcher: lost from memory
	d := New(durableCfg(p, "node-b"))
	defer d.Close()
	d.SetApps([]proto.App{a})
	prototest.WaitFor(t, 20*time.Second, func() error { return rc.check([]string{"r1", "r2"}, 300) })
	if d.Stats.Read.Load() < 600 {
		t.Fatalf("%d events read from the store, want 600", d.Stats.Read.Load())
	}
}

// TestDurableTwoNodes: two dispatchers on one database, each handed the
// messages it committed, several rooms published through both: every
// message arrives once per room in order, and no (room, seq) twice, since
// each room is delivered by the node holding its lease.
func TestDurableTwoNodes(t *testing.T) {
	p, _ := pgStore(t)
	rc := newReceiver(t, "current-secret-0123456789")
	url := serve(t, rc)
	a := registered(t, p, app(url, "current-secret-0123456789"))
	da := New(durableCfg(p, "node-a"))
	defer da.Close()
	db := New(durableCfg(p, "node-b"))
	defer db.Close()
	da.SetApps([]proto.App{a})
	db.SetApps([]proto.App{a})
	rooms := []string{"r1", "r2", "r3", "r4", "r5", "r6"}
	var wg sync.WaitGroup
	for i, d := range []*Dispatcher{da, db} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each node publishes to its own rooms and to the shared ones.
			own := []string{rooms[i*2], rooms[i*2+1]}
			for k := 0; k < 20; k++ {
				publish(t, p, append(own, "r5", "r6"), 25, d)
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	prototest.WaitFor(t, 30*time.Second, func() error {
		if err := rc.check(rooms[:4], 500); err != nil {
			return err
		}
		return rc.check(rooms[4:], 1000)
	})
	if n := rc.dupes(); n != 0 {
		t.Fatalf("%d events delivered twice by two nodes in the normal case", n)
	}
	t.Logf("node a: %d posts, %d events (%d read); node b: %d posts, %d events (%d read)",
		da.Stats.Posts.Load(), da.Stats.Delivered.Load(), da.Stats.Read.Load(), db.Stats.Posts.Load(), db.Stats.Delivered.Load(), db.Stats.Read.Load())
	if da.Stats.Delivered.Load() == 0 || db.Stats.Delivered.Load() == 0 {
		t.Fatal("one node delivered nothing: the work was not shared")
	}
	// The events a node held for a room the other delivers were read by
	// that one from the store: nothing was lost, so nothing is dropped.
	if n := da.Stats.Dropped.Load() + db.Stats.Dropped.Load(); n != 0 {
		t.Fatalf("%d events counted as dropped, none lost", n)
	}
}

// TestDurableDeadLetterReplay: a receiver failing past the app's max age
// turns the events into dead letters (the cursor moves on, later events
// flow once the receiver is back); a replay sends a dead letter again,
// signed, and the receiver then has every message.
func TestDurableDeadLetterReplay(t *testing.T) {
	p, _ := pgStore(t)
	rc := newReceiver(t, "current-secret-0123456789")
	rc.fail = 1 << 30
	url := serve(t, rc)
	a := app(url, "current-secret-0123456789")
	a.Webhook.MaxAge = proto.Duration(time.Second)
	a = registered(t, p, a)
	d := New(durableCfg(p, "node-a"))
	defer d.Close()
	d.SetApps([]proto.App{a})
	publish(t, p, []string{"r1"}, 40, d)
	ctx := context.Background()
	var dead []persist.DeadLetter
	prototest.WaitFor(t, 20*time.Second, func() error {
		var err error
		dead, err = p.DeadLetters(ctx, "chat", 100)
		n := 0
		for _, dl := range dead {
			n += dl.Events
		}
		if err != nil || n < 40 {
			return fmt.Errorf("dead letters %d events, %v", n, err)
		}
		return nil
	})
	rc.mu.Lock()
	rc.fail = 0
	rc.mu.Unlock()
	publish(t, p, []string{"r1"}, 10, d) // seqs 41..50 flow normally
	prototest.WaitFor(t, 10*time.Second, func() error {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		if len(rc.seen["r1"]) < 10 {
			return fmt.Errorf("%d events after the receiver came back", len(rc.seen["r1"]))
		}
		return nil
	})
	for _, dl := range dead {
		got, err := p.GetDeadLetter(ctx, dl.ID)
		if err != nil {
			t.Fatal(err)
		}
		if err := Replay(ctx, a, got.Body); err != nil {
			t.Fatal(err)
		}
		if err := p.MarkReplayed(ctx, dl.ID); err != nil {
			t.Fatal(err)
		}
	}
	rc.mu.Lock()
	seen := map[uint64]bool{}
	for _, s := range rc.seen["r1"] {
		seen[s] = true
	}
	rc.mu.Unlock()
	for s := uint64(1); s <= 50; s++ {
		if !seen[s] {
			t.Fatalf("seq %d never arrived, replay included", s)
		}
	}
	if d.Stats.Dead.Load() < 40 {
		t.Fatalf("%d events counted dead", d.Stats.Dead.Load())
	}
}

// BenchmarkDeliveryPG: the dispatcher fed by real commits (PostgreSQL,
// CommitBatch of 10 messages every 10 ms: 1,000 msg/s, or "burst": b.N
// committed as fast as one committer goes), memory mode against durable
// mode, interleaved with -count. The lag is from CommitBatch returning to
// the receiver's read, so it is the dispatcher's own (its cursor writes
// and sweeps included), not the commit's; msgs/s is the delivered rate.
//
//	go test -run XXX -bench DeliveryPG -benchtime 5000x -count 3 ./fanout/webhook/
func BenchmarkDeliveryPG(b *testing.B) {
	for _, rate := range []int{1000, 0} {
		name := "1000/s"
		if rate == 0 {
			name = "burst"
		}
		for _, durable := range []bool{false, true} {
			mode := "memory"
			if durable {
				mode = "durable"
			}
			b.Run(name+"/"+mode, func(b *testing.B) { benchDeliveryPG(b, rate, durable) })
		}
	}
}

func benchDeliveryPG(b *testing.B, rate int, durable bool) {
	p, _ := pgStore(b)
	committed := make([]atomic.Int64, b.N+1) // by seq: when CommitBatch returned, Unix ns
	var mu sync.Mutex
	var lags []time.Duration
	done := make(chan struct{})
	url := serve(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		now := time.Now().UnixNano()
		var pl struct {
			Events []struct{ Seq uint64 } `json:"events"`
		}
		_ = json.Unmarshal(body, &pl)
		mu.Lock()
		defer mu.Unlock()
		for _, e := range pl.Events {
			if e.Seq <= uint64(b.N) {
				lags = append(lags, time.Duration(now-committed[e.Seq].Load()))
			}
		}
		if len(lags) >= b.N {
			select {
			case <-done:
			default:
				close(done)
			}
		}
	}))
	cfg := Defaults()
	if durable {
		cfg.Store, cfg.Owner = p, "bench"
	}
	d := New(cfg)
	defer d.Close()
	d.SetApps([]proto.App{registered(b, p, app(url, "current-secret-0123456789"))})
	per := 10
	if rate == 0 {
		per = 100
	}
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i += per {
		var reqs []*persist.Row
		for k := i; k < min(i+per, b.N); k++ {
			reqs = append(reqs, &persist.Row{Key: "chat/r1", From: "alice", ID: []byte(fmt.Sprint("m-", k)), Body: []byte(`{"text":"a message of a usual size, some sixty bytes long"}`)})
		}
		if err := p.CommitBatch(context.Background(), reqs); err != nil {
			b.Fatal(err)
		}
		now := time.Now().UnixNano()
		frames := make([][]byte, len(reqs))
		for k, r := range reqs {
			frames[k] = proto.AppendMsgFrame(nil, "r1", r.Seq, r.ID, r.From, r.TS, r.Body)
			committed[r.Seq].Store(now)
		}
		hand(d, reqs, frames)
		if rate > 0 {
			time.Sleep(time.Until(start.Add(time.Duration(i+per) * time.Second / time.Duration(rate))))
		}
	}
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		b.Fatalf("delivered %d of %d", len(lags), b.N)
	}
	el := time.Since(start)
	b.StopTimer()
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(lags)
	b.ReportMetric(float64(b.N)/el.Seconds(), "msgs/s")
	b.ReportMetric(float64(lags[len(lags)/2].Microseconds())/1000, "lag-p50-ms")
	b.ReportMetric(float64(lags[len(lags)*99/100].Microseconds())/1000, "lag-p99-ms")
}

// TestDurableStartsWhenSet: messages committed before the app had a
// webhook are history, not owed; those after it are delivered; a room
// the webhook's patterns take in later starts at that moment too.
func TestDurableStartsWhenSet(t *testing.T) {
	p, _ := pgStore(t)
	rc := newReceiver(t, "current-secret-0123456789")
	url := serve(t, rc)
	ctx := context.Background()
	if err := p.CreateApp(ctx, proto.App{ID: "chat", Secret: "current-secret-0123456789"}); err != nil {
		t.Fatal(err)
	}
	publish(t, p, []string{"r1", "s1"}, 100) // before any webhook
	a, err := p.UpdateApp(ctx, "chat", func(a *proto.App) error {
		a.Webhook = &proto.Webhook{URL: url, Rooms: []string{"r*"}}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	d := New(durableCfg(p, "node-a"))
	defer d.Close()
	d.SetApps([]proto.App{a})
	publish(t, p, []string{"r1", "s1"}, 10, d)
	prototest.WaitFor(t, 10*time.Second, func() error {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		if len(rc.seen["r1"]) < 10 {
			return fmt.Errorf("%d events of r1", len(rc.seen["r1"]))
		}
		return nil
	})
	// s1 joins the patterns: only what comes after.
	a, err = p.UpdateApp(ctx, "chat", func(a *proto.App) error {
		a.Webhook.Rooms = nil
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	d.SetApps([]proto.App{a})
	publish(t, p, []string{"s1"}, 5, d)
	prototest.WaitFor(t, 10*time.Second, func() error {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		if len(rc.seen["s1"]) < 5 {
			return fmt.Errorf("%d events of s1", len(rc.seen["s1"]))
		}
		return nil
	})
	time.Sleep(500 * time.Millisecond) // a sweep or two: nothing older shows up
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if r := rc.seen["r1"]; r[0] != 101 || len(r) != 10 {
		t.Fatalf("r1 got %v, want 101..110", r)
	}
	if s := rc.seen["s1"]; s[0] != 111 || len(s) != 5 {
		t.Fatalf("s1 got %v, want 111..115", s)
	}
}

// TestDurableMemoryBound: past Window bytes held in memory, the rest
// stays in the store only and is read back: a receiver down while 2,000
// events are committed costs at most Window bytes of memory, and they
// all arrive when it is back.
func TestDurableMemoryBound(t *testing.T) {
	p, _ := pgStore(t)
	rc := newReceiver(t, "current-secret-0123456789")
	rc.fail = 1 << 30
	url := serve(t, rc)
	cfg := durableCfg(p, "node-a")
	cfg.Window = 100 * (eventOverhead + 100) // ~100 events of this test held
	d := New(cfg)
	defer d.Close()
	d.SetApps([]proto.App{registered(t, p, app(url, "current-secret-0123456789"))})
	publish(t, p, []string{"r1", "r2"}, 1000, d)
	prototest.WaitFor(t, 10*time.Second, func() error {
		if d.Stats.Owed.Load() != 0 || d.Stats.Failures.Load() < 2 {
			return fmt.Errorf("owed %d, failures %d", d.Stats.Owed.Load(), d.Stats.Failures.Load())
		}
		return nil
	})
	rc.mu.Lock()
	rc.fail = 0
	rc.mu.Unlock()
	prototest.WaitFor(t, 20*time.Second, func() error { return rc.check([]string{"r1", "r2"}, 1000) })
	if d.Stats.Read.Load() < 1500 {
		t.Fatalf("%d events read from the store, want most of 2,000 (at most 100 held)", d.Stats.Read.Load())
	}
}
