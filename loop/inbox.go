package loop

import (
	"context"

	"github.com/roost-chat/roost/fanout"
)

// push hands t to the loop, whatever the inbox holds. Any goroutine.
func (l *loopState) push(t task) {
	l.mu.Lock()
	l.queue = append(l.queue, t)
	l.depth.Store(int64(len(l.queue)))
	l.wakeLocked()
}

// pushDelivery hands a room's message to the loop, or, with the inbox
// full, marks the room for a read from the store. Any goroutine.
func (l *loopState) pushDelivery(key string, ev fanout.Event) {
	l.mu.Lock()
	if len(l.queue) >= l.srv.cfg.InboxLimit {
		if l.lost == nil {
			l.lost = make(map[string]struct{})
		}
		l.lost[key] = struct{}{}
		l.mu.Unlock()
		l.srv.Stats.InboxOverflow.Add(1)
		return // the queue is not empty: the loop is awake already
	}
	l.queue = append(l.queue, task{kind: tFanout, ev: ev})
	l.depth.Store(int64(len(l.queue)))
	l.wakeLocked()
}

// inboxFull reports whether new publishes should be refused: the loop is
// InboxLimit tasks behind. Loop only (reads a mirror, no lock).
func (l *loopState) inboxFull() bool {
	return l.depth.Load() >= int64(l.srv.cfg.InboxLimit)
}

// wakeLocked unlocks l.mu and wakes the loop if it was not woken yet.
func (l *loopState) wakeLocked() {
	wake := !l.woken
	l.woken = true
	l.mu.Unlock()
	if wake {
		// One Execute (an eventfd write and one closure inside gnet) per
		// batch, never per frame.
		if err := l.el.Execute(context.Background(), l.drainF); err != nil {
			l.mu.Lock()
			l.woken = false
			l.mu.Unlock()
		}
	}
}

// drain runs on the loop: it takes every queued task and runs them.
func (l *loopState) drain(context.Context) error {
	l.mu.Lock()
	q := l.queue
	l.queue = l.spare
	l.woken = false
	l.depth.Store(0)
	var lost map[string]struct{}
	if len(l.lost) > 0 {
		lost = l.lost
		l.lost = l.lostSpare
		l.lostSpare = nil
	}
	l.mu.Unlock()
	l.srv.Stats.InboxDepth[l.idx].Store(int64(len(q)))
	for i := range q {
		l.run(&q[i])
		l.settle()
	}
	clear(q)
	l.spare = q[:0]
	if lost != nil {
		// What overflowed the inbox is read from the store.
		l.table.Lost(lost)
		clear(lost)
		l.mu.Lock()
		if l.lostSpare == nil {
			l.lostSpare = lost
		}
		l.mu.Unlock()
	}
	l.kick()
	return nil
}

// settle runs after each unit of loop work: slow consumers are closed,
// and a member past flushAt is written now (bounding the memory and the
// latency one wake-up can build up).
func (l *loopState) settle() {
	if l.q.HasSlow() {
		l.table.CloseSlow()
	}
	if u := l.q.TakeUrgent(); len(u) > 0 {
		l.flushMembers(u)
	}
}
