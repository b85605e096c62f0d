// Package outq owns the outbound side of one event loop: each
// connection's pending frames (Out) and the loop's lists of them (Queue):
// the pending lists and their freelists, the dirty, fresh, urgent and slow
// lists, and the flush periods. fanout queues frames into it; the loop's
// flush takes them out and hands them to the kernel. It knows nothing of
// rooms, sockets or either package: an Out carries its owner (the
// connection) as a value the queue never looks at.
//
// Not safe for concurrent use: a Queue and its Outs belong to one loop's
// goroutine. Frames are immutable and shared by reference; nothing here
// copies one.
package outq

// Out is one connection's outbound queue. The zero value (with Owner set)
// is ready to use; an idle Out holds no list.
type Out[O any] struct {
	// Owner is the connection the frames are for, set once by whoever
	// embeds the Out; the queue never calls it. It is here, once per
	// connection, so that a list of Outs leads back to the connections.
	Owner O
	// pending holds references to immutable frames, in send order. It is
	// borrowed from the Queue's freelists only while non-empty, so an
	// idle connection holds no buffer.
	pending [][]byte
	// bytes and backlog are 32-bit, like wrote below, to keep Out (and
	// the connection around it) in its size budget; New holds the limit
	// under 1 GiB, so neither can overflow.
	bytes int32 // sum of len(pending[i])
	// backlog is what the transport still holds from earlier flushes
	// (gnet's outbound buffer); the loop refreshes it after every write.
	// It counts against the outbound limit so a consumer that stopped
	// reading is caught even when each flush is small.
	backlog int32
	// wrote is the flush period (NewPeriod) of the last write (Sent). 16
	// bits keep Out, and the connection around it, in its size budget; an
	// Out last written exactly 65,536 periods ago only waits for the next
	// tick.
	wrote  uint16
	dirty  bool
	urgent bool
	// slow is set once it passed the outbound limit: nothing more is
	// queued and the owner is to be closed with 1013 (TakeSlow).
	slow bool
	// closed: the connection is closing or gone; nothing more is queued
	// and queued work for it is skipped.
	closed bool
	// parked: the frames wait for the transport to drain what the kernel
	// refused (the loop's park list).
	parked bool
}

// Pending returns the frames queued, oldest first; valid until Flushed or
// Sent.
func (o *Out[O]) Pending() [][]byte { return o.pending }

// PendingBytes is the size of what is queued.
func (o *Out[O]) PendingBytes() int { return int(o.bytes) }

// Slow reports whether o passed the outbound limit.
func (o *Out[O]) Slow() bool { return o.slow }

// Close marks o's connection closing or gone: nothing more is queued.
func (o *Out[O]) Close() { o.closed = true }

// Closed reports whether Close was called.
func (o *Out[O]) Closed() bool { return o.closed }

// SetBacklog records what the transport still holds of earlier writes.
func (o *Out[O]) SetBacklog(n int) { o.backlog = int32(min(n, MaxLimit)) }

// Backlog is what SetBacklog last recorded.
func (o *Out[O]) Backlog() int { return int(o.backlog) }

// Park marks o parked and reports whether it was not already (the caller
// then lists it).
func (o *Out[O]) Park() bool {
	if o.parked {
		return false
	}
	o.parked = true
	return true
}

// Unpark clears what Park set.
func (o *Out[O]) Unpark() { o.parked = false }

// Queue is one loop's outbound lists: which Outs have output (dirty), got
// it while not written in the current flush period (fresh), passed the
// size that is worth a write before the tick (urgent) or the outbound
// limit (slow), and the freelists their pending lists come from.
type Queue[O any] struct {
	dirty  []*Out[O]
	urgent []*Out[O]
	// fresh: Outs that got output while not yet written in the current
	// flush period (the loop's tick), the ones the loop may write before
	// the tick without a second write in one period.
	fresh   []*Out[O]
	spareFr []*Out[O] // TakeFresh's other list
	slow    []*Out[O]
	spareSl []*Out[O] // TakeSlow's other list
	period  uint16
	limit   int // outbound limit per Out, bytes (pending + backlog)
	flushAt int // pending bytes that make an Out worth flushing before the tick
	free    [len(classes)][][][]byte
	// unused: per class, the fewest lists its freelist held since the last
	// TrimFree, i.e. lists that no take reached in that time.
	unused [len(classes)]int
}

// New returns an empty queue. limit is the outbound limit per Out
// (pending + transport backlog); flushAt is the pending size past which an
// Out is flushed at once rather than at the next tick.
func New[O any](limit, flushAt int) *Queue[O] {
	// period 1: an Out's zero wrote is no period (never written).
	return &Queue[O]{limit: min(limit, MaxLimit), flushAt: flushAt, period: 1}
}

// MaxLimit is the highest outbound limit (the node refuses a higher
// --outbound-limit at start rather than clamp it unseen): what one connection may have
// queued and unsent fits Out's 32-bit counters with room for the one
// frame (at most a replay page, a fraction of the limit) that Push adds
// past it. No client is served by a gigabyte of backlog anyway.
const MaxLimit = 1 << 30

// Limit is the outbound limit per Out, in bytes.
func (q *Queue[O]) Limit() int { return q.limit }

// Fits reports whether n bytes more stay within o's outbound limit.
func (q *Queue[O]) Fits(o *Out[O], n int) bool {
	return int(o.bytes)+int(o.backlog)+n <= q.limit
}

// MarkSlow marks o past the outbound limit: nothing more is queued for it
// and TakeSlow hands it over once.
func (q *Queue[O]) MarkSlow(o *Out[O]) {
	if !o.slow {
		o.slow = true
		q.slow = append(q.slow, o)
	}
}

// Enqueue queues one frame for o (an ack, a joined, a message), or marks o
// slow when the frame would pass the outbound limit: nothing is dropped
// silently. Fast path: one append of a slice header; no allocation once
// the freelists are warm.
func (q *Queue[O]) Enqueue(o *Out[O], frame []byte) {
	if o.slow || o.closed {
		return
	}
	if !q.Fits(o, len(frame)) {
		q.MarkSlow(o)
		return
	}
	q.Push(o, frame)
}

// Push queues frame for o without the outbound limit (a replay's page,
// whose next one waits for this one to leave, or the second half of a
// pair the caller checked with Fits). Nothing is queued for a slow or
// closed Out.
func (q *Queue[O]) Push(o *Out[O], frame []byte) {
	if o.slow || o.closed {
		return
	}
	if len(o.pending) == cap(o.pending) {
		q.grow(o)
	}
	o.pending = append(o.pending, frame)
	o.bytes += int32(len(frame))
	if !o.dirty {
		o.dirty = true
		q.dirty = append(q.dirty, o)
		if o.wrote != q.period {
			q.fresh = append(q.fresh, o)
		}
	}
	if int(o.bytes) >= q.flushAt && !o.urgent {
		o.urgent = true
		q.urgent = append(q.urgent, o)
	}
}

// Flushed tells the queue that o's pending frames were handed to the
// transport (written or buffered by it). The pending list goes back to the
// freelist: an idle Out holds none.
func (q *Queue[O]) Flushed(o *Out[O]) {
	q.put(o.pending)
	o.pending = nil
	o.bytes = 0
	o.dirty = false
	o.urgent = false
}

// Sent tells the queue that the first n of o's pending frames were handed
// to the transport; the rest stay queued, in order, for a later write: the
// kernel refused them, and the loop keeps them here rather than copying
// them into the transport, so a slow consumer's backlog costs references
// to shared frames, and dropping it (a slow consumer's close) cuts no
// frame. o is not dirty afterwards: the loop writes it again once the
// transport has drained.
func (q *Queue[O]) Sent(o *Out[O], n int) {
	o.wrote = q.period
	if n >= len(o.pending) {
		q.Flushed(o)
		return
	}
	rest := copy(o.pending, o.pending[n:])
	clear(o.pending[rest:])
	o.pending = o.pending[:rest]
	o.bytes = 0
	for _, f := range o.pending {
		o.bytes += int32(len(f))
	}
	o.dirty = false
	o.urgent = false
}

// Drop discards o's pending output (the connection is gone or is being
// closed as a slow consumer).
func (q *Queue[O]) Drop(o *Out[O]) { q.Flushed(o) }

// TakeDirty returns the Outs with pending output and resets the list.
// The returned slice is valid until the next TakeDirty.
func (q *Queue[O]) TakeDirty() []*Out[O] {
	d := q.dirty
	q.dirty = q.dirty[:0]
	q.urgent = q.urgent[:0]
	q.fresh = q.fresh[:0]
	return d
}

// NewPeriod starts a flush period: the loop calls it at each flush tick,
// and an Out written (Sent) since belongs to it.
func (q *Queue[O]) NewPeriod() {
	q.period++
	q.fresh = q.fresh[:0]
}

// TakeFresh returns the Outs that got output since the last TakeFresh or
// TakeDirty and had not been written in the current period when they did;
// one written in between is there with nothing pending or with a write in
// this period (WroteInPeriod). Valid until the next TakeFresh.
func (q *Queue[O]) TakeFresh() []*Out[O] {
	f := q.fresh
	q.fresh, q.spareFr = q.spareFr[:0], f
	return f
}

// WroteInPeriod reports whether o was written in the current period.
func (q *Queue[O]) WroteInPeriod(o *Out[O]) bool { return o.wrote == q.period }

// TakeUrgent returns the Outs whose pending output passed flushAt, to be
// flushed before the tick (bounds the work and memory of one wake-up).
func (q *Queue[O]) TakeUrgent() []*Out[O] {
	u := q.urgent
	q.urgent = q.urgent[:0]
	return u
}

// HasDirty reports whether anything waits for a flush.
func (q *Queue[O]) HasDirty() bool { return len(q.dirty) > 0 }

// HasSlow reports whether an Out passed the outbound limit since the last
// TakeSlow.
func (q *Queue[O]) HasSlow() bool { return len(q.slow) > 0 }

// TakeSlow returns the Outs that passed the outbound limit, each once, and
// resets the list. What they still hold is the caller's to Drop. Valid
// until the next MarkSlow: the caller's close of one may mark another, so
// it calls TakeSlow until HasSlow is false.
func (q *Queue[O]) TakeSlow() []*Out[O] {
	s := q.slow
	clear(q.spareSl)
	q.slow, q.spareSl = q.spareSl[:0], s
	return s
}
