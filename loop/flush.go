package loop

import (
	"time"

	"github.com/roost-chat/roost/loop/internal/uring"
)

// flushFresh writes the members that got output while not written in this
// tick's period; the others keep their output for the tick. The queue
// sorts members out as they get output, so under load, when the tick wrote
// every member, this costs nothing per wake-up. It spends at most a slice
// of loop time (as a pass does): the fresh members of a quiet room of
// thousands past that are left to the tick, whose pass reads the input
// between slices.
func (l *loopState) flushFresh() {
	f := l.q.TakeFresh()
	var start time.Time
	if len(f) > passCheck {
		start = time.Now()
	}
	for i, m := range f {
		if i > 0 && i%passCheck == 0 {
			l.sendQueued()
			if time.Since(start) >= l.slice {
				return
			}
		}
		if m.Closed() || m.PendingBytes() == 0 || l.q.WroteInPeriod(m) {
			continue
		}
		l.out(m)
	}
	l.sendQueued()
	l.ackWritten()
}

// flush writes every dirty connection's pending frames, one writev each,
// and returns how many connections it wrote. Connections waiting on their
// transport (parked, lingering) and replays waiting for their output to
// leave are seen to as well.
//
// A flush that runs out of its slice of loop time becomes a pass (see
// loopState.pass): it returns with the rest of its members kept, and the
// rest of the work here happens when the pass ends. A flush during a pass
// (a drain round) finishes the pass first.
func (l *loopState) flush() int {
	if l.passing {
		return l.passRest(true)
	}
	ms := l.q.TakeDirty()
	t0 := time.Now()
	n, done := l.writeSlice(ms, l.slice)
	if n > 0 {
		l.wRounds++
		l.wBusy += time.Since(t0)
		l.wBusyW += n
	}
	l.wRoundW = n
	l.wWidest = max(l.wWidest, n)
	if done < len(ms) {
		// TakeDirty's slice is the queue's next dirty list: keep the rest.
		l.pass, l.passAt = append(l.pass[:0], ms[done:]...), 0
		l.passing = true
		l.passSlept()
		return n
	}
	l.flushed()
	return n
}

// flushed is the rest of a flush, once every member of it is written.
func (l *loopState) flushed() {
	l.unpark()
	l.closeLingering()
	l.table.PumpPaced()
	l.table.CheckGaps()
}

func (l *loopState) flushMembers(ms []*connOut) int {
	n, _ := l.writeSlice(ms, -1)
	return n
}

// passCheck: a slice looks at the clock after every this many members; a
// flush of fewer is never split. One ring batch (uring.Batch), so that the
// batch is submitted where the clock is looked at and never holds a slice
// past its budget.
const passCheck = uring.Batch

// writeSlice writes ms's members in order until budget of loop time is
// spent (checked every passCheck members; a negative budget: no bound),
// and returns how many it wrote and how many of ms it went through.
func (l *loopState) writeSlice(ms []*connOut, budget time.Duration) (wrote, done int) {
	var start time.Time
	if budget >= 0 && len(ms) > passCheck {
		start = time.Now()
	}
	for i, m := range ms {
		if i > 0 && i%passCheck == 0 {
			l.sendQueued()
			if !start.IsZero() && time.Since(start) >= budget {
				return wrote, i
			}
		}
		if m.PendingBytes() == 0 || m.Closed() {
			continue
		}
		l.out(m)
		wrote++
	}
	l.sendQueued()
	l.ackWritten()
	return wrote, len(ms)
}

// out writes m's pending output, or queues it on the loop's ring: nothing
// of gnet's ahead of it, a socket, no more frames than a batch's iovecs.
// Whoever calls it sends the ring's batch (sendQueued) before the loop does
// anything else, so a queued send is never overtaken by another write to
// its connection, and the frames it points at stay as they are until the
// kernel has them.
func (l *loopState) out(m *connOut) {
	c, ok := m.Owner.(*conn)
	if !ok {
		m.Owner.Write()
		return
	}
	if frames := m.Pending(); len(frames) > 0 && len(frames[0]) > 0 && c.gc.OutboundBuffered() == 0 {
		if fd := c.gc.Fd(); fd >= 0 && l.sendRing() != nil && l.ring.Takes(len(frames)) {
			if l.ringQueued(c) {
				// The dirty list holds a member again that got output
				// after a write in this wake-up: its frames are in the
				// batch already.
				return
			}
			if !l.ring.Fits(len(frames)) {
				l.sendQueued()
			}
			l.ringConns[l.ring.Send(fd, frames)] = c
			if l.ring.Full() {
				l.sendQueued()
			}
			return
		}
	}
	l.write(c)
}

// passOn writes the next slice of the pass in progress.
func (l *loopState) passOn() { l.passRest(false) }

// passRest writes the next slice of the pass (all of it with all) and
// reports how many members it wrote. When the pass is through it ends:
// what flush does after writing, and a tick armed for the members that
// got frames since the pass wrote them (a tick that came during the pass
// left that to its end).
func (l *loopState) passRest(all bool) int {
	budget := l.slice
	if all {
		budget = -1
	}
	t0 := time.Now()
	n, done := l.writeSlice(l.pass[l.passAt:], budget)
	l.wBusy += time.Since(t0)
	l.wBusyW += n
	l.wRoundW += n
	l.wWidest = max(l.wWidest, l.wRoundW)
	if l.passAt += done; l.passAt < len(l.pass) {
		l.passSlept()
		return n
	}
	clear(l.pass)
	l.pass, l.passAt = l.pass[:0], 0
	l.passing, l.passFresh = false, false
	l.flushed()
	l.holding = false
	l.armTick()
	return n
}

// passSlept marks a slice written: the next one waits until the loop has
// read its input (OnTraffic's kick) or, with nothing to read, until the
// pass goroutine's tPass comes through the inbox. That goroutine is woken
// from here; its task is queued behind the return to gnet's poller in
// practice (a goroutine's wake-up takes longer than the loop's way back
// to epoll; with one P it runs only when the loop yields there, the
// poller having found nothing more to read), so the reads that arrived
// during a slice come before the next one.
func (l *loopState) passSlept() {
	l.passFresh = true
	if l.passC == nil {
		l.passC = make(chan struct{}, 1)
		go func(c chan struct{}) {
			for range c {
				l.push(task{kind: tPass})
			}
		}(l.passC)
	}
	select {
	case l.passC <- struct{}{}:
	default: // woken already
	}
}
