package loop

import (
	"fmt"
	"strings"
	"testing"
)

// Messages that change, over the wire on one node (memory) and on two
// nodes sharing PostgreSQL and Redis: the rules as err frames, each change
// delivered in order with kind and ref, a second react acked with the
// standing seq and delivered to no one, folded history, resume, unread.
func TestKindsWire(t *testing.T) {
	n := startNode(t, nil)
	testKindsWire(t, n, n)
}

func TestKindsWirePostgres(t *testing.T) {
	a, b, _, _ := pgRedisNodes(t)
	testKindsWire(t, a, b)
}

func testKindsWire(t *testing.T, a, b *node) {
	alice, bob := a.dial(t, "alice"), b.dial(t, "bob")
	bob.send(`{"op":"join","room":"k"}`)
	bob.expect(map[string]any{"op": "joined", "seq": 0})
	alice.send(`{"op":"pub","room":"other","id":"o1","body":1}`)
	alice.skipTo("ack")
	alice.send(`{"op":"pub","room":"k","id":"m1","body":"hello"}`)
	alice.expect(map[string]any{"op": "ack", "seq": 1})
	m := bob.expect(map[string]any{"op": "msg", "seq": 1, "body": "hello"})
	if _, ok := m["kind"]; ok {
		t.Fatalf("a plain message names a kind: %v", m)
	}

	// Rules and bad input: each a clear err, nothing stored.
	for _, tc := range []struct{ frame, code, id string }{
		{`{"op":"pub","room":"k","id":"x1","kind":"edit","ref":1,"body":"mine now"}`, "forbidden", "x1"},
		{`{"op":"pub","room":"k","id":"x2","kind":"delete","ref":1}`, "forbidden", "x2"},
		{`{"op":"pub","room":"k","id":"x3","kind":"react","ref":9,"body":"👍"}`, "not_found", "x3"},
		{`{"op":"pub","room":"k","id":"x4","kind":"react","ref":1,"body":""}`, "bad_request", "x4"},
		{`{"op":"pub","room":"k","id":"x5","kind":"react","ref":1,"body":"` + strings.Repeat("y", 33) + `"}`, "bad_request", "x5"},
		{`{"op":"pub","room":"k","id":"x6","kind":"react","ref":1,"body":{"r":1}}`, "bad_request", "x6"},
		{`{"op":"pub","room":"k","id":"x7","kind":"poke","ref":1,"body":"x"}`, "bad_request", "x7"},
		{`{"op":"pub","room":"k","id":"x8","ref":1,"body":"x"}`, "bad_request", "x8"},
		{`{"op":"pub","room":"k","id":"x9","kind":"edit","ref":1}`, "bad_request", "x9"},
	} {
		bob.send(tc.frame)
		bob.expect(map[string]any{"op": "err", "code": tc.code, "ref": tc.id})
	}
	// A ref of another room: seq 1 of "other" is not a message of "k"...
	alice.send(`{"op":"pub","room":"other","id":"o2","body":2}`)
	alice.skipTo("ack")
	alice.send(`{"op":"pub","room":"k","id":"x10","kind":"edit","ref":2,"body":"x"}`)
	alice.expect(map[string]any{"op": "err", "code": "not_found", "ref": "x10"})

	alice.send(`{"op":"pub","room":"k","id":"e1","kind":"edit","ref":1,"body":"hello!"}`)
	alice.expect(map[string]any{"op": "ack", "seq": 2})
	bob.expect(map[string]any{"op": "msg", "seq": 2, "kind": "edit", "ref": 1, "body": "hello!", "from": "alice"})
	// ...nor is an edit.
	alice.send(`{"op":"pub","room":"k","id":"x11","kind":"edit","ref":2,"body":"x"}`)
	alice.expect(map[string]any{"op": "err", "code": "not_found", "ref": "x11"})

	bob.send(`{"op":"pub","room":"k","id":"r1","kind":"react","ref":1,"body":"👍"}`)
	// Its own msg and its ack, in either order (two nodes: the broker).
	for got := 0; got < 2; got++ {
		f := bob.recv()
		switch {
		case f["op"] == "msg" && f["seq"] == float64(3) && f["kind"] == "react" && f["ref"] == float64(1) && f["body"] == "👍":
		case f["op"] == "ack" && f["id"] == "r1" && f["seq"] == float64(3):
		default:
			t.Fatalf("after r1: %v", f)
		}
	}
	bob.send(`{"op":"pub","room":"k","id":"r2","kind":"react","ref":1,"body":"\ud83d\udc4d"}`)
	bob.expect(map[string]any{"op": "ack", "id": "r2", "seq": 3}) // stands: nothing stored, nothing delivered
	bob.send(`{"op":"pub","room":"k","id":"u0","kind":"unreact","ref":1,"body":"🎉"}`)
	bob.expect(map[string]any{"op": "ack", "id": "u0", "seq": 1}) // nothing to remove
	alice.send(`{"op":"pub","room":"k","id":"m2","body":"second"}`)
	alice.expect(map[string]any{"op": "ack", "seq": 4})
	bob.expect(map[string]any{"op": "msg", "seq": 4, "body": "second"})
	alice.send(`{"op":"pub","room":"k","id":"d1","kind":"delete","ref":1}`)
	alice.expect(map[string]any{"op": "ack", "seq": 5})
	d := bob.expect(map[string]any{"op": "msg", "seq": 5, "kind": "delete", "ref": 1})
	if v, ok := d["body"]; !ok || v != nil {
		t.Fatalf("a delete's body is null: %v", d)
	}
	bob.send(`{"op":"pub","room":"k","id":"x12","kind":"react","ref":1,"body":"👍"}`)
	bob.expect(map[string]any{"op": "err", "code": "not_found", "ref": "x12"})

	// Folded history: the messages as they stand.
	carol := b.dial(t, "carol")
	carol.send(`{"op":"history","room":"k","fold":true}`)
	h := carol.skipTo("history")
	msgs, _ := h["messages"].([]any)
	if len(msgs) != 2 {
		t.Fatalf("folded %v", h)
	}
	first, second := msgs[0].(map[string]any), msgs[1].(map[string]any)
	if first["seq"] != float64(1) || first["deleted"] != true || first["body"] != nil || first["edited"] == nil ||
		first["reactions"].(map[string]any)["👍"] != float64(1) || second["seq"] != float64(4) || second["body"] != "second" {
		t.Fatalf("folded %v", msgs)
	}
	carol.send(`{"op":"history","room":"k","fold":true,"after":1,"limit":5}`)
	h = carol.skipTo("history")
	if msgs, _ := h["messages"].([]any); len(msgs) != 1 || msgs[0].(map[string]any)["seq"] != float64(4) {
		t.Fatalf("folded after 1: %v", h)
	}
	// Resume carries the changes in order, kinds and refs with them.
	carol.send(`{"op":"join","room":"k","since":0}`)
	carol.expect(map[string]any{"op": "joined", "seq": 5})
	for i, want := range []string{"msg:0", "edit:1", "react:1", "msg:0", "delete:1"} {
		f := carol.expect(map[string]any{"op": "msg", "seq": i + 1})
		kind, _ := f["kind"].(string)
		if kind == "" {
			kind = "msg"
		}
		if got := fmt.Sprintf("%s:%d", kind, num(f["ref"])); got != want {
			t.Fatalf("resumed seq %d: %s, want %s", i+1, got, want)
		}
	}
	// Unread counts messages only: 2 of the 5 entries.
	carol.send(`{"op":"unread","rooms":["k"]}`)
	if got := string(carol.recvRaw()); got != `{"op":"unread","rooms":{"k":{"read":0,"seq":5,"count":2}}}` {
		t.Fatal(got)
	}
	carol.send(`{"op":"read","room":"k","seq":3}`)
	carol.skipTo("read")
	carol.send(`{"op":"unread","rooms":["k"]}`)
	if got := string(carol.recvRaw()); got != `{"op":"unread","rooms":{"k":{"read":3,"seq":5,"count":1}}}` {
		t.Fatal(got)
	}
}

// SSE carries the changes as the WebSocket does, byte for byte, and a
// stream resumed with Last-Event-ID replays them in order.
func TestKindsSSE(t *testing.T) {
	n := startNode(t, nil)
	ws := n.dial(t, "alice")
	ws.send(`{"op":"join","room":"k"}`)
	ws.expect(map[string]any{"op": "joined"})
	s := n.sse(t, "user=bob&app=test&room=k")
	s.expect("joined")
	pub := n.dial(t, "carol")
	for _, f := range []string{
		`{"op":"pub","room":"k","id":"m","body":"hi"}`,
		`{"op":"pub","room":"k","id":"e","kind":"edit","ref":1,"body":"hi!"}`,
		`{"op":"pub","room":"k","id":"r","kind":"react","ref":1,"body":"👍"}`,
		`{"op":"pub","room":"k","id":"d","kind":"delete","ref":1}`,
	} {
		pub.send(f)
		pub.skipTo("ack")
	}
	var frames []string
	for range 4 {
		want := string(ws.recvRaw())
		ev := s.expect("msg")
		if ev.data != want {
			t.Fatalf("sse data %q, want the websocket frame %q", ev.data, want)
		}
		frames = append(frames, want)
	}
	if !strings.Contains(frames[1], `"kind":"edit","ref":1,"body":"hi!"}`) || !strings.Contains(frames[3], `"kind":"delete","ref":1,"body":null}`) {
		t.Fatalf("frames %q", frames)
	}
	r := n.sse(t, "user=bob&app=test&room=k", "Last-Event-ID: k:1")
	r.expect("joined")
	for i := 1; i < 4; i++ {
		if ev := r.expect("msg"); ev.data != frames[i] {
			t.Fatalf("resumed %q, want %q", ev.data, frames[i])
		}
	}
}
