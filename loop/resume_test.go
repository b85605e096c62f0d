package loop

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bytedance/sonic"
	"github.com/gobwas/ws"
	"github.com/jackc/pgx/v5"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/persist/pgtest"
	"github.com/roost-chat/roost/proto"
	"github.com/roost-chat/roost/proto/prototest"
	"github.com/roost-chat/roost/pubsub"
)

// The Resume rules (docs/protocol.md), each case of a promise that used to
// break, on real sockets, on the memory store and on PostgreSQL.

// resumeStore names a store for a resume test: memory (a new, empty store
// at every start, as a restarted process has) or PostgreSQL (one database
// for the whole test, kept across starts).
type resumeStore struct {
	name string
	keep int    // memory store
	url  string // PostgreSQL; set by each()
}

// eachStore runs fn as a subtest on the memory store and on PostgreSQL.
func eachStore(t *testing.T, keep int, fn func(t *testing.T, rs *resumeStore)) {
	t.Run("memory", func(t *testing.T) { fn(t, &resumeStore{name: "memory", keep: keep}) })
	t.Run("postgres", func(t *testing.T) {
		fn(t, &resumeStore{name: "postgres", url: pgtest.NewDB(t)})
	})
}

func (rs *resumeStore) pg() bool { return rs.url != "" }

// start runs a node on the store; stop ends it (the test's cleanup stops
// it too).
func (rs *resumeStore) start(t *testing.T, mutate func(*Config)) (n *node, stop func()) {
	t.Helper()
	cfg := testConfig()
	if mutate != nil {
		mutate(&cfg)
	}
	var st persist.Store
	if rs.pg() {
		st = openPG(t, rs.url)
	} else {
		st = persist.NewMemory(rs.keep)
	}
	n = startNodeWith(t, cfg, st, testLogger(), nil)
	var once sync.Once
	stop = func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			n.fan.ClosePublishes()
			_ = n.srv.Stop(ctx)
			_ = n.fan.Close()
			st.Close()
		})
	}
	t.Cleanup(stop)
	return n, stop
}

// sql runs statements on the test's database.
func (rs *resumeStore) sql(t *testing.T, stmt string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, rs.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, stmt); err != nil {
		t.Fatal(err)
	}
}

// fillStore commits n messages of size-byte bodies to key, 100 per batch,
// straight into the store (the replay under test reads them back).
func fillStore(t testing.TB, st persist.Store, key string, from, n, size int) {
	t.Helper()
	body := []byte(`"` + strings.Repeat("b", max(size-2, 0)) + `"`)
	var reqs []*persist.Row
	flush := func() {
		if err := st.CommitBatch(context.Background(), reqs); err != nil {
			t.Fatal(err)
		}
		reqs = reqs[:0]
	}
	for i := from; i < from+n; i++ {
		reqs = append(reqs, &persist.Row{Key: key, From: "filler", ID: []byte(fmt.Sprintf("f%d", i)), Body: body})
		if len(reqs) == 100 {
			flush()
		}
	}
	if len(reqs) > 0 {
		flush()
	}
}

// publish sends n messages to room from c and waits for their acks
// (skipping any msg frames c gets because it is joined).
func publish(t testing.TB, c *client, room, prefix string, n int) {
	t.Helper()
	for i := 1; i <= n; i++ {
		c.send(fmt.Sprintf(`{"op":"pub","room":%q,"id":"%s%d","body":%d}`, room, prefix, i, i))
	}
	for acked := 0; acked < n; {
		if m := c.recv(); m["op"] == "ack" {
			acked++
		} else if m["op"] != "msg" {
			t.Fatalf("publishing: unexpected %v", m)
		}
	}
}

// expectSeqs reads msg frames lo..hi of room, in order, nothing between.
func (c *client) expectSeqs(room string, lo, hi uint64) {
	c.t.Helper()
	for seq := lo; seq <= hi; seq++ {
		c.expect(map[string]any{"op": "msg", "room": room, "seq": int(seq)})
	}
}

func epochOf(t testing.TB, m map[string]any) string {
	t.Helper()
	e, ok := m["epoch"].(string)
	if !ok || e == "" || len(e) > proto.MaxEpoch {
		t.Fatalf("joined without a valid epoch: %v", m)
	}
	return e
}

// Case 1: the history behind a client's seqs is gone (the memory store
// started afresh; in PostgreSQL the room was deleted and made again). A
// join with since is answered recovered:false at once, and the client gets
// the room's new messages, its own publishes included.
func TestResumeHistoryGone(t *testing.T) {
	eachStore(t, 1000, func(t *testing.T, rs *resumeStore) {
		n1, stop1 := rs.start(t, nil)
		p := n1.dial(t, "pub")
		publish(t, p, "r", "old", 5)
		w := n1.dial(t, "w")
		w.send(`{"op":"join","room":"r"}`)
		old := epochOf(t, w.expect(map[string]any{"op": "joined", "room": "r", "seq": 5}))
		stop1()
		if rs.pg() {
			rs.sql(t, `DELETE FROM messages; DELETE FROM rooms`)
		}

		n2, _ := rs.start(t, nil)
		c := n2.dial(t, "c")
		c.send(fmt.Sprintf(`{"op":"join","room":"r","since":5,"epoch":%q}`, old))
		j := c.expect(map[string]any{"op": "joined", "room": "r", "seq": 0, "recovered": false, "from": 1})
		fresh := epochOf(t, j)
		if fresh == old {
			t.Fatalf("epoch %q survived the loss of its history", old)
		}
		// Its own publishes reach it (they did not: it waited for seq 6).
		for i := 1; i <= 3; i++ {
			c.send(fmt.Sprintf(`{"op":"pub","room":"r","id":"new%d","body":%d}`, i, i))
		}
		acks, msgs := map[uint64]bool{}, []uint64{}
		for len(acks) < 3 || len(msgs) < 3 {
			m := c.recv()
			switch m["op"] {
			case "ack":
				acks[num(m["seq"])] = true
			case "msg":
				msgs = append(msgs, num(m["seq"]))
			default:
				t.Fatalf("unexpected %v", m)
			}
		}
		if fmt.Sprint(msgs) != "[1 2 3]" || !acks[1] || !acks[2] || !acks[3] {
			t.Fatalf("msgs %v acks %v", msgs, acks)
		}
		// Without an epoch, a since past the store's newest seq is told
		// the same: the replay starts at the oldest stored message.
		d := n2.dial(t, "d")
		d.send(`{"op":"join","room":"r","since":5}`)
		d.expect(map[string]any{"op": "joined", "seq": 3, "epoch": fresh, "recovered": false, "from": 1})
		d.expectSeqs("r", 1, 3)
		// A since inside the new numbering but with the old epoch: the
		// seqs belong to another history.
		e := n2.dial(t, "e")
		e.send(fmt.Sprintf(`{"op":"join","room":"r","since":2,"epoch":%q}`, old))
		e.expect(map[string]any{"op": "joined", "seq": 3, "recovered": false, "from": 1})
		e.expectSeqs("r", 1, 3)
		// The current epoch: recovered.
		f := n2.dial(t, "f")
		f.send(fmt.Sprintf(`{"op":"join","room":"r","since":2,"epoch":%q}`, fresh))
		f.expect(map[string]any{"op": "joined", "seq": 3, "recovered": true})
		f.expectSeqs("r", 3, 3)
		publish(t, p2(t, n2), "r", "more", 1)
		for _, x := range []*client{c, d, e, f} {
			x.expect(map[string]any{"op": "msg", "seq": 4})
		}
		if got := n2.fan.Stats.ResumesLost.Load(); got != 3 {
			t.Fatalf("resumes lost %d, want 3 (c, d, e)", got)
		}
	})
}

func p2(t *testing.T, n *node) *client { return n.dial(t, "pub2") }

// Case 2: a catch-up and a history answer far larger than the outbound
// limit complete, paced by what the client reads, and nobody is closed.
func TestResumeLongCatchUp(t *testing.T) {
	eachStore(t, 5000, func(t *testing.T, rs *resumeStore) {
		n, _ := rs.start(t, nil)
		const total, size = 3000, 4 << 10
		fillStore(t, n.store, proto.RoomKey("test", "big"), 1, total, size)
		c := n.dial(t, "c")
		c.send(`{"op":"join","room":"big","since":969}`)
		c.expect(map[string]any{"op": "joined", "seq": total, "recovered": true})
		c.expectSeqs("big", 970, total)

		// History limit 1000: answers stop at their byte bound and say so;
		// paging back with before reaches 1000 messages, newest last.
		var seqs []uint64
		before := uint64(0)
		for len(seqs) < 1000 {
			q := fmt.Sprintf(`{"op":"history","room":"big","limit":%d}`, 1000-len(seqs))
			if before != 0 {
				q = fmt.Sprintf(`{"op":"history","room":"big","limit":%d,"before":%d}`, 1000-len(seqs), before)
			}
			c.send(q)
			raw := c.recvRaw()
			if len(raw) > n.srv.cfg.Config.OutboundLimit {
				t.Fatalf("history frame of %d bytes, over the outbound limit", len(raw))
			}
			var h struct {
				Op       string
				Messages []struct{ Seq uint64 }
				More     bool
			}
			if err := sonic.Unmarshal(raw, &h); err != nil || h.Op != "history" || len(h.Messages) == 0 {
				t.Fatalf("history answer %.200s: %v", raw, err)
			}
			if !h.More && len(seqs)+len(h.Messages) < 1000 {
				t.Fatalf("answer of %d messages without more:true", len(h.Messages))
			}
			page := make([]uint64, len(h.Messages))
			for i, m := range h.Messages {
				page[i] = m.Seq
			}
			seqs = append(page, seqs...)
			before = page[0]
		}
		for i, s := range seqs {
			if s != uint64(total-999+i) {
				t.Fatalf("history seq %d at %d, want %d", s, i, total-999+i)
			}
		}
		if got := n.fan.Stats.SlowCloses.Load(); got != 0 {
			t.Fatalf("%d slow-consumer closes", got)
		}
	})
}

// Case 3: retention removed messages after since: the joined says from
// where the replay starts.
func TestResumeBehindRetention(t *testing.T) {
	eachStore(t, 5, func(t *testing.T, rs *resumeStore) {
		n, _ := rs.start(t, nil)
		p := n.dial(t, "p")
		publish(t, p, "r", "m", 10)
		if pg, ok := n.store.(*persist.Postgres); ok {
			pg.SetRetentionPolicy(persist.RetentionPolicy{Default: persist.Retention{MaxCount: 5}})
			if _, err := pg.EnforceRetention(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		c := n.dial(t, "c")
		c.send(`{"op":"join","room":"r","since":2}`)
		c.expect(map[string]any{"op": "joined", "seq": 10, "recovered": false, "from": 6})
		c.expectSeqs("r", 6, 10)
		d := n.dial(t, "d")
		d.send(`{"op":"join","room":"r","since":5}`)
		d.expect(map[string]any{"op": "joined", "seq": 10, "recovered": true})
		d.expectSeqs("r", 6, 10)
		if got := n.store.RetentionStats().DeletedByCount; got != 5 {
			t.Fatalf("retention deleted %d, want 5", got)
		}
	})
}

// Case 4: a consumer that reads too slowly for the live traffic is closed
// with 1013 and its retry hint, and it reads that close frame.
func TestSlowConsumerReadsItsClose(t *testing.T) {
	eachStore(t, 1000, func(t *testing.T, rs *resumeStore) {
		n, _ := rs.start(t, nil)
		conn, rd := n.raw(t, "slow")
		if _, err := conn.Write(clientFrame(ws.OpText, true, []byte(`{"op":"join","room":"flood"}`))); err != nil {
			t.Fatal(err)
		}
		p := n.dial(t, "p")
		body := strings.Repeat("x", 32<<10)
		stopPub := make(chan struct{})
		pubDone := make(chan struct{})
		var answered atomic.Int64
		go func() { // the publisher reads its answers
			for {
				_ = p.conn.SetReadDeadline(time.Now().Add(time.Minute))
				if _, err := prototest.ReadFrame(p.rd); err != nil {
					return
				}
				answered.Add(1)
			}
		}()
		go func() {
			// At most 64 publishes unanswered, so that a PostgreSQL under
			// a busy machine is not flooded into statement timeouts.
			defer close(pubDone)
			for i := 0; ; i++ {
				for int64(i)-answered.Load() >= 64 {
					select {
					case <-stopPub:
						return
					case <-time.After(time.Millisecond):
					}
				}
				select {
				case <-stopPub:
					return
				default:
				}
				if err := wsWrite(p, fmt.Sprintf(`{"op":"pub","room":"flood","id":"f%d","body":%q}`, i, body)); err != nil {
					return
				}
			}
		}()
		// The slow one reads 4 KiB every 5 ms: 800 KB/s, far below the flood.
		deadline := time.Now().Add(60 * time.Second)
		code, reason := 0, ""
		for code == 0 {
			if time.Now().After(deadline) {
				t.Fatal("no close frame within 60s")
			}
			_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
			h, err := ws.ReadHeader(rd)
			if err != nil {
				t.Fatalf("read: %v (slow closes so far: %d): the close frame never came", err, n.fan.Stats.SlowCloses.Load())
			}
			left := h.Length
			p := make([]byte, 0, min(h.Length, 4<<10))
			for left > 0 {
				chunk := make([]byte, min(left, 4<<10))
				if _, err := io.ReadFull(rd, chunk); err != nil {
					t.Fatalf("read payload: %v", err)
				}
				if h.OpCode == ws.OpClose {
					p = append(p, chunk...)
				}
				left -= int64(len(chunk))
				time.Sleep(5 * time.Millisecond)
			}
			if h.OpCode == ws.OpClose {
				if len(p) < 2 {
					t.Fatal("close frame without code")
				}
				code, reason = int(binary.BigEndian.Uint16(p)), string(p[2:])
			}
		}
		close(stopPub)
		if code != proto.CloseTryAgain || !strings.HasPrefix(reason, "retry=") {
			t.Fatalf("closed with %d %q, want 1013 retry=MS", code, reason)
		}
		if n.fan.Stats.SlowCloses.Load() != 1 {
			t.Fatalf("slow closes %d, want 1", n.fan.Stats.SlowCloses.Load())
		}
		p.conn.Close()
		<-pubDone
	})
}

// wsWrite sends a client text frame, reporting the error instead of
// failing the test (for writer goroutines).
func wsWrite(c *client, s string) error {
	_, err := c.conn.Write(clientFrame(ws.OpText, true, []byte(s)))
	return err
}

// A replay of 10,000 messages of 16 KB (160 MB, 160 times the outbound
// limit) to a client that reads slowly completes with no gap and no close,
// while another room's members keep their latency.
func TestLongReplayToSlowReader(t *testing.T) {
	if testing.Short() {
		t.Skip("160 MB replay")
	}
	eachStore(t, 10000, testLongReplay)
}

func testLongReplay(t *testing.T, rs *resumeStore) {
	n, _ := rs.start(t, nil)
	const total, size = 10000, 16 << 10
	t0 := time.Now()
	fillStore(t, n.store, proto.RoomKey("test", "long"), 1, total, size)
	t.Logf("%s: stored %d x %d B in %s", rs.name, total, size, time.Since(t0))

	// Bystanders: a member of another room, and its publisher, timing
	// each round trip while the replay runs.
	by := n.dial(t, "by")
	by.send(`{"op":"join","room":"side"}`)
	by.expect(map[string]any{"op": "joined"})
	bp := n.dial(t, "bp")
	done := make(chan struct{})
	lat := make(chan []time.Duration, 1)
	go func() {
		var ds []time.Duration
		for i := 1; ; i++ {
			select {
			case <-done:
				lat <- ds
				return
			case <-time.After(20 * time.Millisecond):
			}
			t0 := time.Now()
			if err := wsWrite(bp, fmt.Sprintf(`{"op":"pub","room":"side","id":"s%d","body":%d}`, i, i)); err != nil {
				lat <- ds
				return
			}
			for {
				_ = by.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
				f, err := prototest.ReadFrame(by.rd)
				if err != nil {
					lat <- ds
					return
				}
				if strings.Contains(string(f.Data), `"op":"msg"`) {
					break
				}
			}
			ds = append(ds, time.Since(t0))
		}
	}()
	go func() { _, _ = io.Copy(io.Discard, bp.rd) }()

	c := n.dial(t, "c")
	c.send(`{"op":"join","room":"long","since":0}`)
	c.expect(map[string]any{"op": "joined", "seq": total, "recovered": true})
	start := time.Now()
	for seq := 1; seq <= total; seq++ {
		f := c.next()
		p := f.Data
		if f.Op == ws.OpPing {
			seq-- // the node's idle ping: this client only reads
			continue
		}
		if f.Op != ws.OpText {
			t.Fatalf("at seq %d: opcode %v %q", seq, f.Op, p)
		}
		var m struct {
			Op  string
			Seq int
		}
		if err := sonic.Unmarshal(p, &m); err != nil || m.Op != "msg" || m.Seq != seq || len(p) < size {
			t.Fatalf("at seq %d: %.120s", seq, p)
		}
		if seq%10 == 0 {
			// A slow reader: 160 KB per 2 ms, 80 MB/s at best, so the 160
			// MB take at least 2 s while the store could hand them over
			// far faster (the memory store fills them in a quarter of that).
			time.Sleep(2 * time.Millisecond)
		}
	}
	took := time.Since(start)
	close(done)
	ds := <-lat
	if len(ds) < 5 {
		t.Fatalf("bystander made %d round trips", len(ds))
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	p50, p99 := ds[len(ds)/2], ds[len(ds)*99/100]
	t.Logf("%s: replay of %d x %d B took %s; bystander round trips: %d, p50 %s, p99 %s, max %s", rs.name, total, size, took, len(ds), p50, p99, ds[len(ds)-1])
	// A loose bound on a shared machine: the point is that the bystander
	// is never stuck behind the replay (that would be seconds).
	if ds[len(ds)-1] > time.Second {
		t.Fatalf("a bystander round trip took %s during the replay", ds[len(ds)-1])
	}
	if n.fan.Stats.SlowCloses.Load() != 0 {
		t.Fatal("a slow-consumer close during the replay")
	}
}

// bus connects the brokers of several in-process nodes, as Redis does:
// a publish on any node reaches every node subscribed to the room. Node i's
// deliveries can be held back (in flight) and released later, in order.
type bus struct {
	mu    sync.Mutex
	nodes []*busBroker
}

type busBroker struct {
	*pubsub.Memory
	b    *bus
	held bool
	q    []busMsg
}

type busMsg struct {
	key   string
	seq   uint64
	frame []byte
}

func (b *bus) broker(h pubsub.Handler) pubsub.Broker {
	b.mu.Lock()
	defer b.mu.Unlock()
	bb := &busBroker{Memory: pubsub.NewMemory(h), b: b}
	b.nodes = append(b.nodes, bb)
	return bb
}

func (bb *busBroker) Publish(ctx context.Context, key string, seq uint64, frame []byte) error {
	bb.b.mu.Lock()
	var now []*busBroker
	for _, n := range bb.b.nodes {
		if n.held {
			n.q = append(n.q, busMsg{key, seq, frame})
		} else {
			now = append(now, n)
		}
	}
	bb.b.mu.Unlock()
	for _, n := range now {
		_ = n.Memory.Publish(ctx, key, seq, frame)
	}
	return nil
}

func (bb *busBroker) PublishBatch(ctx context.Context, pubs []pubsub.Publication, errs []error) int {
	for i, p := range pubs {
		errs[i] = bb.Publish(ctx, p.Key, p.Seq, p.Frame)
	}
	return 0
}

func (b *bus) hold(i int) { b.mu.Lock(); b.nodes[i].held = true; b.mu.Unlock() }

func (b *bus) release(i int) {
	b.mu.Lock()
	n := b.nodes[i]
	q := n.q
	n.q, n.held = nil, false
	b.mu.Unlock()
	for _, m := range q {
		_ = n.Memory.Publish(context.Background(), m.key, m.seq, m.frame)
	}
}

// Two nodes on one store: a client that saw seqs 1..7 on node A rejoins on
// node B, where 6 and 7 are still in flight through the broker. Its since
// is not ahead of the store, so it waits (recovered:true) and then gets
// exactly the seqs after 7, once; a since B has reached needs no wait.
func TestRejoinOtherNodeSinceInFlight(t *testing.T) {
	st := persist.NewMemory(1000)
	b := &bus{}
	// One loop on B: the rejoin lands where the room is live and behind
	// (on a loop of its own the room would start at the store's seq 7).
	one := testConfig()
	one.Loops = 1
	a := startNodeWith(t, testConfig(), st, testLogger(), b.broker)
	bn := startNodeWith(t, one, st, testLogger(), b.broker)
	pa := a.dial(t, "pub")
	wb := bn.dial(t, "watcher") // keeps the room live on B
	wb.send(`{"op":"join","room":"r"}`)
	wb.expect(map[string]any{"op": "joined", "seq": 0})
	publish(t, pa, "r", "m", 5)
	wb.expectSeqs("r", 1, 5)
	b.hold(1)
	for i := 6; i <= 7; i++ {
		pa.send(fmt.Sprintf(`{"op":"pub","room":"r","id":"h%d","body":%d}`, i, i))
		pa.expect(map[string]any{"op": "ack", "seq": i})
	}
	x := bn.dial(t, "x")
	x.send(`{"op":"join","room":"r","since":7}`)
	j := x.expect(map[string]any{"op": "joined", "room": "r", "seq": 5, "recovered": true})
	y := bn.dial(t, "y")
	y.send(fmt.Sprintf(`{"op":"join","room":"r","since":5,"epoch":%q}`, epochOf(t, j)))
	y.expect(map[string]any{"op": "joined", "seq": 5, "recovered": true})
	b.release(1)
	wb.expectSeqs("r", 6, 7)
	y.expectSeqs("r", 6, 7)
	pa.send(`{"op":"pub","room":"r","id":"after","body":8}`)
	pa.expect(map[string]any{"op": "ack", "seq": 8})
	x.expect(map[string]any{"op": "msg", "seq": 8}) // 6 and 7 it has: 8 first
	y.expect(map[string]any{"op": "msg", "seq": 8})
	wb.expect(map[string]any{"op": "msg", "seq": 8})
}
