package webhook

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
)

// room is one room of an app as its durable delivery goroutine sees it
// (that goroutine only).
type room struct {
	id        int64
	key       string
	leased    bool      // this node holds the lease: it may POST the room's events
	delivered uint64    // the cursor: events up to here were answered 2xx or dead-lettered
	last      uint64    // the newest seq known committed
	pending   []event   // committed here, seq > delivered, in seq order
	active    time.Time // last time it had something owed (for giving the lease up)
	renewed   time.Time // last time its lease was renewed
	dirty     bool      // delivered moved past the stored cursor
	gone      bool      // forgotten: dropped from st.order at the next housekeep
	handed    time.Time // last event handed over by Committed
	skip      time.Time // another node held the lease: no claim before this
	grace     time.Time // found by the sweep: no claim before this unless committed here
}

func (r *room) owed() bool {
	return r.last > r.delivered || len(r.pending) > 0
}

// dstate is the durable state of one app's delivery: its rooms.
type dstate struct {
	rooms  map[string]*room
	order  []*room // rooms in a rotating order, so that no room starves
	next   int
	failed int       // POSTs failed in a row
	retry  time.Time // no POST before this (backoff)
	swept  time.Time // last sweep
	// trimmed is the last trim of the app's delivered connection events.
	trimmed time.Time
	kept    time.Time // last housekeep
	dirty   []*room   // rooms whose cursor is to be written
	wrote   time.Time // last cursor write
	byID    map[int64]*room
	body    []byte
	// free gives back the bytes of pending events trimmed or dropped: they
	// count in the app's Window and the node's MaxBytes while held.
	free func(evs []event)

	// The database work off the delivery goroutine (runIO).
	jobs               chan func() func()
	wake               chan struct{}
	mu                 sync.Mutex
	results            []func()
	flushing, sweeping bool
	batch              []event
	spans              []span
}

// span is one room's part of a batch.
type span struct {
	r      *room
	lo, hi int    // batch[lo:hi]
	upto   uint64 // the cursor after this span is delivered
	fromDB bool
}

const storeTimeout = 10 * time.Second

// trimEvery is how often an app's delivered connection events are
// deleted (persist.Postgres.TrimHookEvents), by a sweep.
const trimEvery = time.Minute

// inFlight is how long after the last event handed over for a room the
// store's newer seqs are taken to be on their way (see fill).
const inFlight = 500 * time.Millisecond

// keepEvery is how often leases are renewed or given up, and how soon a
// room another node held is asked for again.
const keepEvery = time.Second

// deliverDurable is one app's delivery goroutine with a Store. It POSTs
// from memory and never waits for the database in the steady state: the
// cursor writes and the sweep run on a second goroutine (runIO) and their
// outcomes come back through st.results; only a room's first claim and a
// read of events not held in memory are done inline.
func (d *Dispatcher) deliverDurable(t *target) {
	defer close(t.done)
	st := &dstate{rooms: map[string]*room{}, byID: map[int64]*room{}, jobs: make(chan func() func(), 2), wake: t.wake}
	st.free = func(evs []event) {
		var b int64
		for i := range evs {
			b += evs[i].size()
		}
		t.mu.Lock()
		t.bytes -= b
		t.mu.Unlock()
		d.Stats.Held.Add(-b)
	}
	ioDone := make(chan struct{})
	go st.runIO(ioDone)
	tick := time.NewTicker(min(d.cfg.Sweep, d.cfg.CursorEvery, keepEvery, d.cfg.Lease/3))
	retry := time.NewTimer(time.Hour)
	defer func() {
		tick.Stop()
		retry.Stop()
		close(st.jobs)
		<-ioDone
		st.apply()
		d.releaseAll(t, st)
		// What is held here is owed in the store: nothing is lost.
		t.mu.Lock()
		n := len(t.queue)
		t.queue, t.spill = nil, nil
		b := t.bytes
		t.bytes = 0
		t.mu.Unlock()
		d.Stats.Owed.Add(-int64(n))
		d.Stats.Held.Add(-b)
	}()
	for {
		st.apply()
		d.gather(t, st)
		now := time.Now()
		if now.Sub(st.swept) >= d.cfg.Sweep {
			st.swept = now
			d.sweep(t, st)
		}
		if now.Sub(st.kept) >= keepEvery {
			st.kept = now
			d.housekeep(t, st, now)
		}
		if len(st.dirty) > 0 && now.Sub(st.wrote) >= d.cfg.CursorEvery {
			d.flush(t, st)
		}
		var retryC <-chan time.Time
		if now.Before(st.retry) {
			retry.Reset(st.retry.Sub(now))
			retryC = retry.C
		} else {
			d.claim(t, st)
			if d.fill(t, st) {
				d.send(t, st)
				continue
			}
		}
		select {
		case <-t.stop:
			return
		case <-t.wake:
		case <-tick.C:
		case <-retryC:
		}
	}
}

// send POSTs the batch fill built and handles the outcome.
func (d *Dispatcher) send(t *target, st *dstate) {
	hc := t.cfg.Load()
	st.body = appendBody(st.body[:0], t.id, st.batch)
	err := d.post(hc, st.body)
	if err == nil {
		d.observeLag(st.batch)
		st.failed = 0
		d.Stats.Posts.Add(1)
		d.Stats.Delivered.Add(uint64(len(st.batch)))
		d.countConn(st.batch)
		d.advance(st)
		return
	}
	d.Stats.Failures.Add(1)
	st.failed++
	wait := backoff(d.cfg.RetryMin, d.cfg.RetryMax, st.failed)
	st.retry = time.Now().Add(wait)
	if st.failed == 1 || st.failed%10 == 0 {
		d.log.Warn("webhook POST failed; retrying", "app", t.id, "url", hc.hook.URL, "err", err, "failures", st.failed, "retry_in", wait, "events", len(st.batch))
	}
	d.expire(t, st, hc, err)
}

// runIO runs the database work handed to it in order; each job returns
// what to apply on the delivery goroutine.
func (st *dstate) runIO(done chan struct{}) {
	defer close(done)
	for job := range st.jobs {
		apply := job()
		st.mu.Lock()
		st.results = append(st.results, apply)
		st.mu.Unlock()
		select {
		case st.wake <- struct{}{}:
		default:
		}
	}
}

// apply runs the outcomes of finished database work (delivery goroutine).
func (st *dstate) apply() {
	st.mu.Lock()
	rs := st.results
	st.results = nil
	st.mu.Unlock()
	for _, f := range rs {
		f()
	}
}

// gather moves what Committed queued into the rooms' pending events.
func (d *Dispatcher) gather(t *target, st *dstate) {
	t.mu.Lock()
	q, spill := t.queue, t.spill
	t.queue, t.spill = nil, nil
	t.mu.Unlock()
	now := time.Now()
	for key, seq := range spill {
		// Not held: known owed, read from the store when its turn comes.
		// Not "handed" either (fill would wait for it to arrive).
		r := st.room(key, 0)
		r.active = now
		r.last = max(r.last, seq)
	}
	if len(q) == 0 {
		return
	}
	d.Stats.Owed.Add(-int64(len(q)))
	for i := range q {
		ev := q[i]
		r := st.room(ev.key, 0)
		r.active, r.handed = now, now
		r.last = max(r.last, ev.seq)
		if r.leased && ev.seq <= r.delivered || now.Before(r.skip) {
			st.free(q[i : i+1])
			continue
		}
		if n := len(r.pending); n > 0 && ev.seq <= r.pending[n-1].seq {
			st.free(q[i : i+1])
			continue
		}
		r.pending = append(r.pending, ev)
	}
}

func (st *dstate) room(key string, id int64) *room {
	r := st.rooms[key]
	if r == nil {
		r = &room{key: key, id: id}
		st.rooms[key] = r
		st.order = append(st.order, r)
	}
	st.setID(r, id)
	return r
}

func (st *dstate) setID(r *room, id int64) {
	if r.id == 0 && id != 0 {
		r.id = id
		st.byID[id] = r
	}
}

func (st *dstate) forget(r *room) {
	if st.rooms[r.key] == r {
		delete(st.rooms, r.key)
	}
	if st.byID[r.id] == r {
		delete(st.byID, r.id)
	}
	st.dropPending(r)
	r.gone, r.leased = true, false
}

func (st *dstate) dropPending(r *room) {
	st.free(r.pending)
	clear(r.pending)
	r.pending = nil
}

// sweep asks the store (off the delivery goroutine) for owed rooms this
// node may claim: another node's publishes, a crashed node's rooms, events
// this node dropped.
func (d *Dispatcher) sweep(t *target, st *dstate) {
	if st.sweeping {
		return
	}
	st.sweeping = true
	trim := false
	if h := t.cfg.Load().hook; (h.WantsPresence() || h.WantsConnection()) && time.Since(st.trimmed) >= trimEvery {
		st.trimmed, trim = time.Now(), true
	}
	st.jobs <- func() func() {
		ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
		defer cancel()
		if trim {
			if _, err := d.cfg.Store.TrimHookEvents(ctx, t.id, 10_000); err != nil {
				d.log.Warn("webhook: cannot trim delivered connection events", "app", t.id, "err", err)
			}
		}
		hs, err := d.cfg.Store.OwedHookRooms(ctx, t.id, d.cfg.Owner, 1000)
		return func() {
			st.sweeping = false
			if err != nil {
				d.log.Warn("webhook: cannot read owed rooms", "app", t.id, "err", err)
				return
			}
			d.swept(t, st, hs)
		}
	}
}

func (d *Dispatcher) swept(t *target, st *dstate, hs []persist.HookRoom) {
	hc := t.cfg.Load()
	now := time.Now()
	for _, h := range hs {
		if _, name := proto.SplitKey(h.Key); !hc.hook.Wants(name) {
			continue
		}
		r, known := st.rooms[h.Key]
		if !known {
			// Found by the sweep, not committed here: the node that
			// committed it is about to claim it, so wait a sweep before
			// taking it (one still owed then is really nobody's).
			r = st.room(h.Key, h.ID)
			r.grace = now.Add(d.cfg.Sweep)
		}
		r.last = max(r.last, h.Last)
		r.active = now
		if !r.leased {
			r.delivered = max(r.delivered, h.Delivered)
		}
	}
}

// housekeep renews the leases of rooms that still owe something and gives
// up those of rooms idle for cfg.Idle.
func (d *Dispatcher) housekeep(t *target, st *dstate, now time.Time) {
	st.order = slices.DeleteFunc(st.order, func(r *room) bool { return r.gone })
	st.next = 0
	if st.flushing {
		return
	}
	var renew, release []*room
	for _, r := range st.order {
		switch {
		case !r.leased, r.dirty:
		case !r.owed() && now.Sub(r.active) >= d.cfg.Idle:
			release = append(release, r)
		case now.Sub(r.renewed) >= d.cfg.Lease/3:
			renew = append(renew, r)
		}
	}
	if len(renew) > 0 {
		d.cursor(t, st, renew, false)
	}
	if len(release) > 0 {
		d.cursor(t, st, release, true)
		for _, r := range release {
			if !r.owed() {
				st.forget(r)
			}
		}
	}
}

// releaseAll gives up every lease (the node is stopping: another node, or
// this one restarted, takes the rooms at once).
func (d *Dispatcher) releaseAll(t *target, st *dstate) {
	var rs []*room
	for _, r := range st.order {
		if r.leased {
			rs = append(rs, r)
		}
	}
	if len(rs) > 0 {
		d.cursor(t, st, rs, true)
	}
}

// cursor writes the rooms' cursors (renewing, or releasing, their leases)
// and learns their newest seqs; a room whose lease was lost is forgotten.
func (d *Dispatcher) cursor(t *target, st *dstate, rs []*room, release bool) {
	ids := make([]int64, len(rs))
	ds := make([]uint64, len(rs))
	for i, r := range rs {
		ids[i], ds[i] = r.id, r.delivered
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	hs, err := d.cfg.Store.AdvanceHookRooms(ctx, d.cfg.Owner, d.cfg.Lease, ids, ds, release)
	if err != nil {
		// The cursors stay where they were: those events are sent again
		// (at least once), by this node or, once the lease runs out,
		// another.
		d.log.Warn("webhook: cannot write cursors", "app", t.id, "err", err)
		return
	}
	now := time.Now()
	got := make(map[int64]persist.HookRoom, len(hs))
	for _, h := range hs {
		got[h.ID] = h
	}
	for _, r := range rs {
		h, ok := got[r.id]
		if !ok {
			d.lost(st, r)
			continue
		}
		r.last = max(r.last, h.Last)
		r.renewed = now
		if release {
			r.leased = false
		}
	}
}

// lost forgets a room another node took: what this node held of it is
// owed in the store, and that node delivers it, so nothing is dropped.
func (d *Dispatcher) lost(st *dstate, r *room) {
	st.forget(r)
}

// claim takes the leases of the owed rooms not held yet, in one statement.
func (d *Dispatcher) claim(t *target, st *dstate) {
	var want []*room
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	now := time.Now()
	for _, r := range st.order {
		if r.gone || r.leased || !r.owed() || now.Before(r.skip) || now.Before(r.grace) && len(r.pending) == 0 {
			continue
		}
		if r.id == 0 {
			id, ok, err := d.cfg.Store.HookRoomID(ctx, r.key)
			if err != nil {
				d.log.Warn("webhook: cannot look a room up", "app", t.id, "room", r.key, "err", err)
				continue
			}
			if !ok {
				d.log.Error("BUG: webhook: a committed room is not in the store", "app", t.id, "room", r.key)
				st.forget(r)
				continue
			}
			st.setID(r, id)
		}
		want = append(want, r)
	}
	if len(want) == 0 {
		return
	}
	ids := make([]int64, len(want))
	for i, r := range want {
		ids[i] = r.id
	}
	hs, err := d.cfg.Store.ClaimHookRooms(ctx, d.cfg.Owner, d.cfg.Lease, ids)
	if err != nil {
		d.log.Warn("webhook: cannot claim rooms", "app", t.id, "err", err)
		return
	}
	got := make(map[int64]persist.HookRoom, len(hs))
	for _, h := range hs {
		got[h.ID] = h
	}
	for _, r := range want {
		h, ok := got[r.id]
		if !ok {
			// Another node delivers the room: it reads what this node
			// committed from the store. This node asks again later, in
			// case that node gives the room up with something left.
			// Nothing is lost: not counted as dropped.
			st.dropPending(r)
			r.skip = now.Add(keepEvery)
			continue
		}
		r.leased, r.renewed = true, now
		r.delivered = h.Delivered
		r.last = max(r.last, h.Last)
		st.trim(r)
	}
}

// trim drops pending events at or below the cursor.
func (st *dstate) trim(r *room) {
	i := 0
	for i < len(r.pending) && r.pending[i].seq <= r.delivered {
		i++
	}
	if i > 0 {
		st.free(r.pending[:i])
		clear(r.pending[:i])
		r.pending = r.pending[i:]
		if len(r.pending) == 0 {
			r.pending = nil
		}
	}
}

// fill builds the next batch from the leased rooms, in rotating order:
// each room's events in seq order, from memory when they follow the
// cursor, from the store otherwise. It reports whether there is a batch.
func (d *Dispatcher) fill(t *target, st *dstate) bool {
	now := time.Now()
	clear(st.batch)
	st.batch, st.spans = st.batch[:0], st.spans[:0]
	size := 0
	n := len(st.order)
	for k := 0; k < n && len(st.batch) < d.cfg.MaxBatch && size < d.cfg.MaxBatchBytes; k++ {
		r := st.order[(st.next+k)%n]
		if !r.leased || !r.owed() {
			continue
		}
		st.trim(r)
		sp := span{r: r, lo: len(st.batch), upto: r.delivered}
		if len(r.pending) > 0 && r.pending[0].seq == r.delivered+1 {
			for _, ev := range r.pending {
				if ev.seq != sp.upto+1 || len(st.batch) >= d.cfg.MaxBatch || size+len(ev.frame) > d.cfg.MaxBatchBytes && len(st.batch) > 0 {
					break
				}
				st.batch = append(st.batch, ev)
				size += len(ev.frame) + 1
				sp.upto = ev.seq
			}
		} else {
			// A gap before what this node holds: read it.
			upto := r.last
			if len(r.pending) > 0 {
				upto = r.pending[0].seq - 1
			} else if r.leased && now.Sub(r.handed) < inFlight {
				// The store is ahead of what was handed over, and this
				// node committed in the room just now: the newest events
				// are most likely on their way here from the commit (the
				// broker comes first), so wait for them rather than read
				// them back.
				continue
			}
			if upto <= r.delivered {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
			msgs, more, err := d.cfg.Store.Range(ctx, r.key, r.delivered, upto, persist.Bounds{Limit: d.cfg.MaxBatch - len(st.batch), MaxBytes: max(d.cfg.MaxBatchBytes-size, 1)})
			cancel()
			if err != nil {
				d.log.Warn("webhook: cannot read owed messages", "app", t.id, "room", r.key, "err", err)
				continue
			}
			sp.fromDB = true
			events := isEventsRoom(r.key)
			for i := range msgs {
				m := &msgs[i]
				var b []byte
				if events {
					b = m.Body // a connection event: its object is the body (connevents.go)
				} else {
					b = proto.AppendMsgJSON(make([]byte, 0, persist.MsgSize(m)), m)
				}
				st.batch = append(st.batch, event{key: r.key, seq: m.Seq, ts: m.TS, frame: b})
				size += len(b) + 1
				sp.upto = m.Seq
			}
			d.Stats.Read.Add(uint64(len(msgs)))
			if !more {
				// Seqs retention removed are simply skipped.
				sp.upto = upto
			}
		}
		if sp.upto > r.delivered {
			sp.hi = len(st.batch)
			st.spans = append(st.spans, sp)
		}
	}
	if n > 0 {
		st.next = (st.next + 1) % n
	}
	return len(st.spans) > 0
}

// advance moves the cursors of a delivered batch in memory; flush
// writes them.
func (d *Dispatcher) advance(st *dstate) {
	for _, sp := range st.spans {
		sp.r.delivered = max(sp.r.delivered, sp.upto)
		st.trim(sp.r)
		if !sp.r.dirty {
			sp.r.dirty = true
			st.dirty = append(st.dirty, sp.r)
		}
	}
}

// flush writes the cursors moved since the last write, in one statement,
// off the delivery goroutine. Writing at most every CursorEvery rather
// than after every POST keeps a fast receiver (many small POSTs) from
// costing the database a statement per POST; a crash sends at most that
// much again.
func (d *Dispatcher) flush(t *target, st *dstate) {
	if st.flushing || len(st.dirty) == 0 {
		return
	}
	st.wrote = time.Now()
	ids := make([]int64, len(st.dirty))
	ds := make([]uint64, len(st.dirty))
	for i, r := range st.dirty {
		ids[i], ds[i] = r.id, r.delivered
		r.dirty = false
	}
	st.dirty = st.dirty[:0]
	st.flushing = true
	st.jobs <- func() func() {
		ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
		defer cancel()
		hs, err := d.cfg.Store.AdvanceHookRooms(ctx, d.cfg.Owner, d.cfg.Lease, ids, ds, false)
		return func() {
			st.flushing = false
			if err != nil {
				// Written with the next flush; a crash before sends these
				// events again (at least once).
				d.log.Warn("webhook: cannot write cursors", "app", t.id, "err", err)
				for _, id := range ids {
					if r := st.byID[id]; r != nil && !r.dirty {
						r.dirty = true
						st.dirty = append(st.dirty, r)
					}
				}
				return
			}
			got := make(map[int64]persist.HookRoom, len(hs))
			for _, h := range hs {
				got[h.ID] = h
			}
			now := time.Now()
			for _, id := range ids {
				r := st.byID[id]
				if r == nil {
					continue
				}
				h, ok := got[id]
				if !ok {
					d.lost(st, r)
					continue
				}
				r.last = max(r.last, h.Last)
				r.renewed = now
			}
		}
	}
}

// expire turns the events of a failed batch older than the app's max age
// into dead letters, one per room, each moving its room's cursor past them
// in the same transaction.
func (d *Dispatcher) expire(t *target, st *dstate, hc *hookCfg, cause error) {
	now := time.Now().UnixMilli()
	var keep []*room
	for _, sp := range st.spans {
		evs := st.batch[sp.lo:sp.hi]
		if len(evs) == 0 || now-evs[0].ts < hc.maxAge.Milliseconds() {
			keep = append(keep, sp.r)
			continue
		}
		b := []byte{'['}
		for i := range evs {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendEvent(b, &evs[i])
		}
		b = append(b, ']')
		ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
		ok, err := d.cfg.Store.AddDeadLetter(ctx, d.cfg.Owner, sp.r.id, sp.r.key, evs[0].seq, sp.upto, cause.Error(), b, len(evs))
		cancel()
		switch {
		case err != nil:
			d.log.Warn("webhook: cannot record a dead letter", "app", t.id, "room", sp.r.key, "err", err)
		case !ok:
			d.lost(st, sp.r)
		default:
			d.Stats.Dead.Add(uint64(len(evs)))
			d.log.Warn("webhook events past the max age are dead letters (roost webhook dead, roost webhook replay)", "app", t.id, "room", sp.r.key, "from", evs[0].seq, "to", sp.upto, "max_age", hc.maxAge)
			sp.r.delivered = max(sp.r.delivered, sp.upto)
			st.trim(sp.r)
			st.retry = time.Time{} // the next events may be fresh: try them now
		}
	}
	// The rooms still failing keep their leases through the backoff.
	var renew []*room
	for _, r := range keep {
		if _, ok := st.rooms[r.key]; ok && time.Since(r.renewed) >= d.cfg.Lease/3 {
			renew = append(renew, r)
		}
	}
	if len(renew) > 0 {
		d.cursor(t, st, renew, false)
	}
}
