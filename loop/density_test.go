package loop

import (
	"context"
	"testing"
	"time"

	"github.com/panjf2000/gnet/v2"
)

// onLoops runs f on every loop's goroutine in turn, as the loop's own
// code, and waits for each.
func onLoops(t *testing.T, s *Server, f func(l *loopState)) {
	t.Helper()
	for i := 0; i < int(s.nloops.Load()); i++ {
		l := s.loops[i].Load()
		done := make(chan struct{})
		if err := l.el.Execute(context.Background(), gnet.RunnableFunc(func(context.Context) error {
			defer close(done)
			f(l)
			return nil
		})); err != nil {
			t.Fatal(err)
		}
		<-done
	}
}

// An idle joined connection holds no chat state (the signal, read and
// receipts buckets, echo-off rooms): it is made on first use. Its user's
// read positions reach it through the user's record (appUser.ws, more),
// not a per-loop map: the density of docs/benchmarks.md depends on both.
func TestIdleConnNoChatState(t *testing.T) {
	n := startNode(t, nil)
	tabs := []*client{n.dial(t, "alice"), n.dial(t, "alice"), n.dial(t, "alice")}
	bob := n.dial(t, "bob")
	for _, c := range append(tabs, bob) {
		c.send(`{"op":"join","room":"r"}`)
		c.expect(map[string]any{"op": "joined", "room": "r"})
	}
	conns := map[*conn]bool{}
	onLoops(t, n.srv, func(l *loopState) {
		for _, c := range l.conns {
			if c.m.Rooms() != 1 {
				t.Errorf("%s: in %d rooms", c.user, c.m.Rooms())
			}
			if c.m.ChatState() {
				t.Errorf("%s: an idle joined connection has chat state", c.user)
			}
			conns[c] = true
		}
	})
	if len(conns) != 4 {
		t.Fatalf("%d connections on the loops, want 4", len(conns))
	}
	p := n.srv.apps.lookup([]byte("test"))
	users := func() (alice []*conn, known bool) {
		p.mu.Lock()
		defer p.mu.Unlock()
		u := p.users["alice"]
		if u == nil {
			return nil, false
		}
		if u.ws != nil {
			alice = append(alice, u.ws)
		}
		if u.more != nil {
			alice = append(alice, *u.more...)
		}
		return alice, true
	}
	got, _ := users()
	if len(got) != 3 {
		t.Fatalf("alice's index holds %d connections, want 3", len(got))
	}
	// The node posts alice's read positions to the loops holding her
	// tabs, and to those only.
	var want uint64
	for _, c := range got {
		want |= 1 << c.l.idx
	}
	if m := n.srv.loopsOf("test/alice"); m != want {
		t.Fatalf("alice's loops %b, want %b", m, want)
	}
	if m := n.srv.loopsOf("test/nobody") | n.srv.loopsOf("other/alice"); m != 0 {
		t.Fatalf("loops of unknown users %b", m)
	}
	// A read mark from one tab reaches the other two, and makes the
	// marking tab's chat state (its read bucket).
	publish(t, bob, "r", "m", 2)
	for _, c := range tabs {
		c.expect(map[string]any{"op": "msg", "seq": 1})
		c.expect(map[string]any{"op": "msg", "seq": 2})
	}
	tabs[0].send(`{"op":"read","room":"r","seq":2}`)
	for _, c := range tabs {
		c.expect(map[string]any{"op": "read", "room": "r", "seq": 2})
	}
	// Closing tabs takes them out of the index, first the first one.
	for i, c := range tabs {
		_ = c.conn.Close()
		deadline := time.Now().Add(5 * time.Second)
		for {
			got, known := users()
			if len(got) == 2-i && (known || i == 2) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after closing %d tabs, alice's index holds %d", i+1, len(got))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}
