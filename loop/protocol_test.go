package loop

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gobwas/ws"
)

// Conformance with every row of docs/protocol.md, over real sockets.

func TestJoinPubAckDeliver(t *testing.T) {
	n := startNode(t, nil)
	alice, bob := n.dial(t, "alice"), n.dial(t, "bob")
	alice.send(`{"op":"join","room":"lobby"}`)
	alice.expect(map[string]any{"op": "joined", "room": "lobby", "seq": 0})
	bob.send(`{"op":"join","room":"lobby"}`)
	bob.expect(map[string]any{"op": "joined", "room": "lobby", "seq": 0})

	// The body is delivered byte for byte: odd spacing, escapes and number
	// spellings survive.
	body := `{ "text" : "h\u00e9llo\n", "n": 1.50e+2, "neg": -0.0, "arr":[1 ,2] }`
	for i := 1; i <= 3; i++ {
		bob.send(fmt.Sprintf(`{"op":"pub","room":"lobby","id":"m-%d","body":%s}`, i, body))
		got := bob.recv()
		if got["op"] == "msg" { // the publisher is a member too: msg and ack in either order
			got = bob.recv()
		}
		if got["op"] != "ack" || got["id"] != fmt.Sprintf("m-%d", i) || num(got["seq"]) != uint64(i) || got["room"] != "lobby" {
			t.Fatalf("ack %d: %v", i, got)
		}
	}
	for i := 1; i <= 3; i++ {
		raw := alice.recvRaw()
		want := fmt.Sprintf(`"seq":%d,"id":"m-%d","from":"bob","ts":`, i, i)
		if !bytes.Contains(raw, []byte(want)) || !bytes.HasSuffix(raw, []byte(`"body":`+body+`}`)) ||
			!bytes.HasPrefix(raw, []byte(`{"op":"msg","room":"lobby","seq":`)) {
			t.Fatalf("msg %d: %s", i, raw)
		}
	}
}

func TestIdempotentRepublish(t *testing.T) {
	n := startNode(t, nil)
	pub, sub := n.dial(t, "pub"), n.dial(t, "sub")
	sub.send(`{"op":"join","room":"r"}`)
	sub.expect(map[string]any{"op": "joined"})
	pub.send(`{"op":"pub","room":"r","id":"k1","body":1}`)
	pub.expect(map[string]any{"op": "ack", "id": "k1", "seq": 1})
	pub.send(`{"op":"pub","room":"r","id":"k1","body":1}`)
	pub.expect(map[string]any{"op": "ack", "id": "k1", "seq": 1})
	pub.send(`{"op":"pub","room":"r","id":"k2","body":2}`)
	pub.expect(map[string]any{"op": "ack", "id": "k2", "seq": 2})
	// The receiver sees 1 then 2: the re-publish was not delivered again.
	sub.expect(map[string]any{"op": "msg", "seq": 1, "id": "k1"})
	sub.expect(map[string]any{"op": "msg", "seq": 2, "id": "k2"})
	// Another user may use the same id: it is a different message.
	other := n.dial(t, "other")
	other.send(`{"op":"pub","room":"r","id":"k1","body":3}`)
	other.expect(map[string]any{"op": "ack", "id": "k1", "seq": 3})
}

func TestOrderManyPublishersManyRooms(t *testing.T) {
	n := startNode(t, nil)
	const rooms, pubs, per = 4, 4, 50
	subs := make([]*client, rooms)
	for r := range subs {
		subs[r] = n.dial(t, fmt.Sprintf("sub%d", r))
		subs[r].send(fmt.Sprintf(`{"op":"join","room":"room%d"}`, r))
		subs[r].expect(map[string]any{"op": "joined"})
	}
	var wg sync.WaitGroup
	for p := 0; p < pubs; p++ {
		c := n.dial(t, fmt.Sprintf("pub%d", p))
		wg.Add(1)
		go func(p int, c *client) {
			defer wg.Done()
			for i := 0; i < per; i++ {
				for r := 0; r < rooms; r++ {
					c.send(fmt.Sprintf(`{"op":"pub","room":"room%d","id":"p%d-%d","body":{"p":%d,"i":%d}}`, r, p, i, p, i))
				}
			}
		}(p, c)
	}
	wg.Wait()
	for r, s := range subs {
		lastPer := map[float64]float64{}
		for seq := 1; seq <= pubs*per; seq++ {
			m := s.recv()
			if m["op"] != "msg" || num(m["seq"]) != uint64(seq) {
				t.Fatalf("room %d: want seq %d, got %v", r, seq, m)
			}
			body := m["body"].(map[string]any)
			p, i := body["p"].(float64), body["i"].(float64)
			if prev, ok := lastPer[p]; ok && i != prev+1 {
				t.Fatalf("room %d: publisher %v order broken: %v after %v", r, p, i, prev)
			}
			lastPer[p] = i
		}
	}
}

func TestSinceCatchUpAndHistory(t *testing.T) {
	n := startNode(t, nil)
	pub := n.dial(t, "pub")
	for i := 1; i <= 10; i++ {
		pub.send(fmt.Sprintf(`{"op":"pub","room":"h","id":"m%d","body":%d}`, i, i))
		pub.expect(map[string]any{"op": "ack", "seq": i})
	}
	// since on a room not yet live on the node.
	late := n.dial(t, "late")
	late.send(`{"op":"join","room":"h","since":7}`)
	late.expect(map[string]any{"op": "joined", "seq": 10})
	for seq := 8; seq <= 10; seq++ {
		late.expect(map[string]any{"op": "msg", "seq": seq})
	}
	// since on a room already live; then live messages follow with no gap.
	late2 := n.dial(t, "late2")
	late2.send(`{"op":"join","room":"h","since":0}`)
	late2.expect(map[string]any{"op": "joined", "seq": 10})
	for seq := 1; seq <= 10; seq++ {
		late2.expect(map[string]any{"op": "msg", "seq": seq})
	}
	pub.send(`{"op":"pub","room":"h","id":"m11","body":11}`)
	late.expect(map[string]any{"op": "msg", "seq": 11})
	late2.expect(map[string]any{"op": "msg", "seq": 11})

	pub.send(`{"op":"history","room":"h","before":5,"limit":3}`)
	h := pub.recv()
	for h["op"] == "ack" {
		h = pub.recv()
	}
	msgs, _ := h["messages"].([]any)
	if h["op"] != "history" || h["room"] != "h" || len(msgs) != 3 {
		t.Fatalf("history: %v", h)
	}
	for i, want := range []uint64{2, 3, 4} { // newest last
		if got := num(msgs[i].(map[string]any)["seq"]); got != want {
			t.Fatalf("history[%d] seq %d, want %d", i, got, want)
		}
	}
	pub.send(`{"op":"history","room":"h"}`)
	h = pub.recv()
	for h["op"] == "ack" { // m11's ack may still be on its way
		h = pub.recv()
	}
	if msgs, _ := h["messages"].([]any); len(msgs) != 11 {
		t.Fatalf("history without bounds: %v", h)
	}
}

// A join with since while messages keep flowing: no gap, no duplicate
// between the replay and live delivery.
func TestSinceUnderLoad(t *testing.T) {
	n := startNode(t, nil)
	pub := n.dial(t, "pub")
	keep := n.dial(t, "keep") // keeps the room live on the node
	keep.send(`{"op":"join","room":"busy"}`)
	keep.expect(map[string]any{"op": "joined"})
	const total = 600
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 1; i <= total; i++ {
			pub.send(fmt.Sprintf(`{"op":"pub","room":"busy","id":"m%d","body":%d}`, i, i))
		}
	}()
	time.Sleep(20 * time.Millisecond)
	j := n.dial(t, "joiner")
	j.send(`{"op":"join","room":"busy","since":0}`)
	j.expect(map[string]any{"op": "joined"})
	<-done
	for seq := 1; seq <= total; seq++ {
		j.expect(map[string]any{"op": "msg", "seq": seq})
	}
}

func TestPingLeaveAndErrors(t *testing.T) {
	n := startNode(t, nil)
	c := n.dial(t, "c")
	c.send(`{"op":"ping"}`)
	c.expect(map[string]any{"op": "pong"})
	c.send(`{"op":"join","room":"a"}`)
	c.expect(map[string]any{"op": "joined"})
	c.send(`{"op":"join","room":"a"}`)
	c.expect(map[string]any{"op": "err", "code": "bad_request", "ref": "a"})
	c.send(`{"op":"leave","room":"a"}`)
	c.expect(map[string]any{"op": "left", "room": "a"})
	// After leave nothing of the room arrives.
	p := n.dial(t, "p")
	p.send(`{"op":"pub","room":"a","id":"x","body":null}`)
	p.expect(map[string]any{"op": "ack"})
	c.send(`{"op":"ping"}`)
	c.expect(map[string]any{"op": "pong"})

	for _, tc := range []struct{ in, code, ref string }{
		{`{"op":"dance"}`, "bad_request", ""},
		{`{"room":"a"}`, "bad_request", "a"},
		{`{"op":"join"}`, "bad_request", ""},
		{`{"op":"join","room":"no spaces"}`, "bad_request", ""},
		{`{"op":"pub","room":"a","body":1}`, "bad_request", "a"},
		{`{"op":"pub","room":"a","id":"i1"}`, "bad_request", "i1"},
		{`{"op":"pub","room":"a","id":"` + strings.Repeat("x", 65) + `","body":1}`, "bad_request", ""},
		{`{"op":"history","room":"a","limit":0}`, "bad_request", "a"},
		{`{"op":"join","room":"a","since":-1}`, "bad_request", "a"},
	} {
		c.send(tc.in)
		got := c.expect(map[string]any{"op": "err", "code": tc.code})
		if tc.ref != "" && got["ref"] != tc.ref {
			t.Fatalf("%s: ref %v, want %s", tc.in, got["ref"], tc.ref)
		}
		if msg, _ := got["message"].(string); msg == "" {
			t.Fatalf("%s: err without message", tc.in)
		}
	}
	// Still serving after every error.
	c.send(`{"op":"ping"}`)
	c.expect(map[string]any{"op": "pong"})
}

func TestWebSocketPingPongAndClose(t *testing.T) {
	n := startNode(t, nil)
	conn, rd := n.raw(t, "x")
	c := &client{t: t, conn: conn, rd: rd}
	conn.Write(clientFrame(ws.OpPing, true, []byte("hi")))
	if f := c.next(); f.Op != ws.OpPong || string(f.Data) != "hi" {
		t.Fatalf("want pong hi, got %v %q", f.Op, f.Data)
	}
	conn.Write(clientFrame(ws.OpClose, true, ws.NewCloseFrameBody(ws.StatusNormalClosure, "bye")))
	c.expectClose(1000)
	c.expectEOF()
}

func TestFragmentedMessage(t *testing.T) {
	n := startNode(t, nil)
	conn, rd := n.raw(t, "x")
	c := &client{t: t, conn: conn, rd: rd}
	msg := []byte(`{"op":"join","room":"frag"}`)
	conn.Write(clientFrame(ws.OpText, false, append([]byte(nil), msg[:5]...)))
	conn.Write(clientFrame(ws.OpPing, true, []byte("mid"))) // control frames may interleave
	conn.Write(clientFrame(ws.OpContinuation, false, append([]byte(nil), msg[5:12]...)))
	conn.Write(clientFrame(ws.OpContinuation, true, append([]byte(nil), msg[12:]...)))
	if f := c.next(); f.Op != ws.OpPong || string(f.Data) != "mid" {
		t.Fatalf("want pong, got %v %q", f.Op, f.Data)
	}
	c.expect(map[string]any{"op": "joined", "room": "frag"})
}

// Several frames in one TCP write, and one frame split over many writes.
func TestFramesAnySplit(t *testing.T) {
	n := startNode(t, nil)
	conn, rd := n.raw(t, "x")
	c := &client{t: t, conn: conn, rd: rd}
	var all []byte
	for i := 0; i < 5; i++ {
		all = append(all, clientFrame(ws.OpText, true, []byte(`{"op":"ping"}`))...)
	}
	conn.Write(all)
	for i := 0; i < 5; i++ {
		c.expect(map[string]any{"op": "pong"})
	}
	f := clientFrame(ws.OpText, true, []byte(`{"op":"join","room":"split"}`))
	for i := range f {
		conn.Write(f[i : i+1])
		time.Sleep(time.Millisecond)
	}
	c.expect(map[string]any{"op": "joined", "room": "split"})
}

// Every gnet loop holds a P while it waits in epoll_wait; the node must
// leave one for Go's netpoller, or network clients (pgx, rueidis) wait for
// sysmon (up to 10 ms) on every read.
func TestSpareProcessorForNetpoller(t *testing.T) {
	n := startNode(t, func(c *Config) { c.Loops = runtime.GOMAXPROCS(0) })
	if got := runtime.GOMAXPROCS(0); got <= n.srv.cfg.Loops {
		t.Fatalf("GOMAXPROCS %d with %d loops: no P left for the netpoller", got, n.srv.cfg.Loops)
	}
}
