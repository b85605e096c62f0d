package loop

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/roost-chat/roost/proto"
)

// disconnect is one Server.Disconnect call as the loops see it: each loop
// closes the user's connections it holds, adds them to closed and calls
// wg.Done.
type disconnect struct {
	user   string
	closed atomic.Int64
	wg     sync.WaitGroup
}

// disconnectReason is the close reason of Server.Disconnect.
var disconnectReason = []byte("disconnected")

// Disconnect closes every open connection of user of app on this node
// with 1008 "disconnected" and returns how many it closed. It waits for
// the loops, at most wait (a loop that has not answered by then still
// closes its connections; they are not counted). Any goroutine but a
// loop's.
func (s *Server) Disconnect(app, user string, wait time.Duration) int {
	p := s.apps.lookup([]byte(app))
	if p == nil {
		return 0
	}
	// Every open connection was admitted, which counts it in users: a
	// user without an entry has no connection on this node, and no loop
	// need be woken.
	p.mu.Lock()
	u := p.users[user]
	has := u != nil && u.conns > 0
	p.mu.Unlock()
	if !has {
		return 0
	}
	d := &disconnect{user: user}
	n := int(s.nloops.Load())
	d.wg.Add(n)
	for i := 0; i < n; i++ {
		s.loops[i].Load().push(task{kind: tDisconnect, app: app, disc: d})
	}
	done := make(chan struct{})
	go func() { d.wg.Wait(); close(done) }()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
	return int(d.closed.Load())
}

// disconnect closes the connections of d.user of app held by this loop.
// Loop only.
func (l *loopState) disconnect(app string, d *disconnect) {
	defer d.wg.Done()
	for i := 0; i < len(l.conns); i++ {
		c := l.conns[i]
		if c.closed || c.state != stateOpen || c.app == nil || c.app.id != app || c.user != d.user {
			continue
		}
		c.closeWith(proto.ClosePolicy, disconnectReason)
		d.closed.Add(1)
		l.srv.Stats.Disconnected.Add(1)
	}
}
