package loop

import (
	"fmt"
	"testing"
)

// TestJoinSinceAhead: a client that saw newer messages on another node than
// have reached this one rejoins here with since past the room's newest seq.
// It must get only what comes after since: the messages it already has
// must not be delivered again when they reach this node. (A Redis-delivered
// message that lagged behind the client's rejoin was delivered twice.)
func TestJoinSinceAhead(t *testing.T) {
	n := startNode(t, func(c *Config) { c.Loops = 1 })
	p := n.dial(t, "pub")
	pub := func(i int) {
		p.send(fmt.Sprintf(`{"op":"pub","room":"r","id":"m%d","body":%d}`, i, i))
		p.expect(map[string]any{"op": "ack", "id": fmt.Sprintf("m%d", i), "seq": i})
	}
	w := n.dial(t, "watcher") // keeps the room live on the loop
	w.send(`{"op":"join","room":"r"}`)
	w.expect(map[string]any{"op": "joined", "seq": 0})
	for i := 1; i <= 5; i++ {
		pub(i)
		w.expect(map[string]any{"op": "msg", "seq": i})
	}
	a := n.dial(t, "ahead")
	a.send(`{"op":"join","room":"r","since":7}`)
	a.expect(map[string]any{"op": "joined", "room": "r", "seq": 5})
	for i := 6; i <= 8; i++ {
		pub(i)
		w.expect(map[string]any{"op": "msg", "seq": i})
	}
	// 6 and 7 it has; 8 is the first it gets, and nothing before it
	a.expect(map[string]any{"op": "msg", "seq": 8})
	pub(9)
	a.expect(map[string]any{"op": "msg", "seq": 9})
	// it is a member like any other: leave answers left
	a.send(`{"op":"leave","room":"r"}`)
	a.expect(map[string]any{"op": "left", "room": "r"})
}
