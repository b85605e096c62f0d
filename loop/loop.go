package loop

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/panjf2000/gnet/v2"
	"golang.org/x/sys/unix"

	"github.com/roost-chat/roost/fanout"
	"github.com/roost-chat/roost/proto"
)

// iovMax is the kernel's IOV_MAX: a writev of more iovecs fails with EINVAL
// and gnet does not split one, so the write path does.
const iovMax = 1024

type taskKind uint8

const (
	tDeliver    taskKind = iota + 1 // key, seq, frame: a message of a room
	tSubscribed                     // key, err: the node's subscription is up
	tRoomSeq                        // room, seq, err: the room's newest seq, read after subscribing
	tAck                            // conn, req, seq, err: a publish was committed (or not)
	tReplay                         // conn, room, frame (many msg frames), seq = new cursor
	tHistory                        // conn, frame or err
	tRepair                         // room, held: messages read from the store to fill a gap
	tReset                          // the broker may have lost messages
	tFlush                          // the flush tick: write pending output
	tSweep                          // idle pings, timeouts, token expiry
	tDrain                          // n = 0: refuse new work; else close 1/seq of the connections with code n
)

// task is one unit of work handed to a loop. Passed by value: pushing one
// allocates nothing once the inbox slice has grown.
type task struct {
	kind  taskKind
	conn  *conn
	room  *fanout.Room
	key   string
	seq   uint64
	n     uint64
	frame []byte
	held  []fanout.Held
	req   *proto.PubRequest
	err   error
	done  func()
}

// loopState is everything one gnet loop owns. Only that loop's goroutine
// touches it, except the inbox and the timers' callbacks (which only push).
type loopState struct {
	srv   *Server
	el    gnet.EventLoop
	idx   int
	table *fanout.Table
	arena *fanout.Arena

	// inbox is the loop's one entry point for other goroutines (nats
	// ipQueue shape): producers append under mu and wake the loop only on
	// empty -> non-empty; the loop takes the whole batch at once.
	mu     sync.Mutex
	queue  []task
	woken  bool
	spare  []task
	drainF gnet.RunnableFunc
	// The bound (Config.InboxLimit): a delivery that finds the queue full
	// is not queued; its room key goes into lost, and the loop reads the
	// room's tail from the store at its next drain, as after a broker
	// reset. lost holds a key once however many of its messages overflow,
	// so it is bounded by the rooms of the loop. Every other task is queued
	// whatever the depth: acks and store reads answer requests of the loop
	// itself (publishes in flight are bounded by the publish queues, reads
	// by the read queue), ticks are one at a time. depth mirrors len(queue)
	// for the loop's publish check without the lock.
	lost      map[string]struct{}
	lostSpare map[string]struct{}
	depth     atomic.Int64

	// Output leaves at once when the loop has written nothing for a tick,
	// else at the next tick: at most one write per connection per
	// FlushInterval, and no wait after a quiet tick. ticking: a flush tick
	// is armed or queued; it re-arms only while it finds work, so an idle
	// loop has no timer running (see kick and tick).
	ticking  bool
	flushT   *time.Timer
	onFlushT func()
	// sweeping: the sweep timer is armed or queued; it runs only while the
	// loop has connections.
	sweeping bool
	sweepT   *time.Timer
	onSweepT func()

	conns     []*conn // every connection of the loop, for the sweep
	cmd       proto.Command
	keyBuf    []byte
	scratch   []byte
	iov       [iovMax]unix.Iovec
	interns   map[string]string
	gaps      []*fanout.Room
	draining  bool
	stamps    []*pubStamp   // free list of publish stamps (server.go)
	inflight  int           // publishes of this loop submitted and not yet answered
	commitLag time.Duration // smoothed read-to-answer time of its publishes (shedding)

	// tails are rooms whose newest messages must be read from the store
	// because the broker may have lost some (reset). At most maxTailReads
	// are read at once, so that a loop with thousands of rooms does not
	// overflow the shared read queue; a failed read is queued again after
	// GapWindow (tailRetry) rather than forgotten.
	tails       []*fanout.Room
	tailWant    map[*fanout.Room]bool
	tailReads   int
	tailRetry   []*fanout.Room
	tailRetryAt int64
}

func newLoopState(s *Server, el gnet.EventLoop, idx int) *loopState {
	l := &loopState{
		srv:     s,
		el:      el,
		idx:     idx,
		table:   fanout.NewTable(s.cfg.OutboundLimit, 64<<10),
		arena:   fanout.NewArena(64 << 10),
		interns: make(map[string]string),
	}
	l.drainF = l.drain
	l.onFlushT = func() { l.push(task{kind: tFlush}) }
	l.onSweepT = func() { l.push(task{kind: tSweep}) }
	l.flushT = time.AfterFunc(time.Hour, l.onFlushT)
	l.flushT.Stop()
	l.sweepT = time.AfterFunc(time.Hour, l.onSweepT)
	l.sweepT.Stop()
	return l
}

// stopTimers is for Server.Stop, after the loops have ended.
func (l *loopState) stopTimers() {
	l.flushT.Stop()
	l.sweepT.Stop()
}

// push hands t to the loop, whatever the inbox holds. Any goroutine.
func (l *loopState) push(t task) {
	l.mu.Lock()
	l.queue = append(l.queue, t)
	l.depth.Store(int64(len(l.queue)))
	l.wakeLocked()
}

// pushDelivery hands a room's message to the loop, or, with the inbox
// full, marks the room for a read from the store. Any goroutine.
func (l *loopState) pushDelivery(key string, seq uint64, frame []byte) {
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
	l.queue = append(l.queue, task{kind: tDeliver, key: key, seq: seq, frame: frame})
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
		l.recoverLost(lost)
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

// recoverLost reads from the store what overflowed the inbox: for each
// room, everything after the newest seq this loop delivered (a tail read,
// as after a broker reset; deliveries that were queued meanwhile are
// placed by seq, duplicates dropped). A room still joining is read once
// it is active, since its starting seq may predate the lost message.
func (l *loopState) recoverLost(lost map[string]struct{}) {
	for key := range lost {
		if r := l.table.Get(key); r != nil {
			l.queueTail(r)
		}
	}
	l.readTails()
}

// settle runs after each unit of loop work: slow consumers are closed,
// and a member past flushAt is written now (bounding the memory and the
// latency one wake-up can build up).
func (l *loopState) settle() {
	if l.table.HasSlow() {
		l.closeSlow()
	}
	if u := l.table.TakeUrgent(); len(u) > 0 {
		l.flushMembers(u)
	}
}

// kick runs at the end of each wake-up of the loop (an inbox drain, a read
// event). With no tick armed the loop has written nothing for at least a
// tick, so what is pending leaves now and a tick is armed behind it; with
// one armed, the output waits for it. Under load the ticks chain and every
// connection gets one writev per tick, as many frames as it has; after a
// quiet tick the first frames do not wait.
func (l *loopState) kick() {
	if l.ticking || !l.hasTickWork() {
		return
	}
	l.flush()
	l.armTick()
}

// hasTickWork: output is pending, or a held gap or a failed tail read is
// waiting for its window (checked at each tick, or a quiet room would wait
// for the next sweep).
func (l *loopState) hasTickWork() bool {
	return l.table.HasDirty() || len(l.gaps) > 0 || len(l.tailRetry) > 0
}

// armTick arms the next flush tick. Ticks fall on a fixed grid (multiples
// of FlushInterval since the process started), so a tick that follows a
// write made at once comes at the end of that write's interval, not a whole
// interval after it: what arrived just behind the first frames (the rest of
// a burst) waits half an interval on average rather than a whole one. Less
// than a quarter interval before the grid point, the tick after it is taken
// instead, so two writes to a connection are never that close together.
func (l *loopState) armTick() {
	l.ticking = true
	iv := l.srv.cfg.FlushInterval
	d := iv - time.Since(monoEpoch)%iv
	if d < iv/4 {
		d += iv
	}
	l.flushT.Reset(d)
}

// tick is the flush tick. A tick that wrote nothing and has nothing to
// wait for is quiet: the loop stops ticking until output appears again.
func (l *loopState) tick() {
	l.ticking = false
	wrote := l.flush()
	if wrote > 0 || l.hasTickWork() {
		l.armTick()
	}
}

// armSweep starts the sweep timer if it is not running. Loop only.
func (l *loopState) armSweep() {
	if l.sweeping {
		return
	}
	l.sweeping = true
	l.sweepT.Reset(l.srv.sweepEvery())
}

func (l *loopState) run(t *task) {
	switch t.kind {
	case tDeliver:
		if r := l.table.Get(t.key); r != nil {
			l.deliver(r, t.seq, t.frame)
		}
	case tSubscribed:
		l.subscribed(t.key, t.err)
	case tRoomSeq:
		l.activate(t.room, t.seq, t.err)
	case tAck:
		l.ack(t)
	case tReplay:
		l.replayed(t)
	case tHistory:
		l.historyDone(t)
	case tRepair:
		l.repaired(t.room, t.held, t.seq, t.n == 1, t.err)
	case tReset:
		l.reset()
	case tFlush:
		l.tick()
	case tSweep:
		l.sweeping = false
		l.sweep()
		if len(l.conns) > 0 {
			l.armSweep()
		}
	case tDrain:
		l.drainConns(int(t.n), int(t.seq))
		t.done()
	}
}

// now is the loop's clock in Unix ms. No goroutine keeps a coarse clock
// fresh (it would wake an idle node): reading the clock costs tens of ns
// through the vDSO and is done per read event or tick, not per frame.
func (l *loopState) now() int64 { return time.Now().UnixMilli() }

// flush writes every dirty connection's pending frames, one writev each,
// and returns how many connections it wrote.
func (l *loopState) flush() int {
	n := l.flushMembers(l.table.TakeDirty())
	l.checkGaps()
	return n
}

func (l *loopState) flushMembers(ms []*fanout.Member) int {
	n := 0
	for _, m := range ms {
		if m.PendingBytes() == 0 || m.Closed {
			continue
		}
		l.write(m.Owner.(*conn))
		n++
	}
	return n
}

// write hands c's pending frames to the kernel. Fast path: the transport
// holds nothing from before, so one writev syscall on the socket with the
// loop's iovec array (gnet's Writev goes through x/sys, which allocates
// past 8 slices). Whatever the kernel does not take goes into gnet's
// outbound buffer, which gnet drains when the socket turns writable.
func (l *loopState) write(c *conn) {
	m := &c.m
	frames := m.Pending()
	st := &l.srv.Stats
	st.FramesOut.Add(uint64(len(frames)))
	st.BytesOut.Add(uint64(m.PendingBytes()))
	st.Writes.Add(1)
	st.WriteFrames.Observe(float64(len(frames)))
	gc := c.gc
	if gc.OutboundBuffered() == 0 {
		fd := gc.Fd()
		for len(frames) > 0 {
			n := min(len(frames), iovMax)
			total := 0
			for i := 0; i < n; i++ {
				l.iov[i].Base = &frames[i][0]
				l.iov[i].SetLen(len(frames[i]))
				total += len(frames[i])
			}
			w, _, errno := unix.Syscall(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&l.iov[0])), uintptr(n))
			for i := 0; i < n; i++ {
				l.iov[i].Base = nil // do not pin frame chunks
			}
			if errno != 0 {
				if errno != unix.EAGAIN && errno != unix.EINTR {
					l.table.Flushed(m)
					c.fail()
					return
				}
				w = 0
			}
			if int(w) == total {
				frames = frames[n:]
				continue
			}
			rest := int(w)
			for rest >= len(frames[0]) {
				rest -= len(frames[0])
				frames = frames[1:]
			}
			frames[0] = frames[0][rest:]
			break
		}
	}
	// Slow path: the socket is full (or was): queue the rest in gnet, in
	// order. The first Write may try the socket once more; the rest append.
	for _, f := range frames {
		if c.closed {
			break
		}
		_, _ = gc.Write(f)
	}
	l.table.Flushed(m)
	if !c.closed {
		m.Backlog = gc.OutboundBuffered()
	}
}

// closeSlow closes consumers that passed the outbound limit: 1013 with a
// jittered retry hint, after dropping what they could not take.
func (l *loopState) closeSlow() {
	for _, m := range l.table.TakeSlow() {
		c := m.Owner.(*conn)
		if c.closed {
			continue
		}
		l.srv.Stats.SlowCloses.Add(1)
		l.table.Drop(m)
		c.closeWith(proto.CloseTryAgain, l.retryReason())
	}
}

func (l *loopState) retryReason() []byte {
	l.scratch = proto.AppendRetryReason(l.scratch[:0], l.srv.retryMS())
	return l.scratch
}

// sweep runs every sweepEvery while the loop has connections: server pings after IdleInterval of silence,
// closes after twice that, finishes upgrades that take too long, and closes
// connections whose token expired.
func (l *loopState) sweep() {
	now := l.now()
	idle := l.srv.cfg.IdleInterval.Milliseconds()
	upTimeout := l.srv.cfg.UpgradeTimeout.Milliseconds()
	for i := 0; i < len(l.conns); i++ {
		c := l.conns[i]
		if c.closed {
			continue
		}
		silent := now - c.lastRead
		switch {
		case c.state == stateUpgrading:
			if silent >= upTimeout || now-c.opened >= upTimeout {
				c.upgradeTimeout()
			}
		case c.state != stateOpen:
		case c.exp != 0 && now/1000 >= c.exp:
			c.closeWith(proto.ClosePolicy, []byte("token expired"))
		case silent >= 2*idle:
			c.closeWith(proto.CloseNormal, []byte("idle timeout"))
		case silent >= idle && !c.pinged:
			c.pinged = true
			c.send(pingFrame)
		}
	}
}

// drainConns is one round of Server.Drain on this loop. The first round
// (code 0) only marks the loop draining: new connections are closed at
// OnOpen and new publishes answered overloaded. Later rounds close
// 1/roundsLeft of the connections still open, each with code and a
// jittered retry hint; pending frames (acks included) go out before the
// close frame.
func (l *loopState) drainConns(code int, roundsLeft int) {
	l.draining = true
	if code == 0 {
		return
	}
	l.flush()
	open := 0
	for _, c := range l.conns {
		if !c.closed && c.state != stateClosing {
			open++
		}
	}
	quota := (open + roundsLeft - 1) / max(roundsLeft, 1)
	for i := len(l.conns) - 1; i >= 0 && quota > 0; i-- {
		if i >= len(l.conns) {
			continue // closes above removed connections from the list
		}
		c := l.conns[i]
		if c.closed || c.state == stateClosing {
			continue
		}
		quota--
		if c.state != stateOpen {
			c.state = stateClosing
			_ = c.gc.Close()
			continue
		}
		c.closeWith(code, l.retryReason())
	}
}

// intern returns key as a string, allocating it only the first time this
// loop sees it (publishes name their room on every frame).
func (l *loopState) intern(key []byte) string {
	if s, ok := l.interns[string(key)]; ok {
		return s
	}
	if len(l.interns) >= 1<<16 {
		clear(l.interns)
	}
	s := string(key)
	l.interns[s] = s
	return s
}

// roomKey builds app/room into the loop's scratch key buffer.
func (l *loopState) roomKey(c *conn, room []byte) []byte {
	l.keyBuf = append(append(append(l.keyBuf[:0], c.app.id...), '/'), room...)
	return l.keyBuf
}

// removeIfIdle drops a room nobody on this loop needs any more.
func (l *loopState) removeIfIdle(r *fanout.Room) {
	if !r.Idle() || l.table.Get(r.Key) != r {
		return
	}
	l.table.Remove(r)
	l.srv.hub.Leave(r.Key, l.idx)
}

// subscribed: the node is subscribed to key; read the room's newest seq
// (after subscribing, so nothing committed later can be missed).
func (l *loopState) subscribed(key string, err error) {
	r := l.table.Get(key)
	if r == nil || r.Active {
		return
	}
	if err != nil {
		l.activate(r, 0, err)
		return
	}
	l.srv.read(readJob{kind: rLastSeq, loop: l, room: r, key: r.Key})
}

// activate makes a room live on this loop at seq, releases what was held,
// and starts the parked joins.
func (l *loopState) activate(r *fanout.Room, seq uint64, err error) {
	if l.table.Get(r.Key) != r || r.Active {
		return
	}
	if err != nil {
		joiners := r.Joiners
		r.Joiners = nil
		for _, m := range joiners {
			c := m.Owner.(*conn)
			c.dropJoin(r)
			switch {
			case c.closed:
			case errors.Is(err, proto.ErrRoomLimit):
				// Reading the room's head makes it; its app has all the
				// rooms it may have.
				c.sendErr(roomName(r.Key), proto.CodeForbidden, "cannot join: the app has its maximum of rooms")
			default:
				c.sendErr(roomName(r.Key), proto.CodeOverloaded, "cannot join now: try again")
			}
		}
		r.Held = nil
		l.removeIfIdle(r)
		return
	}
	r.Active = true
	r.Last = seq
	held := r.Held
	r.Held = nil
	for _, h := range held {
		l.deliver(r, h.Seq, h.Frame)
	}
	joiners := r.Joiners
	r.Joiners = nil
	for _, m := range joiners {
		c := m.Owner.(*conn)
		if j := c.findJoin(r); j != nil && !c.closed {
			r.Joiners = append(r.Joiners, m) // startJoin removes it again when live
			c.startJoin(j)
		}
	}
	if l.tailWant[r] {
		l.readTails() // a delivery overflowed while the room was joining
	}
	l.removeIfIdle(r)
}

// deliver fans one message out to a room's members, in seq order: a
// duplicate is dropped, a message ahead of a missing seq is held until the
// gap is filled (by the broker or, after GapWindow, from the store).
func (l *loopState) deliver(r *fanout.Room, seq uint64, frame []byte) {
	if !r.Active {
		r.Held = insertHeld(r.Held, seq, frame)
		return
	}
	if seq <= r.Last {
		return
	}
	if seq == r.Last+1 && len(r.Held) == 0 {
		// Fast path: in order, nothing held.
		l.table.Deliver(r, frame)
		r.Last = seq
		if len(r.Joiners) > 0 {
			l.promoteAhead(r)
		}
		return
	}
	r.Held = insertHeld(r.Held, seq, frame)
	l.releaseHeld(r)
}

// promoteAhead makes live each joiner of r whose since was ahead of this
// loop once the room has reached it: the next seq delivered is the first it
// has not seen. Deliveries advance r.Last one seq at a time, so equality
// catches it; only a gap given up on jumps past, and then the joiner is
// closed like the room's members.
func (l *loopState) promoteAhead(r *fanout.Room) {
	// backwards: goLive swaps the last joiner into the removed slot
	for i := len(r.Joiners) - 1; i >= 0; i-- {
		if i >= len(r.Joiners) {
			continue
		}
		c := r.Joiners[i].Owner.(*conn)
		j := c.findJoin(r)
		if j == nil || !j.ahead || j.after > r.Last {
			continue
		}
		if j.after == r.Last {
			c.goLive(j)
			continue
		}
		r.RemoveJoiner(&c.m)
		c.dropJoin(r)
		c.closeWith(proto.CloseTryAgain, l.retryReason())
	}
}

func (l *loopState) releaseHeld(r *fanout.Room) {
	i := 0
	for ; i < len(r.Held); i++ {
		h := r.Held[i]
		if h.Seq <= r.Last {
			continue
		}
		if h.Seq != r.Last+1 {
			break
		}
		l.table.Deliver(r, h.Frame)
		r.Last = h.Seq
		if len(r.Joiners) > 0 {
			l.promoteAhead(r)
		}
	}
	if i > 0 {
		n := copy(r.Held, r.Held[i:])
		clear(r.Held[n:])
		r.Held = r.Held[:n]
	}
	if len(r.Held) == 0 {
		r.GapSince = 0
		return
	}
	if r.GapSince == 0 {
		r.GapSince = l.now()
		l.gaps = append(l.gaps, r)
	}
}

func insertHeld(h []fanout.Held, seq uint64, frame []byte) []fanout.Held {
	i := len(h)
	for i > 0 && h[i-1].Seq > seq {
		i--
	}
	if i > 0 && h[i-1].Seq == seq {
		return h // duplicate
	}
	h = append(h, fanout.Held{})
	copy(h[i+1:], h[i:])
	h[i] = fanout.Held{Seq: seq, Frame: frame}
	return h
}

// checkGaps asks the store for messages missing longer than GapWindow.
func (l *loopState) checkGaps() {
	now := l.now()
	window := l.srv.cfg.GapWindow.Milliseconds()
	if len(l.tailRetry) > 0 && now >= l.tailRetryAt {
		for _, r := range l.tailRetry {
			l.queueTail(r)
		}
		clear(l.tailRetry)
		l.tailRetry = l.tailRetry[:0]
		l.readTails()
	}
	if len(l.gaps) == 0 {
		return
	}
	keep := l.gaps[:0]
	for _, r := range l.gaps {
		if l.table.Get(r.Key) != r || len(r.Held) == 0 {
			r.GapSince = 0
			continue
		}
		keep = append(keep, r)
		if r.Repairing || now-r.GapSince < window {
			continue
		}
		r.Repairing = true
		l.srv.Stats.Repairs.Add(1)
		l.srv.read(readJob{kind: rRepair, loop: l, room: r, key: r.Key, after: r.Last, upto: r.Held[0].Seq - 1})
	}
	clear(l.gaps[len(keep):])
	l.gaps = keep
}

// repaired delivers messages read from the store, every seq up to upto:
// a gap, or for a tail read what the broker may have lost. If the store
// did not have them either, members cannot be given a gapless stream:
// they are closed with 1013 and rejoin with since.
func (l *loopState) repaired(r *fanout.Room, held []fanout.Held, upto uint64, tail bool, err error) {
	defer l.readTails()
	if tail {
		l.tailReads--
	}
	if l.table.Get(r.Key) != r {
		return
	}
	r.Repairing = false
	for _, h := range held {
		l.deliver(r, h.Seq, h.Frame)
	}
	if err != nil {
		if tail {
			if len(l.tailRetry) == 0 {
				l.tailRetryAt = l.now() + l.srv.cfg.GapWindow.Milliseconds()
			}
			l.tailRetry = append(l.tailRetry, r)
		}
		return // a gap is tried again after the next window
	}
	if r.Last >= upto || len(r.Held) == 0 || r.Held[0].Seq == r.Last+1 {
		// Everything asked for is delivered. What is still held waits
		// behind a newer gap (messages in flight meanwhile), which gets a
		// window of its own rather than a verdict from this read.
		if r.GapSince != 0 {
			r.GapSince = l.now()
		}
		l.releaseHeld(r)
		return
	}
	// The store answered but the gap stays: give up on this stream.
	l.srv.Stats.GapCloses.Add(1)
	l.table.EachMember(r, func(m *fanout.Member) {
		c := m.Owner.(*conn)
		l.table.Drop(m)
		c.closeWith(proto.CloseTryAgain, l.retryReason())
	})
	r.Last = r.Held[0].Seq - 1
	if len(r.Joiners) > 0 {
		l.promoteAhead(r)
	}
	l.releaseHeld(r)
}

// reset: the broker may have lost messages of any room; read each active
// room's tail from the store and deliver what is missing.
func (l *loopState) reset() {
	l.table.Each(func(r *fanout.Room) {
		if r.Active {
			l.queueTail(r)
		}
	})
	l.readTails()
}

func (l *loopState) queueTail(r *fanout.Room) {
	if l.tailWant == nil {
		l.tailWant = make(map[*fanout.Room]bool)
	}
	if !l.tailWant[r] {
		l.tailWant[r] = true
		l.tails = append(l.tails, r)
	}
}

// maxTailReads bounds one loop's tail reads in flight after a reset.
const maxTailReads = 64

// readTails starts tail reads of queued rooms, up to maxTailReads in
// flight. A room with a gap repair in flight waits for it (repaired calls
// back here), so that a reset during a repair is not lost.
func (l *loopState) readTails() {
	for n := len(l.tails); n > 0 && l.tailReads < maxTailReads; n-- {
		r := l.tails[0]
		l.tails[0] = nil
		l.tails = l.tails[1:]
		if l.table.Get(r.Key) != r {
			delete(l.tailWant, r)
			continue
		}
		if r.Repairing || !r.Active {
			// activate calls back here once the room is live
			l.tails = append(l.tails, r)
			continue
		}
		delete(l.tailWant, r)
		r.Repairing = true
		l.tailReads++
		l.srv.read(readJob{kind: rRepair, loop: l, room: r, key: r.Key, after: r.Last, upto: 0})
	}
	if len(l.tails) == 0 {
		l.tails = nil
	}
}

// roomName is the room part of a key.
func roomName(key string) []byte {
	_, room := proto.SplitKey(key)
	return unsafe.Slice(unsafe.StringData(room), len(room))
}

var pingFrame = proto.AppendControlFrame(nil, 0x9, nil)
var pongFrame = proto.AppendPongFrame(nil)
