package loop

import (
	"bytes"
	"context"
	"net/netip"
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
	tRekeyApp                       // app: this app's secrets changed: when its connections end (auth.go)
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
}

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

	// A connection's output leaves at once when the connection has not
	// been written since the loop's last tick, else at the next tick: at
	// most one write per connection per tick, and no wait after a pause.
	// ticking: a flush tick is armed or queued; it re-arms while it finds
	// work, so an idle loop has no timer running (see kick and tick).
	// Each tick starts a flush period of the table, which knows which
	// members were written in it (flushFresh).
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
	judgedAt time.Duration        // when the tick was last judged (since monoEpoch)
	fakeNow  func() time.Duration // tests: the clock of judgeTick and armTick
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
	pass      []*fanout.Member
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
	// ring batches the one-frame sends of a flush (sendRing); nil where
	// the kernel has none, or until the first socket write (ringTried).
	ring      *sendRing
	ringTried bool
	idle      idleState // the sweep's pings and held pongs on the ring (ring_idle_linux.go)
	interns   map[string]string
	draining  bool
	stamps    []*pubStamp // free list of publish stamps (server.go)
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
	l.push(task{kind: tFanout, ev: ev})
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
		l.ring.close()
		l.ring = nil
	}
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
	if l.table.HasSlow() {
		l.table.CloseSlow()
	}
	if u := l.table.TakeUrgent(); len(u) > 0 {
		l.flushMembers(u)
	}
}

// kick runs at the end of each wake-up of the loop (an inbox drain, a read
// event). With no tick armed the loop's last tick found nothing to write,
// so what is pending leaves now and a tick is armed behind it. With one
// armed, a connection already written since the last tick waits for the
// next one, and one that was not (a quiet room on a loop kept ticking by
// others, output on a loop ticking only for a held gap) is written now
// (flushFresh). Under load the ticks chain and every connection gets one
// writev per tick, as many frames as it has; after a pause the first
// frames do not wait.
//
// One exception after a pause: while publishes read on this loop are still
// being committed (or answered by their publish proxy: ownPending), their deliveries are on the way in pieces (the pool
// commits what it has and the rest of a burst behind it), and writing the
// first piece at once would cost every member a second write for the rest
// a tick later. The output is then held until the loop's last publish is
// answered (its ack is pushed right behind its delivery) or for
// holdMax, whichever comes first, and leaves in one write per member.
func (l *loopState) kick() {
	if l.passing {
		if !l.passFresh {
			l.passOn()
		}
		return // the pass arms the tick when it ends
	}
	if l.holding {
		if l.ownPending() {
			return // the hold's timer is armed
		}
		l.holding = false
		l.flush()
		l.armTick() // from the hold's deadline to the grid
		return
	}
	if l.ticking {
		l.flushFresh()
		return
	}
	if !l.hasTickWork() {
		return
	}
	if l.ownPending() {
		l.holding, l.ticking = true, true
		l.flushT.reset(l.holdMax())
		return
	}
	l.flush()
	l.armTick()
}

// ownPending reports whether more of what is being written is on its way
// from this loop's own publishes: some are being committed, or some wait
// for their app's publish proxy while its answers are coming in (one
// came within holdMax). The publish proxy's answers to a burst come back
// spread over a millisecond or so, each released publish committed on
// its own, so without this the first answer's delivery would leave at
// once and the rest of the burst wait a whole tick behind it. A backend
// that stopped answering holds nothing (no answer came lately), so it
// does not slow the output of other apps on the loop.
func (l *loopState) ownPending() bool {
	if l.inflight > 0 {
		return true
	}
	return l.proxyPubs > 0 && time.Since(monoEpoch)-l.proxyAt < l.holdMax()
}

// flushFresh writes the members that got output while not written in this
// tick's period; the others keep their output for the tick. The table
// sorts members out as they get output, so under load, when the tick wrote
// every member, this costs nothing per wake-up. It spends at most a slice
// of loop time (as a pass does): the fresh members of a quiet room of
// thousands past that are left to the tick, whose pass reads the input
// between slices.
func (l *loopState) flushFresh() {
	f := l.table.TakeFresh()
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
		if m.Closed || m.PendingBytes() == 0 || l.table.WroteInPeriod(m) {
			continue
		}
		l.out(m)
	}
	l.sendQueued()
}

// holdMax bounds the hold of kick: a quarter tick, short against the
// tick that the rest of a burst would otherwise wait for.
func (l *loopState) holdMax() time.Duration { return l.srv.cfg.FlushInterval / 4 }

// hasTickWork: output is pending, a held gap or a failed tail read is
// waiting for its window, a replay for its output, or a connection for its
// transport to drain (parked, or a close frame still in gnet).
func (l *loopState) hasTickWork() bool {
	return l.table.NeedsTick() || len(l.parked) > 0 || l.unshut > 0
}

// armTick arms the next flush tick. Ticks fall on a fixed grid (multiples
// of the tick since the process started), so a tick that follows a
// write made at once comes at the end of that write's interval, not a whole
// interval after it: what arrived just behind the first frames (the rest of
// a burst) waits half an interval on average rather than a whole one. Less
// than a quarter interval before the grid point, the tick after it is taken
// instead, so two writes to a connection are never that close together:
// taking the close point too cut the p50 at 500 msg/s a little but cost
// ~8% more ticks and ~4% more CPU per frame at 1,000 msg/s (see
// docs/benchmarks.md).
func (l *loopState) armTick() {
	l.ticking = true
	now := l.clock()
	l.judgeTick(now)
	l.flushT.reset(tickDelay(now, l.tickInterval()))
}

// clock is the time since monoEpoch, as tests may fake it.
func (l *loopState) clock() time.Duration {
	if l.fakeNow != nil {
		return l.fakeNow()
	}
	return time.Since(monoEpoch)
}

// tickDelay is how long after since (on monoEpoch's clock) the next tick
// of interval iv falls: the next grid point, or the one after it when the
// next is less than a quarter interval away.
func tickDelay(since, iv time.Duration) time.Duration {
	d := iv - since%iv
	if d < iv/4 {
		d += iv
	}
	return d
}

// tickInterval is the flush tick now: FlushInterval, or half of it while
// the loop is lightly loaded (judgeTick). Half of it keeps the grid: every
// grid point of the configured tick is one of the short tick's.
func (l *loopState) tickInterval() time.Duration {
	if l.tickHalf {
		return l.srv.cfg.FlushInterval / 2
	}
	return l.srv.cfg.FlushInterval
}

// judgeWrites is how many writes the loop makes between two judgements of
// its tick: in a room of 330, a dozen rounds at the configured tick.
const judgeWrites = 8192

// judgeSpans bounds a judgement's window, in configured ticks (1 s at 4
// ms): a window longer than that spans a pause, whose rate says nothing of
// the load that follows it (a step run's next level), and is dropped.
const judgeSpans = 250

// judgeTick shortens the tick to half of FlushInterval while the loop is
// lightly loaded and gives it back as load rises, once per judgeWrites
// writes. The tick only batches: a connection is written at most once per
// tick, so a message that comes behind its connection's last write waits
// for the next grid point, half a tick on average. Where a member gets
// few frames per configured tick, a shorter tick costs few writes more
// (there is little left to batch) and halves that wait: in a room of 330
// at 500 msg/s, p50 publish -> receipt is bounded by ~2.3 ms at a 4 ms
// tick and falls to ~1.1 ms at a 2 ms one (docs/benchmarks.md). Where it
// gets several, a shorter tick would split them into more writes, the
// cost per frame that the tick exists to cut.
//
// The load is judged by the frames a member gets per configured tick:
// the frames written per member of the widest round (the loop's busy
// members: a room's message makes every member dirty) per configured
// tick of the window. Frames per write follow the tick in force and the
// schedule, not the load: a loop that stops between bursts, or whose
// rounds a busy CPU stretches, writes more frames per write at the same
// rate, and at 500 msg/s that kept the configured tick (2.1-3.5 frames per
// write against a threshold of 2.5). The rate per member times the tick
// does not move with either (2 at 500 msg/s, 4 at 1,000): it is what the
// writes would carry at the configured tick with the ticks chained, and
// the small rounds between the full ones (a publisher's ack written at
// once) do not count as members. Where the rounds write different members
// (many small rooms), it counts every frame against the widest round's
// members, so it reads high: such a loop keeps the configured tick rather
// than halve it wrongly. Under 3 (in the room of 330 below ~750 msg/s)
// halves the tick; 3.5 or more gives it back, so the rates between keep
// the tick they have, and 1,000 msg/s and every level of the step run
// batch exactly as with the configured tick. Nor is a loop lightly loaded
// while a full round takes longer than the short tick (the loop time per
// write in the rounds times the widest round): a room of thousands, or a
// loop starved of its CPU keeps the configured tick whatever its rate.
// This was counted in slices (at most one slice past a round's first, on
// average), which is a bound of 1-2 ms for a 2 ms tick: rounds of 330
// that took 1-2 ms on a shared machine sat on it, and the tick swung at
// 500 msg/s. The loop starts at the configured tick and changes only on
// evidence.
func (l *loopState) judgeTick(now time.Duration) {
	if l.wCount < judgeWrites {
		return
	}
	span := now - l.judgedAt
	l.judgedAt = now
	iv := l.srv.cfg.FlushInterval
	if span > 0 && span <= judgeSpans*iv && l.wRounds > 0 && l.wWidest > 0 && l.wBusyW > 0 {
		fits := l.wBusy*time.Duration(l.wWidest)/time.Duration(l.wBusyW) < iv/2
		perTick := float64(l.wFrames) * float64(iv) / (float64(l.wWidest) * float64(span))
		if l.tickHalf {
			l.tickHalf = fits && perTick < 3.5
		} else {
			l.tickHalf = fits && perTick < 3
		}
	}
	l.wFrames, l.wCount, l.wRounds = 0, 0, 0
	l.wBusy, l.wBusyW = 0, 0
	l.wWidest = l.wRoundW // a round in progress goes on counting
}

// tick is the flush tick. A tick that wrote nothing and has nothing to
// wait for is quiet, and the loop stops ticking there until output appears
// again: the first frames after any pause longer than a tick leave at once.
// What keeps this cheap under bursty load is that a burst reaches the loop
// in one piece (the publish pool commits what is queued at once and the
// loop takes a whole commit batch in one wake-up), so a burst costs one
// write per member whether it finds the loop ticking or not.
func (l *loopState) tick() {
	l.srv.Stats.Ticks.Add(1)
	if l.tickHalf {
		l.srv.Stats.ShortTicks.Add(1)
	}
	if l.passing {
		return // the pass arms the next tick when it ends; the period goes on
	}
	l.table.NewPeriod()
	l.holding = false
	wrote := l.flush()
	if wrote > 0 || l.hasTickWork() {
		l.armTick()
		return
	}
	l.ticking = false
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
	}
}

// now is the loop's clock in Unix ms. No goroutine keeps a coarse clock
// fresh (it would wake an idle node): reading the clock costs tens of ns
// through the vDSO and is done per read event or tick, not per frame.
func (l *loopState) now() int64 { return time.Now().UnixMilli() }

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
	ms := l.table.TakeDirty()
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
		// TakeDirty's slice is the table's next dirty list: keep the rest.
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

func (l *loopState) flushMembers(ms []*fanout.Member) int {
	n, _ := l.writeSlice(ms, -1)
	return n
}

// passCheck: a slice looks at the clock after every this many members; a
// flush of fewer is never split.
const passCheck = 32

// writeSlice writes ms's members in order until budget of loop time is
// spent (checked every passCheck members; a negative budget: no bound),
// and returns how many it wrote and how many of ms it went through.
func (l *loopState) writeSlice(ms []*fanout.Member, budget time.Duration) (wrote, done int) {
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
		if m.PendingBytes() == 0 || m.Closed {
			continue
		}
		l.out(m)
		wrote++
	}
	l.sendQueued()
	return wrote, len(ms)
}

// out writes m's pending output, or queues it on the loop's ring: nothing
// of gnet's ahead of it, a socket, no more frames than a batch's iovecs.
// Whoever calls it sends the ring's batch (sendQueued) before the loop does
// anything else, so a queued send is never overtaken by another write to
// its connection, and the frames it points at stay as they are until the
// kernel has them.
func (l *loopState) out(m *fanout.Member) {
	c, ok := m.Owner.(*conn)
	if !ok {
		m.Owner.Write()
		return
	}
	if frames := m.Pending(); len(frames) > 0 && len(frames[0]) > 0 && c.gc.OutboundBuffered() == 0 {
		if fd := c.gc.Fd(); fd >= 0 && l.sendRing() != nil && l.ring.takes(len(frames)) {
			if l.ring.queued(c) {
				// The dirty list holds a member again that got output
				// after a write in this wake-up: its frames are in the
				// batch already.
				return
			}
			if !l.ring.fits(len(frames)) {
				l.sendQueued()
			}
			l.ring.queue(c, fd, frames)
			if l.ring.full() {
				l.sendQueued()
			}
			return
		}
	}
	l.write(c)
}

// sendRing is the loop's ring, set up at the first socket write (a loop
// of tests' in-memory connections never makes one).
func (l *loopState) sendRing() *sendRing {
	if !l.ringTried {
		l.ringTried = true
		if l.srv.cfg.IOURing {
			l.ring = newSendRing()
		}
	}
	return l.ring
}

// sendQueued submits the ring's batch and finishes each of its writes.
func (l *loopState) sendQueued() {
	r := l.ring
	if r == nil || r.n == 0 {
		return
	}
	n := r.submit()
	for i := 0; i < n; i++ {
		c := r.conns[i]
		r.conns[i] = nil
		if r.pending[i] {
			r.pending[i] = false // not taken by the kernel: sent here instead
			l.write(c)
			continue
		}
		l.sent(c, r.res[i])
	}
}

// sent finishes a write that the ring sent, with its result (bytes sent,
// or -errno) as send(2) or writev(2) would have returned it: what the
// kernel did not take goes to gnet, and the counts are those of write. An
// error other than a full socket is left to write itself, which closes a
// broken connection (and sends on one whose error was the ring's own).
func (l *loopState) sent(c *conn, res int32) {
	m := &c.m
	frames := m.Pending()
	if c.closed || len(frames) == 0 {
		return
	}
	if res < 0 {
		if res != -int32(unix.EAGAIN) && res != -int32(unix.EINTR) {
			l.write(c)
			return
		}
		res = 0
	}
	before := m.PendingBytes()
	done := 0
	rest := int(res)
	for len(frames) > 0 && rest >= len(frames[0]) {
		rest -= len(frames[0])
		frames = frames[1:]
		done++
	}
	if rest > 0 {
		frames[0] = frames[0][rest:]
	}
	l.wrote(c, frames, done, before, false)
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

// write hands c's pending frames to the kernel. Fast path: the transport
// holds nothing from before, so one writev syscall on the socket with the
// loop's iovec array (gnet's Writev goes through x/sys, which allocates
// past 8 slices). Slow path: what the kernel does not take stays queued
// here, as references to the shared frames, except the first frame (or
// what is left of it), which goes into gnet's outbound buffer so that gnet
// watches the socket; once gnet has drained it, the tick writes the rest
// (park). A consumer's backlog thus costs no copy, and what the node still
// holds for it can be dropped (a slow consumer's close) without cutting a
// frame.
func (l *loopState) write(c *conn) { l.writeOut(c, false) }

// writeOut is write; with all, everything the kernel refuses goes into
// gnet at once (a close frame follows it and the connection ends).
func (l *loopState) writeOut(c *conn, all bool) {
	m := &c.m
	frames := m.Pending()
	if len(frames) == 0 {
		return
	}
	gc := c.gc
	fd := gc.Fd()
	if fd < 0 {
		all = true // a transport without a socket (tests' in-memory conn) takes everything
	}
	if gc.OutboundBuffered() > 0 && !all {
		l.park(c)
		return
	}
	before := m.PendingBytes()
	done := 0 // frames handed to the kernel or to gnet
	if gc.OutboundBuffered() == 0 && fd >= 0 {
		for len(frames) > 0 {
			n := min(len(frames), iovMax)
			total := 0
			var w uintptr
			var errno unix.Errno
			if n == 1 {
				// One frame, the common case when each connection gets a
				// frame every few hundred ms: send(2) goes to the socket
				// directly, without writev's iovec copy-in and the file
				// layer in front of the socket.
				total = len(frames[0])
				w, _, errno = unix.Syscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(unsafe.Pointer(&frames[0][0])), uintptr(total), unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL, 0, 0)
			} else {
				for i := 0; i < n; i++ {
					l.iov[i].Base = &frames[i][0]
					l.iov[i].SetLen(len(frames[i]))
					total += len(frames[i])
				}
				w, _, errno = unix.Syscall(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&l.iov[0])), uintptr(n))
				for i := 0; i < n; i++ {
					l.iov[i].Base = nil // do not pin frame chunks
				}
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
				done += n
				continue
			}
			rest := int(w)
			for rest >= len(frames[0]) {
				rest -= len(frames[0])
				frames = frames[1:]
				done++
			}
			frames[0] = frames[0][rest:]
			break
		}
	}
	l.wrote(c, frames, done, before, all)
}

// wrote is the rest of a write once the kernel had its go: frames are what
// it did not take (the first one possibly cut), done how many frames it
// took whole; what is left goes to gnet (all) or its first frame does and
// the connection is parked, and the counts follow.
func (l *loopState) wrote(c *conn, frames [][]byte, done, before int, all bool) {
	m := &c.m
	gc := c.gc
	if len(frames) > 0 {
		// The socket is full (or was). The first Write may try it once
		// more; the rest append.
		keep := 1
		if all {
			keep = len(frames)
		} else if c.m.SSE() {
			// An event and its id line go together: a stream cut after
			// the event but before its id (a slow consumer's close drops
			// what is still queued here) would dispatch the event without
			// its position, and the client's resume would send it again.
			for keep < len(frames) && !bytes.HasSuffix(frames[keep-1], sseEnd) {
				keep++
			}
		}
		for _, f := range frames[:keep] {
			if c.closed {
				break
			}
			_, _ = gc.Write(f)
		}
		done += keep
	}
	l.wFrames += done
	l.wCount++
	st := &l.srv.Stats
	st.FramesOut.Add(uint64(done))
	st.Writes.Add(1)
	st.WriteFrames.Observe(float64(done))
	l.table.Sent(m, done)
	st.BytesOut.Add(uint64(before - m.PendingBytes()))
	if c.closed {
		return
	}
	m.Backlog = gc.OutboundBuffered()
	if m.PendingBytes() > 0 {
		l.park(c)
	}
}

// park remembers a connection whose frames wait for gnet to drain what the
// kernel refused; every tick checks it (unpark).
func (l *loopState) park(c *conn) {
	if !c.m.Parked {
		c.m.Parked = true
		l.parked = append(l.parked, c)
	}
}

// unpark writes the parked connections whose transport has drained, and
// refreshes the backlog of the others (the outbound limit counts it).
func (l *loopState) unpark() {
	if len(l.parked) == 0 {
		return
	}
	ps := l.parked
	l.parked = l.spareParked[:0]
	for i, c := range ps {
		ps[i] = nil
		c.m.Parked = false
		if c.closed || c.state != stateOpen {
			continue
		}
		c.m.Backlog = c.gc.OutboundBuffered()
		if c.m.Backlog > 0 {
			l.park(c)
			continue
		}
		l.write(c)
	}
	l.spareParked = ps[:0]
}

// lingerMax bounds a closing handshake: how long a connection whose close
// frame was sent waits for it to leave and for the client's answer (its
// close frame or EOF) before the socket is closed anyway. A browser
// answers within a round trip; one that does not (gone, or not reading)
// costs its descriptor this long at most.
const lingerMax = time.Second

// lingerSlack batches the linger timer: one firing closes every
// connection due within this much, so a drain round's closes take one
// wake-up, not one each. Early is harmless: the client had most of
// lingerMax to answer.
const lingerSlack = 50 * time.Millisecond

type linger struct {
	c     *conn
	until int64 // Unix ms
	shut  bool  // the close frame has left and the write side is shut
}

// lingerClose waits for c's closing handshake to finish (closeWith). Its
// close frame is in gnet or the kernel; once gnet holds nothing more the
// write side is shut, so a FIN follows the frame. The client's close frame
// then closes the socket (OnTraffic), as does its EOF (gnet); the linger
// timer closes what is left at lingerMax. A close frame still in gnet is
// watched by the flush tick (unshut), the rest only by the linger timer:
// no goroutine per connection, no tick for a loop that only waits.
func (l *loopState) lingerClose(c *conn) {
	lg := linger{c: c, until: l.now() + lingerMax.Milliseconds()}
	if !l.shutWrite(&lg) {
		l.unshut++
	}
	if c.closed {
		return
	}
	l.lingers = append(l.lingers, lg)
	l.armLinger()
}

// shutWrite shuts the write side of lg's socket once gnet has handed
// everything to the kernel, and reports whether it is shut.
func (l *loopState) shutWrite(lg *linger) bool {
	if lg.shut {
		return true
	}
	gc := lg.c.gc
	if gc.OutboundBuffered() > 0 {
		return false
	}
	lg.shut = true
	if fd := gc.Fd(); fd >= 0 {
		_ = unix.Shutdown(fd, unix.SHUT_WR) // ENOTCONN: the peer is gone already; the close is what is left
	} else {
		_ = gc.Close() // no socket (tests' in-memory transport): no handshake to wait for
	}
	return true
}

// armLinger arms the linger timer for the earliest deadline, if it is not
// armed. Loop only.
func (l *loopState) armLinger() {
	if l.lingerArmed || len(l.lingers) == 0 {
		return
	}
	first := l.lingers[0].until
	for _, lg := range l.lingers[1:] {
		first = min(first, lg.until)
	}
	l.lingerArmed = true
	l.lingerT.Reset(max(time.Duration(first-l.now())*time.Millisecond, 0) + lingerSlack/2)
}

// closeLingering shuts the write side of the lingering connections whose
// close frame has left, and closes those that are out of time. The flush
// tick calls it while some close frame is still in gnet, the linger timer
// at the deadlines.
func (l *loopState) closeLingering() {
	if len(l.lingers) == 0 {
		return
	}
	now := l.now()
	keep := l.lingers[:0]
	unshut := 0
	for _, lg := range l.lingers {
		if lg.c.closed {
			continue
		}
		if now+lingerSlack.Milliseconds() >= lg.until {
			_ = lg.c.gc.Close()
			continue
		}
		if !l.shutWrite(&lg) {
			unshut++
		}
		if !lg.c.closed {
			keep = append(keep, lg)
		}
	}
	clear(l.lingers[len(keep):])
	l.lingers = keep
	l.unshut = unshut
}

func (l *loopState) retryReason() []byte {
	l.scratch = proto.AppendRetryReason(l.scratch[:0], l.srv.retryMS())
	return l.scratch
}

// sweep runs every sweepEvery while the loop has connections: server pings
// after IdleInterval of silence, closes after twice that, finishes upgrades
// that take too long, and closes connections whose token expired. It reads
// l.due and visits only the connections due.
func (l *loopState) sweep() {
	now := l.now()
	l.srv.apps.maybePrune(now)
	l.takeHeld(now)
	l.table.TrimFree()
	defer l.pingsQueued()
	idle := l.srv.cfg.IdleInterval.Milliseconds()
	upTimeout := l.srv.cfg.UpgradeTimeout.Milliseconds()
	l.pingBudget = l.pingShare()
	for i := 0; i < len(l.due); i++ {
		if l.due[i] > now {
			continue
		}
		c := l.conns[i]
		if c.closed {
			continue
		}
		l.sweepConn(c, now, idle, upTimeout)
		if !c.closed {
			l.due[c.pos] = c.dueAt()
		}
	}
}

// sweepConn does what is due for one connection.
func (l *loopState) sweepConn(c *conn, now, idle, upTimeout int64) {
	if c.m.SSE() && c.state == stateOpen {
		l.sweepSSE(c, now, idle)
		return
	}
	silent := now - c.lastRead
	switch {
	case c.state == stateUpgrading && c.awaiting:
		// An SSE request waiting for its connect proxy, whose answer
		// comes within the proxy's timeout.
	case c.state == stateUpgrading:
		if silent >= upTimeout || now-c.opened >= upTimeout {
			c.upgradeTimeout()
		}
	case c.state != stateOpen:
	case c.rooms != nil && now >= c.rooms.expMS:
		c.closeWith(proto.ClosePolicy, []byte("token expired"))
	case silent >= 2*idle:
		c.closeWith(proto.CloseNormal, []byte("idle timeout"))
	case silent >= idle && !c.pinged:
		if l.pingBudget <= 0 {
			return // this sweep's share is spent: the next sweep pings it
		}
		l.pingBudget--
		c.pinged = true
		c.ping()
	}
}

// ping sends a server ping. On an idle connection nothing is queued and
// the transport holds nothing, so the ping is one sendto(2) straight from
// the sweep: no pending list, no flush, and no tick armed behind it.
// Otherwise it queues behind the pending frames like any frame.
func (c *conn) ping() {
	st := &c.l.srv.Stats
	st.Pings.Add(1)
	if c.m.PendingBytes() == 0 && c.gc.OutboundBuffered() == 0 {
		if fd := c.gc.Fd(); fd >= 0 {
			if c.l.queuePing(c, fd) {
				return // it leaves with the sweep's batch
			}
			c.pingSent(sendPing(fd))
			return
		}
	}
	c.send(pingFrame)
}

// pingSent finishes a ping sent straight from the sweep, by sendto(2) or
// through the ring, with what the send returned. A full socket buffer (or
// a 2-byte frame cut in two, which a socket with room never does): the
// frame queues whole; with n > 0 its rest would have to, so the
// connection is beyond saving and is closed.
func (c *conn) pingSent(n int, err error) {
	st := &c.l.srv.Stats
	if n == len(pingFrame) {
		st.FramesOut.Add(1)
		st.Writes.Add(1)
		st.WriteFrames.Observe(1)
		st.BytesOut.Add(uint64(n))
		return
	}
	if (err != nil && err != unix.EAGAIN && err != unix.EINTR) || n > 0 {
		c.fail()
		return
	}
	c.send(pingFrame)
}

// sendPing writes the ping frame to fd with sendto(2). On a socket it does
// what write(2) does without the file layer write passes through first
// (fdget_pos, vfs_write, the iov_iter set-up of sock_write_iter), and
// MSG_NOSIGNAL spares a peer that is gone the SIGPIPE; with 15,000 idle
// connections this write is most of what the node does. The raw call keeps
// the byte count that unix.Sendto drops.
func sendPing(fd int) (int, error) {
	r, _, e := unix.Syscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(pingFrame))),
		uintptr(len(pingFrame)), unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// pingShare is how many pings one sweep may send: the loop's connections
// spread evenly over the idle interval, twice over. Connections opened
// together (a deploy, a reconnect storm) would otherwise be pinged
// together every interval, thousands of writes in one wake-up of the loop
// that every other connection of the loop waits behind; capped, such a
// clump spreads out over a few sweeps, and the pings stay spread since
// each connection's next ping follows its own answer. At twice the even
// rate a clump of all the loop's connections is through within half an
// interval, so every pong is in long before the idle close.
func (l *loopState) pingShare() int {
	every, idle := l.srv.sweepEvery(), l.srv.cfg.IdleInterval
	return max(64, int(2*int64(len(l.conns))*int64(every)/int64(idle))+1)
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

var pingFrame = proto.AppendControlFrame(nil, 0x9, nil)
var pongFrame = proto.AppendPongFrame(nil)
