package loop

import (
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/gobwas/ws"
)

// TestFlushSchedule: output after a pause leaves at once, output within a
// tick waits for it (one writev per connection per tick), and one quiet
// tick stops the ticking, so the next output leaves at once again.
func TestFlushSchedule(t *testing.T) {
	rig := newFanoutRig(t, 3, false)
	l := rig.l
	l.srv.cfg.FlushInterval = time.Second // the test runs the ticks itself
	t.Cleanup(l.stopTimers)
	writes := func() uint64 { return l.srv.Stats.Writes.Load() }

	rig.next()
	l.kick()
	if writes() != 3 || !l.ticking {
		t.Fatalf("first frames after a pause: %d writes, ticking %v; want 3 written at once and a tick armed", writes(), l.ticking)
	}
	rig.next()
	rig.next()
	l.kick()
	if writes() != 3 || !l.q.HasDirty() {
		t.Fatalf("frames within a tick: %d writes; want them held for the tick", writes())
	}
	l.tick()
	if writes() != 6 || !l.ticking {
		t.Fatalf("tick with output: %d writes, ticking %v; want one writev each and the next tick armed", writes(), l.ticking)
	}
	if got := l.srv.Stats.FramesOut.Load(); got != 9 {
		t.Fatalf("frames out %d, want 9", got)
	}
	l.tick()
	if writes() != 6 || l.ticking {
		t.Fatalf("one quiet tick: %d writes, ticking %v; want the loop to stop ticking", writes(), l.ticking)
	}
	rig.next()
	l.kick()
	if writes() != 9 || !l.ticking {
		t.Fatalf("output after one quiet tick: %d writes, ticking %v; want it written at once and a tick armed", writes(), l.ticking)
	}
	rig.next()
	l.kick()
	if writes() != 9 {
		t.Fatalf("output behind it: %d writes; want it held for the tick", writes())
	}
	l.tick()
	l.tick()
	if writes() != 12 || l.ticking {
		t.Fatalf("a tick with output and a quiet one: %d writes, ticking %v", writes(), l.ticking)
	}
	if got := l.srv.Stats.Ticks.Load(); got != 4 {
		t.Fatalf("%d ticks counted, want 4", got)
	}
}

// TestFlushHoldsForOwnPublishes: after a pause, output found while
// publishes of the loop are still being committed waits for their answers
// (the rest of the burst), then leaves in one write per member; the hold
// ends at its timer if an answer is slow.
func TestFlushHoldsForOwnPublishes(t *testing.T) {
	rig := newFanoutRig(t, 3, false)
	l := rig.l
	l.srv.cfg.FlushInterval = time.Second // the test runs the ticks itself
	t.Cleanup(l.stopTimers)
	writes := func() uint64 { return l.srv.Stats.Writes.Load() }

	l.inflight = 2 // two publishes of the loop in the pool
	rig.next()
	l.kick()
	if writes() != 0 || !l.holding || !l.ticking {
		t.Fatalf("first piece of a burst: %d writes, holding %v; want it held", writes(), l.holding)
	}
	l.inflight = 1
	rig.next()
	l.kick()
	if writes() != 0 {
		t.Fatalf("second piece with a publish still in the pool: %d writes; want it held", writes())
	}
	l.inflight = 0
	l.kick()
	if writes() != 3 || l.holding || !l.ticking {
		t.Fatalf("burst answered: %d writes, holding %v, ticking %v; want one write per member and a tick armed", writes(), l.holding, l.ticking)
	}
	if got := l.srv.Stats.FramesOut.Load(); got != 6 {
		t.Fatalf("frames out %d, want both messages in the one write", got)
	}
	l.tick() // quiet: stops
	if l.ticking {
		t.Fatal("quiet tick after the burst did not stop the ticking")
	}

	l.inflight = 1
	rig.next()
	l.kick()
	if writes() != 3 || !l.holding {
		t.Fatalf("held output: %d writes, holding %v", writes(), l.holding)
	}
	l.tick() // the hold's timer: its answer is slow
	if writes() != 6 || l.holding || !l.ticking {
		t.Fatalf("hold timed out: %d writes, holding %v, ticking %v; want the output written and the next tick armed", writes(), l.holding, l.ticking)
	}
	l.inflight = 0
}

// TestFlushHoldsForProxyAnswers: output found while the loop's publishes
// wait for their publish proxy, with its answers coming in, is held like
// output behind publishes being committed (the rest of the burst is a
// few answers away); with no answer lately (a backend hung) nothing is
// held, so other apps' output on the loop leaves at once.
func TestFlushHoldsForProxyAnswers(t *testing.T) {
	rig := newFanoutRig(t, 3, false)
	l := rig.l
	l.srv.cfg.FlushInterval = time.Second // the test runs the ticks itself; holdMax 250ms
	t.Cleanup(l.stopTimers)
	writes := func() uint64 { return l.srv.Stats.Writes.Load() }

	l.proxyPubs, l.proxyAt = 2, time.Since(monoEpoch) // one answer just came, two to come
	rig.next()
	l.kick()
	if writes() != 0 || !l.holding {
		t.Fatalf("first answer's delivery: %d writes, holding %v; want it held for the rest", writes(), l.holding)
	}
	l.proxyPubs, l.proxyAt = 0, time.Since(monoEpoch)
	rig.next()
	l.kick()
	if writes() != 3 || l.holding || !l.ticking {
		t.Fatalf("burst answered: %d writes, holding %v, ticking %v; want one write per member", writes(), l.holding, l.ticking)
	}
	if got := l.srv.Stats.FramesOut.Load(); got != 6 {
		t.Fatalf("frames out %d, want both messages in the one write", got)
	}
	l.tick() // quiet: stops
	if l.ticking {
		t.Fatal("quiet tick did not stop the ticking")
	}

	// A hung backend: publishes wait, no answer for longer than holdMax.
	l.proxyPubs, l.proxyAt = 5, time.Since(monoEpoch)-time.Second
	rig.next()
	l.kick()
	if writes() != 6 || l.holding {
		t.Fatalf("output beside a hung backend's publishes: %d writes, holding %v; want it written at once", writes(), l.holding)
	}
	l.proxyPubs = 0
}

// TestFreshConnectionSkipsTheTick: while the loop ticks, a member not yet
// written since the last tick is written at the end of the wake-up, and one
// written since waits for the next tick.
func TestFreshConnectionSkipsTheTick(t *testing.T) {
	rig := newFanoutRig(t, 3, false)
	l := rig.l
	l.srv.cfg.FlushInterval = time.Second // the test runs the ticks itself
	t.Cleanup(l.stopTimers)
	writes := func() uint64 { return l.srv.Stats.Writes.Load() }
	rig.next()
	ms := append([]*connOut(nil), l.q.TakeFresh()...) // the three members
	l.kick()
	if writes() != 3 || !l.ticking {
		t.Fatalf("after a pause: %d writes, ticking %v", writes(), l.ticking)
	}
	frame := []byte("x")
	l.q.Enqueue(ms[0], frame)
	l.kick()
	if writes() != 3 {
		t.Fatalf("member written in this period: %d writes; want it held for the tick", writes())
	}
	l.tick() // writes member 0 only; the others were not written in the new period
	if writes() != 4 || !l.ticking {
		t.Fatalf("tick: %d writes, ticking %v; want member 0 written and the tick re-armed", writes(), l.ticking)
	}
	l.q.Enqueue(ms[1], frame)
	l.kick()
	if writes() != 5 {
		t.Fatalf("member not written since the tick: %d writes; want it written at once", writes())
	}
	l.q.Enqueue(ms[1], frame)
	l.q.Enqueue(ms[0], frame)
	l.kick()
	if writes() != 5 {
		t.Fatalf("members written since the tick: %d writes; want both held for the next tick", writes())
	}
	l.tick()
	if writes() != 7 || l.q.HasDirty() {
		t.Fatalf("next tick: %d writes, dirty %v; want both written", writes(), l.q.HasDirty())
	}
	l.tick()
	if l.ticking {
		t.Fatal("quiet tick did not stop the ticking")
	}
}

// TestOneWritePerTickUnderLoad: whatever mix of deliveries, single frames,
// publishes in flight and ticks the loop sees, no member is written twice
// in one tick's period, and a tick leaves nothing pending.
func TestOneWritePerTickUnderLoad(t *testing.T) {
	const n = 20
	rig := newFanoutRig(t, n, true)
	l := rig.l
	l.srv.cfg.FlushInterval = time.Second // the test runs the ticks itself
	t.Cleanup(l.stopTimers)
	rig.next()
	ms := append([]*connOut(nil), l.q.TakeFresh()...)
	if len(ms) != n {
		t.Fatalf("%d members dirty, want %d", len(ms), n)
	}
	l.kick()
	period := 1             // the table's: one per tick
	wrote := make([]int, n) // the period of each member's last observed write
	for i := range wrote {
		wrote[i] = period
	}
	frame := []byte("y")
	rnd := uint64(1)
	next := func(k uint64) uint64 { rnd = rnd*6364136223846793005 + 1442695040888963407; return (rnd >> 33) % k }
	before := make([]int, n)
	snap := func() {
		for i, m := range ms {
			before[i] = m.PendingBytes()
		}
	}
	for step := 0; step < 5000; step++ {
		op := next(10)
		switch {
		case op < 3:
			rig.next()
			snap()
			l.kick()
		case op < 6:
			for j := next(4); j > 0; j-- {
				l.q.Enqueue(ms[next(n)], frame)
			}
			snap()
			l.kick()
		case op < 7:
			l.inflight = int(next(3))
			snap()
			l.kick()
		default:
			snap()
			period++
			l.tick()
			if !l.holding {
				for _, m := range ms {
					if m.PendingBytes() > 0 {
						t.Fatalf("step %d: a tick left output pending", step)
					}
				}
			}
		}
		for i, m := range ms {
			if before[i] > 0 && m.PendingBytes() == 0 {
				if wrote[i] == period {
					t.Fatalf("step %d (op %d): member %d written twice in period %d", step, op, i, period)
				}
				wrote[i] = period
			}
		}
	}
	l.inflight = 0
}

// TestFlushTickFollowsLoad: the tick halves once a written member gets
// few frames per configured tick and comes back as it gets more, judged
// once per judgeWrites writes; rates between the two thresholds keep the
// tick they have, so the tick does not swing. The room here gets perTick
// messages per configured tick, so half of them per short tick, and the
// clock moves a tick in force per tick: frames per write follow the tick
// as they do under a steady rate, and the rate per member does not.
func TestFlushTickFollowsLoad(t *testing.T) {
	const n = 300
	rig := newFanoutRig(t, n, true)
	l := rig.l
	iv := time.Second
	l.srv.cfg.FlushInterval = iv // the test runs the ticks itself
	t.Cleanup(l.stopTimers)
	var now time.Duration
	clock := tickClock
	tickClock = func() time.Duration { return now }
	t.Cleanup(func() { tickClock = clock })
	msgs := 0
	// every: a write round every this many ticks in force (the loop
	// stopped between bursts, or its ticks stretched), each with perTick
	// messages per configured tick the round covers.
	runEvery := func(perTick, every int) {
		t.Helper()
		// Two judgements' worth of ticks: the last one saw only this rate.
		for w := 0; w < 2*judgeWrites+n; w += n {
			k := perTick * every
			if l.tickHalf {
				// Half the tick, half the messages: perTick odd alternates.
				k = perTick * every / 2
				if perTick*every%2 == 1 && msgs%2 == 1 {
					k++
				}
				msgs++
			}
			for i := 0; i < k; i++ {
				rig.next()
			}
			now += time.Duration(every) * l.tickInterval()
			l.tick()
		}
	}
	run := func(perTick int) { t.Helper(); runEvery(perTick, 1) }
	want := func(when string, d time.Duration) {
		t.Helper()
		if got := l.tickInterval(); got != d {
			t.Fatalf("%s: tick %v, want %v", when, got, d)
		}
	}
	want("at the start", iv)
	run(4) // 4 frames per write at the configured tick
	want("4 per write", iv)
	run(2) // 2 per write: lightly loaded
	want("2 per write at the configured tick", iv/2)
	run(3) // 1.5 per write at the short tick: between the thresholds
	want("3 per configured tick, at the short tick", iv/2)
	run(4) // 2 per write at the short tick: load rises
	want("4 per configured tick, at the short tick", iv)
	run(3) // 3 per write at the configured tick: between
	want("3 per configured tick, at the configured tick", iv)
	run(1)
	want("1 per write", iv/2)
	run(4)
	want("4 per configured tick", iv)

	// Frames per write that are high because the rounds are far apart
	// (a loop that stops between bursts at 500 msg/s) are a light load:
	// 4 frames per write every other tick is 2 per configured tick.
	runEvery(2, 2)
	want("4 per write, a round every other configured tick", iv/2)
	// The rate, not the schedule, gives the tick back: a loop whose ticks
	// stretch to three (starved) writes 12 per write at 4 per tick.
	runEvery(4, 3)
	want("12 per write, a round every third tick", iv)

	// Rounds longer than the short tick (a room of thousands, a starved
	// loop) keep the configured tick however few frames their writes
	// carry.
	judge := func(frames, writes, rounds int, round, span time.Duration) {
		l.wFrames, l.wCount, l.wRounds = frames, writes, rounds
		l.wWidest = writes / rounds
		l.wBusy, l.wBusyW = round*time.Duration(rounds), writes
		now += span
		l.judgeTick(now)
	}
	judge(judgeWrites, judgeWrites, 4, iv, 4*iv)
	want("single frames, rounds as long as the configured tick", iv)
	judge(judgeWrites, judgeWrites, 20, iv/3, 20*iv)
	want("single frames, rounds of a third of the configured tick", iv/2)
	judge(judgeWrites, judgeWrites, 20, iv/2+iv/10, 20*iv)
	want("single frames, rounds a little longer than the short tick", iv)
	// Small rounds between the full ones (a publisher's ack written at
	// once) are not members of their own: 30 rounds of 300 members with 2
	// frames each per configured tick and 30 of one ack read as 2.
	l.tickHalf = false
	l.wFrames, l.wCount, l.wRounds, l.wWidest = 2*300*30+30, 300*30+30, 60, 300
	l.wBusy, l.wBusyW = 30*iv/10, 300*30+30
	now += 30 * iv
	l.judgeTick(now)
	want("rounds of 300 at 2 frames per tick, acks between them", iv/2)
	// A window that spans a pause says nothing of the load after it.
	judge(judgeWrites, judgeWrites, 20, 0, (judgeSpans+1)*iv)
	want("a window across a pause: the tick it had", iv/2)
	l.tickHalf = false
	judge(judgeWrites, judgeWrites, 20, 0, (judgeSpans+1)*iv)
	want("a window across a pause, at the configured tick", iv)
	// Fewer writes than a judgement needs change nothing.
	l.tickHalf = true
	judge(4*judgeWrites, judgeWrites-1, 1, 0, iv)
	want("too few writes to judge", iv/2)
}

// TestTickDelayKeepsTheGrid: the next tick falls on the grid of the tick
// in use, skipping a point less than a quarter tick away; the short tick's
// grid holds every point of the configured one.
func TestTickDelayKeepsTheGrid(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct{ since, iv, want time.Duration }{
		{0, 4 * ms, 4 * ms},
		{1 * ms, 4 * ms, 3 * ms},
		{3*ms + 100*time.Microsecond, 4 * ms, 4*ms + 900*time.Microsecond}, // 0.9 ms to the grid: the next
		{3 * ms, 4 * ms, 1 * ms},
		{1 * ms, 2 * ms, 1 * ms},
		{1*ms + 600*time.Microsecond, 2 * ms, 2*ms + 400*time.Microsecond},
		{5 * ms, 2 * ms, 1 * ms}, // 6 ms: a point of the short grid only
		{7 * ms, 2 * ms, 1 * ms}, // 8 ms: a point of both
	} {
		if got := tickDelay(c.since, c.iv); got != c.want {
			t.Errorf("tickDelay(%v, %v) = %v, want %v", c.since, c.iv, got, c.want)
		}
	}
}

// TestFlushScheduleAllocationFree: the immediate write, the held frames and
// the ticks (timer re-arming included) allocate nothing in steady state.
func TestFlushScheduleAllocationFree(t *testing.T) {
	rig := newFanoutRig(t, 300, false)
	l := rig.l
	l.srv.cfg.FlushInterval = time.Hour // no tick timer fires (a goroutine each) while allocations are counted
	t.Cleanup(l.stopTimers)
	frame := []byte("z")
	one := make([]*connOut, 0, 1)
	cycle := func() {
		rig.next()
		one = append(one[:0], l.q.TakeFresh()[0])
		l.kick() // quiet: written now
		rig.next()
		l.kick() // waits for the tick
		l.tick() // written, re-armed
		l.q.Enqueue(one[0], frame)
		l.kick() // written in this period: waits
		l.tick() // written
		rig.next()
		l.kick() // the others, not written since the tick: written now
		l.tick() // the first one
		l.tick() // quiet: stops
		l.inflight = 1
		rig.next()
		l.kick() // held for the loop's publish
		l.inflight = 0
		l.kick() // answered: written
		l.tick() // quiet: stops
	}
	cycle()
	if n := leastAllocs(20, cycle); n != 0 {
		t.Fatalf("flush schedule allocates %.1f per cycle", n)
	}
}

// TestFirstFramesLeaveAtOnce over real sockets, with a tick long enough to
// tell the paths apart: after a pause a message is written at once, and a
// second one close behind it waits for the next grid point of the tick
// (the one after, within a quarter tick of it).
func TestFirstFramesLeaveAtOnce(t *testing.T) {
	const iv = time.Second
	n := startNode(t, func(c *Config) { c.Loops = 1; c.FlushInterval = iv })
	alice, bob := n.dial(t, "alice"), n.dial(t, "bob")
	alice.send(`{"op":"join","room":"r"}`)
	alice.expect(map[string]any{"op": "joined", "room": "r"})
	for try := 1; ; try++ {
		time.Sleep(2300 * time.Millisecond) // the tick behind the last write finds nothing: a pause
		t0 := time.Now()
		id := strconv.Itoa(try)
		bob.send(`{"op":"pub","room":"r","id":"a` + id + `","body":1}`)
		alice.expect(map[string]any{"op": "msg", "id": "a" + id})
		first := time.Now()
		bob.send(`{"op":"pub","room":"r","id":"b` + id + `","body":2}`)
		alice.expect(map[string]any{"op": "msg", "id": "b" + id})
		second := time.Now()
		if d := first.Sub(t0); d > 500*time.Millisecond {
			t.Fatalf("first message after a pause took %v; want it written at once, not at the 1s tick", d)
		}
		// The grid is the loop's (multiples of the tick since monoEpoch).
		// Close to a grid point or to the quarter tick before it, the
		// first write and the second message may fall on either side of
		// it: try another phase.
		phase := first.Sub(monoEpoch) % iv
		if phase < 100*time.Millisecond || phase > iv*3/4-100*time.Millisecond {
			if try == 5 {
				t.Fatal("no usable phase in 5 tries")
			}
			continue
		}
		grid := first.Add(iv - phase)
		if second.Before(grid.Add(-5*time.Millisecond)) || second.After(grid.Add(500*time.Millisecond)) {
			t.Fatalf("second message at %v of the tick's interval (phase of the first %v); want it held for the next grid point, one write per connection per tick",
				second.Sub(grid)+iv, phase)
		}
		return
	}
}

// TestSweepDueFollowsConns: l.due stays beside l.conns through opens,
// upgrades and closes, and a sweep leaves every entry at its conn's next
// deadline.
func TestSweepDueFollowsConns(t *testing.T) {
	s, el := fuzzNode(t)
	var gcs []*memConn
	for i := 0; i < 4; i++ {
		gc := &memConn{el: el}
		s.OnOpen(gc)
		if i%2 == 0 { // two upgraded, two still in their upgrade
			gc.in = append(gc.in, fuzzUpgrade...)
			s.OnTraffic(gc)
		}
		gcs = append(gcs, gc)
	}
	l := s.loops[0].Load()
	t.Cleanup(l.stopTimers)
	check := func(when string) {
		t.Helper()
		if len(l.due) != len(l.conns) {
			t.Fatalf("%s: %d due entries for %d conns", when, len(l.due), len(l.conns))
		}
		for i, c := range l.conns {
			if int(c.pos) != i || l.due[i] != c.dueAt() {
				t.Fatalf("%s: conn %d (pos %d) due %d, want %d", when, i, c.pos, l.due[i], c.dueAt())
			}
		}
	}
	check("after open")
	s.OnClose(gcs[1], nil)
	check("after a close")
	l.sweep()
	check("after a sweep")
	if c := l.conns[0]; c.state == stateOpen && l.due[0] != c.lastRead+s.cfg.IdleInterval.Milliseconds() {
		t.Fatalf("open conn due %d, want its ping time %d", l.due[0], c.lastRead+s.cfg.IdleInterval.Milliseconds())
	}
}

// TestIdleNodeRests over real sockets: once the output of a publish has
// left, a node whose connections are silent runs no flush tick, and a node
// without connections runs no timer at all (no tick, no sweep).
func TestIdleNodeRests(t *testing.T) {
	n := startNode(t, func(c *Config) { c.Loops = 1; c.FlushInterval = 5 * time.Millisecond })
	st := &n.srv.Stats
	alice, bob := n.dial(t, "alice"), n.dial(t, "bob")
	alice.send(`{"op":"join","room":"r"}`)
	alice.expect(map[string]any{"op": "joined", "room": "r"})
	bob.send(`{"op":"pub","room":"r","id":"m-1","body":1}`)
	alice.expect(map[string]any{"op": "msg", "id": "m-1"})
	bob.expect(map[string]any{"op": "ack", "id": "m-1"})
	// The tick behind the last write finds nothing, and the loop stops.
	time.Sleep(20 * time.Millisecond)
	ticks := st.Ticks.Load()
	if ticks == 0 {
		t.Fatal("no flush tick ran behind the writes")
	}
	time.Sleep(300 * time.Millisecond) // 60 flush intervals
	if got := st.Ticks.Load() - ticks; got != 0 {
		t.Fatalf("%d flush ticks while every connection was silent; want none", got)
	}
	alice.conn.Close()
	bob.conn.Close()
	checkFor(t, 5*time.Second, func() bool { return st.Conns.Load() == 0 })
	time.Sleep(50 * time.Millisecond) // what the closes queued has run
	ticks, sweeps := st.Ticks.Load(), st.Sweeps.Load()
	time.Sleep(1500 * time.Millisecond) // past the sweep's period
	if dt, ds := st.Ticks.Load()-ticks, st.Sweeps.Load()-sweeps; dt != 0 || ds != 0 {
		t.Fatalf("a node without connections ran %d ticks and %d sweeps; want none", dt, ds)
	}
}

// TestSweepSpreadsPings: connections that fall silent together are pinged
// over a few sweeps, at most pingShare per sweep, each once, and a pong
// moves a connection's next ping a whole interval on.
func TestSweepSpreadsPings(t *testing.T) {
	s, el := fuzzNode(t)
	const n = 200
	var gcs []*memConn
	for i := 0; i < n; i++ {
		gc := &memConn{el: el}
		s.OnOpen(gc)
		gc.in = append(gc.in, strings.Replace(fuzzUpgrade, "user=f", "user=u"+strconv.Itoa(i), 1)...)
		s.OnTraffic(gc)
		gcs = append(gcs, gc)
	}
	l := s.loops[0].Load()
	t.Cleanup(l.stopTimers)
	for _, c := range l.conns {
		if c.state != stateOpen {
			t.Fatal("a connection is not open")
		}
	}
	share := l.pingShare()
	if share >= n {
		t.Fatalf("share %d: the test needs more connections than one sweep pings", share)
	}
	idle := s.cfg.IdleInterval.Milliseconds()
	for i, c := range l.conns { // all fell silent at the same moment
		c.lastRead = l.now() - idle
		l.due[i] = c.dueAt()
	}
	pings := func() int { return int(s.Stats.Pings.Load()) }
	for sweeps, want := 1, share; ; sweeps++ {
		l.sweep()
		if got := pings(); got != min(want, n) {
			t.Fatalf("after %d sweeps %d pings, want %d", sweeps, got, min(want, n))
		}
		if want >= n {
			break
		}
		want += share
	}
	l.sweep()
	if got := pings(); got != n {
		t.Fatalf("a sweep after every connection was pinged sent %d more", got-n)
	}
	for _, c := range l.conns {
		if !c.pinged || l.due[c.pos] != c.lastRead+2*idle {
			t.Fatalf("pinged conn: pinged %v, due %d, want its idle close at %d", c.pinged, l.due[c.pos], c.lastRead+2*idle)
		}
	}
	// A pong is input: the connection's next ping is an interval away.
	gc := gcs[0]
	gc.in = append(gc.in, clientFrame(ws.OpPong, true, nil)...)
	s.OnTraffic(gc)
	c := gc.ctx.(*conn)
	if c.pinged || l.due[c.pos] != c.lastRead+idle {
		t.Fatalf("after a pong: pinged %v, due %d, want %d", c.pinged, l.due[c.pos], c.lastRead+idle)
	}
}

// A connection's struct is most of what an idle joined connection costs
// the node beyond gnet's own; one field more moves it from the heap's
// 208-byte size class to the 224-byte one, 16 bytes per connection (it
// was 256 until the joins list, the store reads, the outbound queue held
// in the Member and its 32-bit counters, and an unused opcode left it:
// docs/bench-notes/2026-12-06.md, "density3").
func TestConnFitsItsSizeClass(t *testing.T) {
	if n := unsafe.Sizeof(conn{}); n > 208 {
		t.Fatalf("conn is %d bytes: past the 208-byte size class", n)
	}
}
