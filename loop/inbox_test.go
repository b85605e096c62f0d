package loop

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bytedance/sonic"
	"github.com/gobwas/ws"
	"github.com/panjf2000/gnet/v2"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
	"github.com/roost-chat/roost/proto/prototest"
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
		req := &persist.Row{Key: rig.key, From: "bob", ID: []byte("m-" + strconv.Itoa(i)), Body: []byte(strconv.Itoa(i))}
		if err := rig.store.CommitBatch(context.Background(), []*persist.Row{req}); err != nil || req.Err != nil || req.Seq != uint64(i) {
			t.Fatalf("commit %d: %v %+v", i, err, req.Stored)
		}
		frames[i] = proto.AppendMsgFrame(nil, "room", req.Seq, req.ID, req.From, req.TS, req.Body)
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
	// What the member got: the queued deliveries at once, then the
	// room's tail from the store, the rest, in order.
	var got []byte
	buf := make([]byte, 64<<10)
	peer := rig.peers[0]
	read := func() {
		l.flush()
		_ = peer.SetReadDeadline(time.Now().Add(5 * time.Millisecond))
		n, _ := peer.Read(buf)
		got = append(got, buf[:n]...)
	}
	read()
	if !bytes.Contains(got, []byte(`"seq":16,`)) {
		t.Fatalf("after the drain the member has %q, want up to seq 16 (the queued deliveries)", got)
	}
	rig.pump(t, func() bool { read(); return bytes.Contains(got, []byte(`"seq":`+strconv.Itoa(total)+`,`)) })
	l.flush()
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
	gc, l := upgradedMemConn(t, s, el)
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

	release := stallLoop(t, n.srv.loops[0].Load())
	// Commit, encode and broadcast as the publish path does, while the loop
	// is stalled.
	const total = 60
	key := proto.RoomKey("test", "r")
	for i := 1; i <= total; i++ {
		n.commitAndDeliver(t, key, i, []byte(strconv.Itoa(i)))
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
	cycles := 0
	cycle := func() {
		cycles++
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
	if n := leastAllocs(20, cycle); n != 0 {
		t.Fatalf("delivery through the inbox allocates %.1f per cycle", n)
	}
	if got, want := s.Stats.FramesOut.Load(), uint64(300*4*cycles); got != want {
		t.Fatalf("%d frames written, want %d: the cycle did not fan out", got, want)
	}
}

// TestLongRepairToSlowReader: a repair far larger than the outbound limit
// (3,000 messages of 16 KB that overflowed a stalled loop's inbox, read
// back from the store) reaches a member that reads slowly, every seq in
// order, and never makes it a slow consumer: the repair's steps are paced
// by what the members have taken, as a catch-up is.
func TestLongRepairToSlowReader(t *testing.T) {
	const total = 3000
	n, slow := overflowRoom(t, 5000, total, 16<<10)
	// About 16 MB/s: 48 MB take some 3 s, while the store reads far faster.
	for seq := 1; seq <= total; seq++ {
		if m := slow.nextMsg(t, n); m.Op != "msg" || m.Seq != seq {
			t.Fatalf("at seq %d: %+v (slow closes %d)", seq, m, n.fan.Stats.SlowCloses.Load())
		}
		if seq%16 == 0 {
			time.Sleep(16 * time.Millisecond)
		}
	}
	if got := n.fan.Stats.SlowCloses.Load(); got != 0 {
		t.Fatalf("%d slow-consumer closes during the repair", got)
	}
	if got := n.srv.Stats.InboxOverflow.Load(); got < total-16 {
		t.Fatalf("overflow counted %d, want at least %d", got, total-16)
	}
}

// TestRepairPastTheStoreCloses: when the messages a repair needs are gone
// from the store too (here: the memory store keeps 1,000 of the 3,000 that
// overflowed), the member is closed with 1013 at once instead of waiting
// for ever while the same step is read again and again, and its rejoin is
// told recovered:false from the oldest kept seq.
func TestRepairPastTheStoreCloses(t *testing.T) {
	const total, keep = 3000, 1000
	n, slow := overflowRoom(t, keep, total, 16<<10)
	// What the inbox held (16) arrives in order, then the close 1013. The
	// close drops what was still queued in the node for the member, so
	// how many of the 16 got out first depends on how far the kernel had
	// taken them (256 KB of frames): any prefix, never a gap.
	got := 0
	m := slow.nextMsg(t, n)
	for ; m.Op == "msg"; m = slow.nextMsg(t, n) {
		if got++; m.Seq != got || got > 16 {
			t.Fatalf("message %d: %+v, want seq %d of the 16 the inbox held", got, m, got)
		}
	}
	if m.Op != "close" || m.Code != proto.CloseTryAgain {
		t.Fatalf("after seq %d: %+v, want the close 1013", got, m)
	}
	if got := n.fan.Stats.GapCloses.Load(); got != 1 {
		t.Fatalf("gap closes %d, want 1", got)
	}
	c := n.dial(t, "back")
	c.send(`{"op":"join","room":"r","since":` + strconv.Itoa(got) + `}`)
	c.expect(map[string]any{"op": "joined", "recovered": false, "from": total - keep + 1})
	for seq := total - keep + 1; seq <= total; seq++ {
		if m := c.nextMsg(t, n); m.Op != "msg" || m.Seq != seq {
			t.Fatalf("rejoin at seq %d: %+v", seq, m)
		}
	}
}

// overflowRoom joins a member to room r of a one-loop node on a memory
// store keeping keep messages per room, stalls the loop, commits total
// messages of size-byte bodies and hands each to the node as the broker
// does: all but InboxLimit of them overflow the inbox, and the loop, once
// released, reads the rest from the store.
func overflowRoom(t *testing.T, keep, total, size int) (*node, *client) {
	t.Helper()
	cfg := testConfig()
	cfg.Loops, cfg.InboxLimit = 1, 16
	n := startNodeWith(t, cfg, persist.NewMemory(keep), testLogger(), nil)
	c := n.dial(t, "slow")
	c.send(`{"op":"join","room":"r"}`)
	c.expect(map[string]any{"op": "joined", "room": "r"})
	release := stallLoop(t, n.srv.loops[0].Load())
	key := proto.RoomKey("test", "r")
	body := []byte(`"` + strings.Repeat("b", size) + `"`)
	for i := 1; i <= total; i++ {
		n.commitAndDeliver(t, key, i, body)
	}
	close(release)
	return n, c
}

// upgradedMemConn opens a connection on s's loop and upgrades it,
// reading fuzzUpgrade through OnTraffic.
func upgradedMemConn(t *testing.T, s *Server, el *memLoop) (*memConn, *loopState) {
	t.Helper()
	gc := &memConn{el: el}
	s.OnOpen(gc)
	l := s.loops[0].Load()
	t.Cleanup(l.stopTimers)
	gc.in = append(gc.in, fuzzUpgrade...)
	s.OnTraffic(gc)
	return gc, l
}

// stallLoop blocks l's event loop until the returned channel is closed.
func stallLoop(t *testing.T, l *loopState) (release chan struct{}) {
	t.Helper()
	release = make(chan struct{})
	stalled := make(chan struct{})
	if err := l.el.Execute(context.Background(), gnet.RunnableFunc(func(context.Context) error {
		close(stalled)
		<-release
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	<-stalled
	return release
}

// commitAndDeliver commits bob's message m-i of room key (in room "r") and
// hands it to the node as the broker delivers it.
func (n *node) commitAndDeliver(t *testing.T, key string, i int, body []byte) {
	t.Helper()
	req := &persist.Row{Key: key, From: "bob", ID: []byte("m-" + strconv.Itoa(i)), Body: body}
	if err := n.store.CommitBatch(context.Background(), []*persist.Row{req}); err != nil || req.Err != nil {
		t.Fatalf("commit %d: %v %v", i, err, req.Err)
	}
	n.fan.OnMessage(key, req.Seq, proto.AppendMsgFrame(nil, "r", req.Seq, req.ID, req.From, req.TS, req.Body))
}

type wireMsg struct {
	Op   string
	Seq  int
	Code int // a close frame's code (Op "close")
}

// nextMsg reads c's next msg frame or close frame (skipping the node's
// pings) within 5 s.
func (c *client) nextMsg(t *testing.T, n *node) wireMsg {
	t.Helper()
	for {
		_ = c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		f, err := prototest.ReadFrame(c.rd)
		if err != nil {
			t.Fatalf("read: %v (slow closes %d, gap closes %d)", err, n.fan.Stats.SlowCloses.Load(), n.fan.Stats.GapCloses.Load())
		}
		switch f.Op {
		case ws.OpPing:
			continue
		case ws.OpClose:
			if len(f.Data) < 2 {
				return wireMsg{Op: "close"}
			}
			return wireMsg{Op: "close", Code: int(f.Data[0])<<8 | int(f.Data[1])}
		}
		var m wireMsg
		if f.Op != ws.OpText || sonic.Unmarshal(f.Data, &m) != nil {
			t.Fatalf("frame %v %.120q", f.Op, f.Data)
		}
		return m
	}
}

// TestRefusedPublishNamesItsID: a publish the publish path cannot take
// (its queue full, or closed) is answered err overloaded with the
// publish's id, so the client can send it again. The capacity run's burst
// had 44,129 refusals answered with an empty ref, none of them retried:
// the request went back to the pool, which empties its ID, before the
// answer was written.
func TestRefusedPublishNamesItsID(t *testing.T) {
	s, el := fuzzNode(t)
	gc, _ := upgradedMemConn(t, s, el)
	_ = s.fan.Close() // its pool refuses every publish from now on
	head := len(gc.out)
	gc.in = append(gc.in, clientFrame(ws.OpText, true, []byte(`{"op":"pub","room":"r","id":"p-7","body":1}`))...)
	s.OnTraffic(gc)
	if !bytes.Contains(gc.out[head:], []byte(`"op":"err","ref":"p-7","code":"overloaded"`)) {
		t.Fatalf("publish refused by the publish path: wrote %q, want err overloaded for p-7", gc.out[head:])
	}
	if s.Stats.Overloaded.Load() != 1 {
		t.Fatalf("overloaded counted %d, want 1", s.Stats.Overloaded.Load())
	}
}
