package loop

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/panjf2000/gnet/v2"
	"golang.org/x/sys/unix"

	"github.com/roost-chat/roost/fanout"
	"github.com/roost-chat/roost/fanout/outq"
	"github.com/roost-chat/roost/loop/internal/uring"
	"github.com/roost-chat/roost/proto"
)

type taskKind uint8

const (
	tFanout     taskKind = iota + 1 // ev: work for the loop's rooms (fanout.Table.Run)
	tAck                            // ack: a publish of this loop was answered
	tFlush                          // the flush tick: write pending output
	tSweep                          // idle pings, timeouts, token expiry
	tDrain                          // drain: one round of Server.Drain
	tCloseApp                       // app: close the connections of this app (disabled)
	tDisconnect                     // app, disc: close the connections of one user of the app
	tLinger                         // the linger timer: close handshakes out of time
	tProxy                          // px: a proxy hook answered (proxy.go)
	tPass                           // a pass's next slice may follow (passSlept)
	tShed                           // shed: a pass of Server.ShedNewest (applimit.go)
	tRekeyApp                       // app: this app's secrets changed: when its connections end (auth.go)
	tPosFlush                       // hand the read marks read in this wake-up to the positions goroutine (posSoon)
)

// task is one unit of work handed to a loop. Passed by value: pushing one
// allocates nothing once the inbox slice has grown.
type task struct {
	kind  taskKind
	ev    fanout.Event
	ack   *pubStamp   // the publish, its outcome filled in
	drain *drainRound // rare: allocated per round
	app   string      // tCloseApp, tDisconnect
	disc  *disconnect // rare: allocated per call
	px    *proxyWait  // tProxy
	shed  *shedRound  // tShed
}

// connOut is a connection's outbound queue and outQueue the loop's: what
// fanout queues for the connections and the flush writes.
type (
	connOut  = outq.Out[fanout.Owner]
	outQueue = outq.Queue[fanout.Owner]
)

// drainRound is one round of Server.Drain on one loop: with code 0 the loop
// only refuses new work; otherwise it closes 1/roundsLeft of its
// connections with code.
type drainRound struct {
	code       int
	roundsLeft int
	done       func()
}

// loopState is everything one gnet loop owns. Only that loop's goroutine
// touches it, except the inbox and the timers' callbacks (which only push).
type loopState struct {
	// refusedFlood: the connection being read drew limit refusals
	// (rate_limited, too_large), written at the end of its read.
	refusedFlood bool

	srv   *Server
	el    gnet.EventLoop
	idx   int
	table *fanout.Table
	q     *outQueue // the connections' outbound queue, which the table fills
	arena *fanout.Arena

	// inbox is the loop's one entry point for other goroutines (nats
	// ipQueue shape): producers append under mu and wake the loop only on
	// empty -> non-empty; the loop takes the whole batch at once.
	mu     sync.Mutex
	queue  []task
	woken  bool
	spare  []task
	drainF gnet.RunnableFunc

	// posArmed: a tPosFlush task is queued (posSoon).
	posArmed bool
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

	// A connection's output leaves at once when the connection has not
	// been written since the loop's last tick, else at the next tick: at
	// most one write per connection per tick, and no wait after a pause.
	// ticking: a flush tick is armed or queued; it re-arms while it finds
	// work, so an idle loop has no timer running (see kick and tick).
	// Each tick starts a flush period of the outbound queue, which knows
	// which members were written in it (flushFresh).
	ticking  bool
	holding  bool // output after a pause waits for this loop's publishes (kick); ticking too
	flushT   *flushTimer
	onFlushT func()
	// tickHalf: the tick is half of FlushInterval while the loop is
	// lightly loaded, its writes carrying about one frame each (judgeTick).
	// wFrames, wCount and wRounds count the frames, writes and write
	// rounds (flushes that wrote) since the tick was last judged; wWidest
	// is the most members one round wrote in that time, wRoundW the
	// writes of the round in progress, wBusy the loop time the rounds'
	// slices took and wBusyW the writes they made.
	tickHalf bool
	judgedAt time.Duration // when the tick was last judged (since monoEpoch)
	wFrames  int
	wCount   int
	wRounds  int
	wWidest  int
	wRoundW  int
	wBusy    time.Duration
	wBusyW   int
	// sweeping: the sweep timer is armed or queued; it runs only while the
	// loop has connections.
	sweeping bool
	sweepT   *time.Timer
	onSweepT func()

	// A flush of more members than one slice of loop time writes is a
	// pass, written slice by slice with the loop's input read in between:
	// a publish that arrives while a pass writes a room of thousands is
	// read within a slice, not after the whole pass, and its message
	// joins the frames of every member the pass has not reached yet (one
	// write for both), the members already written getting it at the
	// next tick. Without this a message waited for the pass in progress
	// and then for its own: p99 twice a pass (see docs/benchmarks.md,
	// one room of 6,000 on one core). pass[passAt:] are the members not
	// yet written; passFresh: a slice was written and no input has been
	// read since (the next slice waits for a read or for the task of
	// passSlept); passC wakes the goroutine that queues that task.
	pass      []*connOut
	passAt    int
	passing   bool
	passFresh bool
	passC     chan struct{}
	slice     time.Duration // loop time per slice: FlushInterval/4, the hold's bound

	conns []*conn // every connection of the loop, for the sweep
	due   []int64 // due[i]: when conns[i] next needs the sweep (conn.dueAt)
	// parked: connections whose frames wait for gnet to drain (write);
	// lingers: closing connections in their closing handshake
	// (lingerClose). Parked ones are checked at every tick, lingering ones
	// while their close frame is in gnet, and at their deadlines by the
	// linger timer.
	parked      []*conn
	spareParked []*conn
	lingers     []linger
	unshut      int // lingers whose close frame is still in gnet (the tick watches them)
	lingerArmed bool
	lingerT     *time.Timer
	pingBudget  int // pings the current sweep may still send (pingShare)
	cmd         proto.Command
	keyBuf      []byte
	sseBuf      []byte    // an SSE request's room names and position (openSSE)
	sseList     []sseRoom // its rooms
	scratch     []byte
	iov         [iovMax]unix.Iovec
	// ring batches the sends of a flush (sendRing); nil where the kernel
	// has none, or until the first socket write (ringTried). ringConns[i]
	// is the connection of the batch's operation i.
	ring      *uring.Ring
	ringTried bool
	ringConns [uring.Batch]*conn
	idle      idleState // the sweep's pings and held pongs on the ring (idle_linux.go)
	interns   map[string]string
	peers     map[*conn]netip.AddrPort // client addresses a proxy named (realaddr.go); not in conn, which stays small
	draining  bool
	stamps    []*pubStamp // free list of publish stamps (server.go)
	// acksOut: acks queued and not written yet, with when (fanout.Stamp),
	// for the write-out phase of their time (ackWritten).
	acksOut []ackOut
	// pubQueues are the connections with publishes waiting for their
	// app's publish proxy (proxy.go): kept here, not in conn, which
	// stays small for the connections of apps without one.
	pubQueues map[*conn]*pubQueue
	// ips: the source address of each connection counted against
	// MaxConnsPerIP (none without the cap), here rather than in conn.
	ips      map[*conn]netip.Addr
	inflight int // publishes of this loop submitted and not yet answered
	// proxyPubs: publishes of this loop asked of a publish proxy and not
	// yet answered; proxyAt: when the last of their answers came (since
	// monoEpoch). The flush hold waits for them too (kick).
	proxyPubs int
	proxyAt   time.Duration
	commitLag time.Duration // smoothed read-to-answer time of its publishes (shedding)
}

func newLoopState(s *Server, el gnet.EventLoop, idx int) *loopState {
	l := &loopState{
		srv:     s,
		el:      el,
		idx:     idx,
		interns: make(map[string]string),
	}
	l.table = s.fan.NewTable(idx, l)
	l.table.SetUsers(l.membersOf)
	l.table.SetPositionsSoon(l.posSoon)
	l.q = l.table.Queue()
	l.arena = l.table.Arena()
	l.drainF = l.drain
	l.onFlushT = func() { l.push(task{kind: tFlush}) }
	l.onSweepT = func() { l.push(task{kind: tSweep}) }
	l.flushT = newFlushTimer(l.onFlushT)
	l.sweepT = time.AfterFunc(time.Hour, l.onSweepT)
	l.sweepT.Stop()
	l.lingerT = time.AfterFunc(time.Hour, func() { l.push(task{kind: tLinger}) })
	l.lingerT.Stop()
	l.slice = s.cfg.FlushInterval / 4
	return l
}

// Post hands work for the loop's rooms to the loop (fanout.Loop). Any
// goroutine. A delivery may find the inbox full: see pushDelivery.
func (l *loopState) Post(ev fanout.Event) {
	if key, ok := ev.Delivery(); ok {
		l.pushDelivery(key, ev)
		return
	}
	if ev.Signal() {
		l.pushSignal(ev)
		return
	}
	l.push(task{kind: tFanout, ev: ev})
}

// PostAll hands the loop a batch of answers with one wake-up at most
// (fanout.Loop). Any goroutine.
func (l *loopState) PostAll(evs []fanout.Event) {
	l.mu.Lock()
	for i := range evs {
		l.queue = append(l.queue, task{kind: tFanout, ev: evs[i]})
	}
	l.depth.Store(int64(len(l.queue)))
	l.wakeLocked()
}

// Now is the loop's clock in Unix ms (fanout.Loop).
func (l *loopState) Now() int64 { return l.now() }

var _ fanout.Loop = (*loopState)(nil)

// stopTimers is for Server.Stop, after the loops have ended.
func (l *loopState) stopTimers() {
	l.flushT.close()
	l.sweepT.Stop()
	l.lingerT.Stop()
	if l.passC != nil {
		close(l.passC)
		l.passC = nil
	}
	if l.ring != nil {
		l.ring.Close()
		l.ring = nil
	}
}

func (l *loopState) run(t *task) {
	switch t.kind {
	case tFanout:
		l.table.Run(&t.ev)
	case tAck:
		l.ack(t.ack)
	case tFlush:
		l.tick()
	case tSweep:
		l.srv.Stats.Sweeps.Add(1)
		l.sweeping = false
		l.sweep()
		if len(l.conns) > 0 {
			l.armSweep()
		}
	case tDrain:
		l.drainConns(t.drain.code, t.drain.roundsLeft)
		t.drain.done()
	case tCloseApp:
		l.closeApp(t.app)
	case tRekeyApp:
		l.rekeyApp(t.app)
	case tDisconnect:
		l.disconnect(t.app, t.disc)
	case tLinger:
		l.lingerArmed = false
		l.closeLingering()
		l.armLinger()
	case tProxy:
		l.proxied(t.px)
	case tPass:
		l.passFresh = false // the loop has polled its input since the slice: the drain's kick writes the next
	case tShed:
		l.shed(t.shed)
	case tPosFlush:
		l.posArmed = false
		l.table.FlushPositions()
	}
}

// posSoon has the table's gathered read marks flushed at the end of this
// wake-up: a task on the loop's own inbox, whose drain gnet runs after
// the input events of the epoll batch being handled, so the marks read
// from every connection of the batch go to the positions goroutine
// together (fanout.Table.SetPositionsSoon). Loop only.
func (l *loopState) posSoon() {
	if !l.posArmed {
		l.posArmed = true
		l.push(task{kind: tPosFlush})
	}
}

// now is the loop's clock in Unix ms. No goroutine keeps a coarse clock
// fresh (it would wake an idle node): reading the clock costs tens of ns
// through the vDSO and is done per read event or tick, not per frame.
func (l *loopState) now() int64 { return time.Now().UnixMilli() }

func (l *loopState) retryReason() []byte {
	l.scratch = proto.AppendRetryReason(l.scratch[:0], l.srv.retryMS())
	return l.scratch
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

// roomName is the room part of a key.
func roomName(key string) []byte {
	_, room := proto.SplitKey(key)
	return unsafe.Slice(unsafe.StringData(room), len(room))
}
