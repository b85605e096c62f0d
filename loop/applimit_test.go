package loop

import (
	"fmt"
	"testing"
	"time"
)

// TestShedNewest: the k newest admitted connections of the app, over every
// loop, are closed with 1008 "connection limit" and stop counting at once;
// the older ones and other apps' stay. SSE streams count and end alike.
func TestShedNewest(t *testing.T) {
	n := startNode(t, func(c *Config) { c.Loops = 2 })
	other := n.dialQuery(t, "user=x&app=other")
	other.send(`{"op":"ping"}`)
	other.expect(map[string]any{"op": "pong"})
	var cs []*client
	for i := 0; i < 6; i++ {
		c := n.dial(t, fmt.Sprintf("u%d", i))
		c.send(`{"op":"ping"}`)
		c.expect(map[string]any{"op": "pong"})
		cs = append(cs, c)
		time.Sleep(3 * time.Millisecond) // each its own opening millisecond
	}
	appConns := func(app string) int64 {
		var got int64
		n.srv.AppConns(func(a string, c int64) {
			if a == app {
				got = c
			}
		})
		return got
	}
	if got := n.srv.ShedNewest("test", 2, time.Second); got != 2 {
		t.Fatalf("ShedNewest closed %d, want 2", got)
	}
	if c := appConns("test"); c != 4 {
		t.Fatalf("the app counts %d connections right after, want 4", c)
	}
	for _, c := range cs[4:] {
		if r := c.expectClose(1008); r != "connection limit" {
			t.Fatalf("closed with %q", r)
		}
	}
	for _, c := range append(cs[:4:4], other) {
		c.send(`{"op":"ping"}`)
		c.expect(map[string]any{"op": "pong"})
	}
	if got := n.srv.ShedNewest("test", 0, time.Second) + n.srv.ShedNewest("nope", 3, time.Second); got != 0 {
		t.Fatalf("closed %d for nothing", got)
	}
	// An SSE stream counts like a socket: the newest now, it ends.
	time.Sleep(3 * time.Millisecond)
	st := n.sse(t, "room=r&user=s&app=test")
	st.expect("joined")
	if got := n.srv.ShedNewest("test", 1, time.Second); got != 1 {
		t.Fatalf("ShedNewest(1) closed %d", got)
	}
	st.expectEnd()
	if c := appConns("test"); c != 4 {
		t.Fatalf("the app counts %d connections after its stream ended, want 4", c)
	}
	if got := n.srv.ShedNewest("test", 10, time.Second); got != 4 {
		t.Fatalf("ShedNewest(10) of 4 closed %d", got)
	}
}
