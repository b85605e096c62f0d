package loop

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/roost-chat/roost/proto"
)

// The cluster-wide connection limit, the node's side. Admission compares
// the app's connections here plus the other nodes' (as last shared) with
// the limit, so nodes admitting at once can overshoot by what the others
// admitted since their last share; main then asks each node to close its
// share of the excess, newest first (ShedNewest).

// connLimitReason is the close reason of a connection over the app's limit,
// the same as a refusal at the upgrade.
var connLimitReason = []byte("connection limit")

// AppMaxConns is the app's cluster-wide connection limit (0: none, or an
// app this node does not know). Any goroutine.
func (s *Server) AppMaxConns(app string) int64 {
	p := s.apps.lookup([]byte(app))
	if p == nil {
		return 0
	}
	if cfg := p.cfg.Load(); cfg != nil {
		return cfg.MaxConns
	}
	return 0
}

// shedRound is one ShedNewest call as the loops see it: a first pass has
// each loop list when its admitted connections of the app opened (newest
// first, at most k); the second has loop i close its close[i] newest.
type shedRound struct {
	app    string
	k      int
	opened [][]int64 // by loop index, first pass
	close  []int     // by loop index, second pass; nil in the first
	closed atomic.Int64
	wg     sync.WaitGroup
}

// ShedNewest closes the k newest admitted connections (WebSocket and SSE)
// of app on this node with 1008 `connection limit`, whichever loops hold
// them, and returns how many it closed. Each closed connection stops
// counting against the app at once, not when its close handshake ends.
// It waits for the loops at most wait per pass; a loop late for the first
// pass closes nothing. Any goroutine but a loop's.
func (s *Server) ShedNewest(app string, k int, wait time.Duration) int {
	if k <= 0 || s.apps.lookup([]byte(app)) == nil {
		return 0
	}
	n := int(s.nloops.Load())
	r := &shedRound{app: app, k: k, opened: make([][]int64, n)}
	if !s.shedPass(r, n, wait) {
		return 0
	}
	// The k newest over every loop; ties go to the lower loop, the same
	// on every call.
	type at struct {
		ms   int64
		loop int
	}
	var all []at
	for i, o := range r.opened {
		for _, ms := range o {
			all = append(all, at{ms, i})
		}
	}
	slices.SortStableFunc(all, func(a, b at) int {
		if c := cmp.Compare(b.ms, a.ms); c != 0 {
			return c
		}
		return cmp.Compare(a.loop, b.loop)
	})
	r.close = make([]int, n)
	for _, a := range all[:min(k, len(all))] {
		r.close[a.loop]++
	}
	s.shedPass(r, n, wait)
	return int(r.closed.Load()) // a loop late for the pass still closes; not counted
}

// shedPass runs one pass of r on every loop and waits for them, at most
// wait; it reports whether all answered.
func (s *Server) shedPass(r *shedRound, n int, wait time.Duration) bool {
	r.wg = sync.WaitGroup{}
	r.wg.Add(n)
	for i := 0; i < n; i++ {
		s.loops[i].Load().push(task{kind: tShed, shed: r})
	}
	done := make(chan struct{})
	go func() { r.wg.Wait(); close(done) }()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	case <-s.stopped:
		return false
	}
}

// shed runs this loop's part of a ShedNewest pass. Loop only.
func (l *loopState) shed(r *shedRound) {
	defer r.wg.Done()
	var mine []*conn
	for i := len(l.conns) - 1; i >= 0; i-- {
		c := l.conns[i]
		if !c.closed && c.state == stateOpen && c.au != nil && c.app != nil && c.app.id == r.app {
			mine = append(mine, c)
		}
	}
	// Newest first; within one opening millisecond, the later in l.conns
	// (appended at accept; a close moves only the last one): walked
	// backwards, and the sort is stable.
	slices.SortStableFunc(mine, func(a, b *conn) int { return cmp.Compare(b.opened, a.opened) })
	if r.close == nil {
		o := make([]int64, 0, min(r.k, len(mine)))
		for _, c := range mine[:min(r.k, len(mine))] {
			o = append(o, c.opened)
		}
		r.opened[l.idx] = o
		return
	}
	for _, c := range mine[:min(r.close[l.idx], len(mine))] {
		// Released now: the node's next share says the count without
		// those still finishing their close handshake.
		c.app.releaseConn(c)
		c.app.refused[RefusedConnLimit].Add(1)
		c.closeWith(proto.ClosePolicy, connLimitReason)
		r.closed.Add(1)
	}
}
