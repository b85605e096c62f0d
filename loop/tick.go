package loop

import (
	"time"
)

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
//
// Acks and the answers to a connection's requests wait for neither
// (writeAcks).
func (l *loopState) kick() {
	l.kickOut()
	l.writeAcks()
}

// writeAcks writes the connections that got an ack in this wake-up and
// still hold it, whatever the tick: a publisher is a member of its room,
// so its own message's delivery (from the broker, which answers the
// publish path a moment later than it delivers) has usually just been
// written in this tick's period, and its ack would otherwise wait for the
// next tick, up to --flush, or for a hold. That is one write more per
// publish at most, with whatever else is pending for that connection.
//
// The same holds for the answer to a request (history, presence, read,
// unread, receipts: fanout.Table.Answered): the client is waiting on it,
// and the connection has often just been written for the room's traffic.
func (l *loopState) writeAcks() {
	answered := l.table.Answered()
	if len(l.acksOut) == 0 && len(answered) == 0 {
		return
	}
	for _, a := range l.acksOut {
		if c := a.c; !c.closed && c.m.Out.PendingBytes() > 0 {
			l.out(&c.m.Out)
		}
	}
	for _, o := range answered {
		if !o.Closed() && o.PendingBytes() > 0 {
			l.out(o)
		}
	}
	l.table.ClearAnswered()
	l.sendQueued()
	l.ackWritten()
}

func (l *loopState) kickOut() {
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

// holdMax bounds the hold of kick: a quarter tick, short against the
// tick that the rest of a burst would otherwise wait for.
func (l *loopState) holdMax() time.Duration { return l.srv.cfg.FlushInterval / 4 }

// hasTickWork: output is pending, a held gap or a failed tail read is
// waiting for its window, a replay for its output, or a connection for its
// transport to drain (parked, or a close frame still in gnet).
func (l *loopState) hasTickWork() bool {
	return l.q.HasDirty() || l.table.NeedsTick() || len(l.parked) > 0 || l.unshut > 0
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
	now := tickClock()
	l.judgeTick(now)
	l.flushT.reset(tickDelay(now, l.tickInterval()))
}

// tickClock is the clock of armTick and judgeTick, the time since
// monoEpoch: a variable so that a test can move it tick by tick.
var tickClock = func() time.Duration { return time.Since(monoEpoch) }

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
	l.q.NewPeriod()
	l.holding = false
	wrote := l.flush()
	if wrote > 0 || l.hasTickWork() {
		l.armTick()
		return
	}
	l.ticking = false
}
