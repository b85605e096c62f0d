package loop

import (
	"fmt"
	"testing"

	"github.com/roost-chat/roost/persist"
)

// TestJoinSinceAhead: a client that saw newer messages on another node than
// have reached this one rejoins here with since past the room's newest seq
// on this node (but not past the store's: those messages are committed and
// on their way through the broker). It must get only what comes after
// since: the messages it already has must not be delivered again when they
// reach this node. (A Redis-delivered message that lagged behind the
// client's rejoin was delivered twice.)
func TestJoinSinceAhead(t *testing.T) {
	b := &bus{}
	n := startNodeWith(t, func() Config { c := testConfig(); c.Loops = 1; return c }(), persist.NewMemory(1000), testLogger(), b.broker)
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
	b.hold(0) // 6 and 7: committed, still in flight to this node
	pub(6)
	pub(7)
	a := n.dial(t, "ahead")
	a.send(`{"op":"join","room":"r","since":7}`)
	a.expect(map[string]any{"op": "joined", "room": "r", "seq": 5, "recovered": true})
	b.release(0)
	for i := 6; i <= 8; i++ {
		if i == 8 {
			pub(8)
		}
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
