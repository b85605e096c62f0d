package loop

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/panjf2000/gnet/v2"

	"github.com/roost-chat/roost/proto"
)

// TestInboxBoundDeliveries: deliveries past InboxLimit are not queued;
// their room is read from the store at the next drain, from the newest seq
// the loop delivered, so every message reaches the members once.
func TestInboxBoundDeliveries(t *testing.T) {
	rig := newFanoutRig(t, 1, false)
	l, s := rig.l, rig.l.srv
	s.cfg.InboxLimit = 16
	s.cfg.FlushInterval = time.Second
	// 40 messages, stored as the publish path stores them before it
	// broadcasts, then delivered by the broker while the loop is busy.
	const total = 40
	frames := make([][]byte, total+1)
	for i := 1; i <= total; i++ {
		req := &proto.PubRequest{Key: rig.key, From: "bob", ID: []byte("m-" + strconv.Itoa(i)), Body: []byte(strconv.Itoa(i))}
		res := make([]proto.PubResult, 1)
		if err := rig.store.CommitBatch(context.Background(), []*proto.PubRequest{req}, res); err != nil || res[0].Err != nil || res[0].Seq != uint64(i) {
			t.Fatalf("commit %d: %v %+v", i, err, res[0])
		}
		frames[i] = proto.AppendMsgFrame(nil, "room", res[0].Seq, req.ID, req.From, res[0].TS, req.Body)
	}
	for seq := 1; seq <= total; seq++ {
		s.fan.OnMessage(rig.key, uint64(seq), frames[seq])
	}
	if got := len(l.queue); got != 16 {
		t.Fatalf("inbox holds %d tasks, want the limit 16", got)
	}
	if got := s.Stats.InboxOverflow.Load(); got != total-16 {
		t.Fatalf("overflow counted %d, want %d", got, total-16)
	}
	if !l.inboxFull() {
		t.Fatal("inbox at its limit not reported full (publishes would be taken)")
	}
	// Other work answers the loop's own requests or the broker's state:
	// never refused.
	s.fan.OnReset()
	if got := len(l.queue); got != 17 {
		t.Fatalf("a reset was not queued past the limit (%d tasks)", got)
	}

	_ = l.drain(context.Background())
	if l.inboxFull() || len(l.lost) != 0 {
		t.Fatalf("after the drain: full %v, %d rooms lost", l.inboxFull(), len(l.lost))
	}
	r := l.table.Room(rig.key)
	if r.Last() != 16 {
		t.Fatalf("room at seq %d after the drain, want 16 (the queued deliveries)", r.Last())
	}
	// The room's tail comes from the store: the rest, in order.
	rig.pump(t, func() bool { return r.Last() == total })
	l.flush()
	var got []byte
	buf := make([]byte, 64<<10)
	peer := rig.peers[0]
	for {
		_ = peer.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		n, err := peer.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			break
		}
	}
	for seq := 1; seq <= total; seq++ {
		if n := bytes.Count(got, []byte(`"seq":`+strconv.Itoa(seq)+`,`)); n != 1 {
			t.Fatalf("message %d queued %d times, want once", seq, n)
		}
	}
}

// TestInboxFullRefusesPublish: a publish read while its loop's inbox is
// full is answered err overloaded, nothing submitted.
func TestInboxFullRefusesPublish(t *testing.T) {
	s, el := fuzzNode(t)
	s.cfg.InboxLimit = 16
	gc := &memConn{el: el}
	s.OnOpen(gc)
	l := s.loops[0].Load()
	t.Cleanup(l.stopTimers)
	gc.in = append(gc.in, fuzzUpgrade...)
	s.OnTraffic(gc)
	for i := 0; i < 16; i++ { // the loop is InboxLimit tasks behind
		l.push(task{kind: tFlush})
	}
	head := len(gc.out)
	gc.in = append(gc.in, clientFrame(ws.OpText, true, []byte(`{"op":"pub","room":"r","id":"p-1","body":1}`))...)
	s.OnTraffic(gc)
	if !bytes.Contains(gc.out[head:], []byte(`"op":"err","ref":"p-1","code":"overloaded"`)) {
		t.Fatalf("publish into a full inbox: wrote %q, want err overloaded for p-1", gc.out[head:])
	}
	if s.Stats.InboxFull.Load() != 1 || s.Stats.Overloaded.Load() != 1 || s.Stats.Publishes.Load() != 0 {
		t.Fatalf("counters: inbox_full %d overloaded %d publishes %d; want 1 1 0",
			s.Stats.InboxFull.Load(), s.Stats.Overloaded.Load(), s.Stats.Publishes.Load())
	}
}

// TestInboxOverflowRepairedOverSockets: a loop stalled while a room's
// messages keep coming takes InboxLimit of them into its inbox; the rest
// reach the member from the store, in order, each once.
func TestInboxOverflowRepairedOverSockets(t *testing.T) {
	n := startNode(t, func(c *Config) { c.Loops = 1; c.InboxLimit = 16 })
	alice := n.dial(t, "alice")
	alice.send(`{"op":"join","room":"r"}`)
	alice.expect(map[string]any{"op": "joined", "room": "r"})

	l := n.srv.loops[0].Load()
	release := make(chan struct{})
	stalled := make(chan struct{})
	if err := l.el.Execute(context.Background(), gnet.RunnableFunc(func(context.Context) error {
		close(stalled)
		<-release
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	<-stalled
	// Commit, encode and broadcast as the publish path does, while the loop
	// is stalled.
	const total = 60
	key := proto.RoomKey("test", "r")
	for i := 1; i <= total; i++ {
		req := &proto.PubRequest{Key: key, From: "bob", ID: []byte("m-" + strconv.Itoa(i)), Body: []byte(strconv.Itoa(i))}
		res := make([]proto.PubResult, 1)
		if err := n.store.CommitBatch(context.Background(), []*proto.PubRequest{req}, res); err != nil || res[0].Err != nil {
			t.Fatalf("commit %d: %v %v", i, err, res[0].Err)
		}
		frame := proto.AppendMsgFrame(nil, "r", res[0].Seq, req.ID, req.From, res[0].TS, req.Body)
		n.fan.OnMessage(key, res[0].Seq, frame) // as the broker delivers it
	}
	close(release)
	for i := 1; i <= total; i++ {
		alice.expect(map[string]any{"op": "msg", "room": "r", "seq": i, "id": fmt.Sprintf("m-%d", i)})
	}
	if got := n.srv.Stats.InboxOverflow.Load(); got < total-16 {
		t.Fatalf("overflow counted %d, want at least %d", got, total-16)
	}
	// Nothing more: each message once.
	alice.send(`{"op":"ping"}`)
	alice.expect(map[string]any{"op": "pong"})
}

// TestInboxAllocationFree: a delivery through the bounded inbox, its drain
// and the write at once allocate nothing in steady state (under the limit).
func TestInboxAllocationFree(t *testing.T) {
	rig := newFanoutRig(t, 300, false)
	l, s := rig.l, rig.l.srv
	s.cfg.FlushInterval = time.Second
	cycle := func() {
		for i := 0; i < 4; i++ {
			rig.seq++
			s.fan.OnMessage(rig.key, rig.seq, rig.frame)
		}
		rig.el.pending.Store(false)
		_ = l.drain(context.Background())
		l.tick() // writes nothing, twice: stops ticking, so the next
		l.tick() // cycle writes at once
	}
	cycle()
	if n := testing.AllocsPerRun(20, cycle); n != 0 {
		t.Fatalf("delivery through the inbox allocates %.1f per cycle", n)
	}
	if got, want := s.Stats.FramesOut.Load(), uint64(300*4*22); got != want {
		t.Fatalf("%d frames written, want %d: the cycle did not fan out", got, want)
	}
}
