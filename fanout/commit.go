package fanout

import (
	"context"
	"errors"
	"hash/maphash"
	"log/slog"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
)

// PoolConfig sizes the publish pool. Zero fields take their defaults.
type PoolConfig struct {
	// Workers: goroutines, each owning a shard of rooms and at most one
	// commit in flight; default 1. Every commit costs the store a fixed
	// overhead (PostgreSQL: ~250 µs of CPU for the transaction and its WAL
	// flush, against ~15 µs per publish), so at moderate load one worker's
	// full commits cost less than several workers' thin ones; more workers
	// only pay off when one PostgreSQL backend is the limit.
	Workers int
	// MaxBatch: publishes per CommitBatch; default 256 (a spread commit's
	// parts are about this size, see Spread).
	MaxBatch int
	// MinFill: a batch of at least this many publishes is committed
	// without waiting for more; default 48. Over 1,000 rooms PostgreSQL
	// spends ~20 µs per publish plus the commit's fixed cost: a batch of
	// 48 brings the total to ~27 µs, one of 5 to ~60 µs.
	MinFill int
	// Window: the longest a smaller batch may wait for company, counted
	// from its first publish (so it overlaps the commit in flight);
	// default 10ms, <0 means never wait. How long a batch actually waits
	// depends on the rate its worker sees (see holdUntil): the whole
	// window only where the window brings MinFill publishes (from 4,800/s
	// with the defaults), a share of it below, nothing where no company
	// is due.
	Window time.Duration
	// Spread: while a commit is in flight, a backlog may gather up to
	// Spread × MaxBatch publishes; such a batch is split by room into up
	// to Spread commits of about MaxBatch each that run in parallel on as
	// many connections; default 4. Moderate load never gathers more than
	// MaxBatch, so it keeps one commit in flight per worker; saturation
	// gets the parallelism of several PostgreSQL backends. 1 disables it.
	Spread   int
	QueueLen int           // queued publishes per worker before Publish says proto.ErrOverloaded; default 8192
	Timeout  time.Duration // per CommitBatch; default 5s
	// Logger gets failed commits and refused publishes, at most one line
	// of each a second; default slog.Default().
	Logger *slog.Logger

	// reads: coalesced read marks for the next commit to write in its
	// transaction (readpos.go); nil: none.
	reads *readHandoff
}

func (c *PoolConfig) setDefaults() {
	if c.Workers <= 0 {
		c.Workers = 1
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = 256
	}
	if c.MinFill <= 0 {
		c.MinFill = 48
	}
	c.MinFill = min(c.MinFill, c.MaxBatch)
	if c.Window == 0 {
		c.Window = 10 * time.Millisecond
	}
	if c.Spread <= 0 {
		c.Spread = 4
	}
	if c.QueueLen <= 0 {
		c.QueueLen = 8192
	}
	if c.Timeout <= 0 {
		c.Timeout = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// BatchBuckets are the upper bounds of the batch-size histogram in
// PoolStats.BatchSizes; the last bucket counts everything above 256.
var BatchBuckets = [...]int{1, 2, 4, 8, 16, 32, 64, 128, 256}

// PoolStats is a snapshot of the pool's counters for metrics.
type PoolStats struct {
	Batches      uint64 // CommitBatch calls that succeeded
	Requests     uint64 // publishes answered (committed, duplicate or failed)
	Duplicates   uint64 // publishes answered as duplicates
	CommitErrors uint64 // CommitBatch calls that failed
	// Refused: publishes the store refused on their own: a failed group
	// commit was split until the failing publish stood alone.
	Refused  uint64
	Rejected uint64 // publishes refused with proto.ErrOverloaded (queue full)
	// BatchSizes[i] counts committed batches of size <= BatchBuckets[i]
	// (and > the previous bound); the last element counts larger ones.
	BatchSizes [len(BatchBuckets) + 1]uint64
	// QueueDepth: publishes submitted and not answered yet (queued,
	// gathered into the next batch, or in the commit in flight).
	QueueDepth int
}

// pool is the publish path's group commit: submit, gather, commit through
// the Store, encode once, answer. Each worker owns the rooms whose key
// hashes to it, so the order of a room's publishes is the order of submit
// calls for it, and a room's CommitBatch calls never run concurrently on
// one node.
//
// A worker is a pipeline of three goroutines: a gatherer that collects the
// next batch, a committer that runs one CommitBatch at a time, and an
// answerer that encodes each new message's frame once and hands the batch
// to done (Node.committed: the broker, the hook, the sources). The next
// batch fills while the previous one commits, and a commit overlaps the
// answering of the one before; batches pass each stage in order, so a
// room's results stay in seq order.
//
// done gets one batch per call, in batch order per worker; the slice is
// the worker's scratch, valid during the call only, and each request
// belongs to done from the call on. A request with Err set never carries
// a seq or a frame: nothing was acknowledged as stored.
//
// submit and stats may be called from any goroutine; close once.
type pool struct {
	st      persist.Store
	done    func(batch []*PubRequest)
	cfg     PoolConfig
	workers []*worker
	seed    maphash.Seed

	// close must not strand a request that a concurrent submit is
	// enqueueing: submit counts itself in submitting before checking closed,
	// and close waits for the count to drain after setting closed.
	closed     atomic.Bool
	submitting atomic.Int64
	stop       chan struct{}
	wg         sync.WaitGroup

	batches      atomic.Uint64
	requests     atomic.Uint64
	duplicates   atomic.Uint64
	commitErrors atomic.Uint64
	refused      atomic.Uint64
	rejected     atomic.Uint64

	// Unix ns of the latest log line of each kind (throttle), and what
	// was not logged since.
	errLogged, refusedLogged atomic.Int64
	errQuiet, refusedQuiet   atomic.Uint64
	batchSizes               [len(BatchBuckets) + 1]atomic.Uint64
}

type worker struct {
	p *pool
	q chan *PubRequest

	// Gatherer only.
	cur      *batchSlot // the batch being gathered
	firstAt  time.Time  // when cur.batch[0] was taken
	lastHand time.Time  // the previous hand-off
	seen     arrivals   // publishes per hand-off interval, for the rate
	timer    *time.Timer
	idleAt   time.Duration // when the gatherer last took the idle token (Stamp)

	// The pipeline: todo carries a gathered batch to the committer, which
	// passes it on through committed to the answerer. idle holds a token
	// while no commit is in flight; free holds the slots nobody uses.
	todo      chan *batchSlot
	committed chan *batchSlot
	idle      chan struct{}
	free      chan *batchSlot
	held      atomic.Int64 // requests out of q and not answered yet

	// Committer only: the shares of a spread commit, the first run by the
	// committer itself, the others by helpers fed through spread.
	parts  []*part
	spread chan *part

	// Answerer only.
	arena []byte // current frame chunk: frames are carved from arena[len:cap]
}

// batchSlot is one batch, passed down the pipeline: the requests, and
// their Rows as the store takes them (rows[i] is &batch[i].Row). The
// results land in the requests themselves.
type batchSlot struct {
	batch []*PubRequest
	rows  []*persist.Row
	ok    bool // the commit succeeded
}

// newPool starts cfg.Workers workers committing to st and handing each
// answered batch to done.
func newPool(st persist.Store, done func(batch []*PubRequest), cfg PoolConfig) *pool {
	cfg.setDefaults()
	p := &pool{st: st, done: done, cfg: cfg, stop: make(chan struct{}), seed: maphash.MakeSeed()}
	p.workers = make([]*worker, cfg.Workers)
	for i := range p.workers {
		// Three slots: one gathering, one committing, one being answered.
		const slots = 3
		w := &worker{
			p:         p,
			q:         make(chan *PubRequest, cfg.QueueLen),
			timer:     time.NewTimer(time.Hour),
			seen:      newArrivals(cfg.Window),
			todo:      make(chan *batchSlot),
			committed: make(chan *batchSlot, 1),
			idle:      make(chan struct{}, 1),
			free:      make(chan *batchSlot, slots),
		}
		w.timer.Stop()
		w.idle <- struct{}{}
		for range slots {
			w.free <- &batchSlot{batch: make([]*PubRequest, 0, cfg.MaxBatch*cfg.Spread), rows: make([]*persist.Row, 0, cfg.MaxBatch*cfg.Spread)}
		}
		w.cur = <-w.free
		w.spread = make(chan *part)
		for range cfg.Spread {
			// A part holds whatever its rooms brought: up to the whole batch.
			w.parts = append(w.parts, &part{rows: make([]*persist.Row, 0, cfg.MaxBatch*cfg.Spread)})
		}
		p.workers[i] = w
		p.wg.Add(3 + cfg.Spread - 1)
		go w.gather()
		go w.commitLoop()
		go w.answerLoop()
		for range cfg.Spread - 1 {
			go w.spreadLoop()
		}
	}
	return p
}

// submit queues req for its room's worker without blocking. On success the
// pool owns req until it hands it to done; on error the caller keeps it.
// proto.ErrOverloaded: that worker's queue is full. proto.ErrClosed: close
// was called.
func (p *pool) submit(req *PubRequest) error {
	p.submitting.Add(1)
	defer p.submitting.Add(-1)
	if p.closed.Load() {
		return proto.ErrClosed
	}
	w := p.workers[p.roomHash(req.Key)%uint32(len(p.workers))]
	select {
	case w.q <- req:
		return nil
	default:
		p.rejected.Add(1)
		return proto.ErrOverloaded
	}
}

// close stops accepting publishes, commits and delivers everything already
// queued, and returns when every worker has finished. It does not close the
// store.
func (p *pool) close() {
	if p.closed.Swap(true) {
		return
	}
	for p.submitting.Load() != 0 {
		runtime.Gosched()
	}
	close(p.stop)
	p.wg.Wait()
}

// stats returns the pool's counters; it takes no lock.
func (p *pool) stats() PoolStats {
	s := PoolStats{
		Batches:      p.batches.Load(),
		Requests:     p.requests.Load(),
		Duplicates:   p.duplicates.Load(),
		CommitErrors: p.commitErrors.Load(),
		Refused:      p.refused.Load(),
		Rejected:     p.rejected.Load(),
	}
	for i := range p.batchSizes {
		s.BatchSizes[i] = p.batchSizes[i].Load()
	}
	for _, w := range p.workers {
		s.QueueDepth += len(w.q) + int(w.held.Load())
	}
	return s
}

// Backoff after a failed commit, so an unreachable database is not
// hammered while the queued publishes wait (new ones are refused with
// proto.ErrOverloaded once the queue is full).
const (
	minBackoff = 10 * time.Millisecond
	maxBackoff = 500 * time.Millisecond
)

// gather is the worker's gatherer goroutine: it fills the next batch and
// hands it to the committer when no commit is in flight and the batch is
// ready (see ready). After Close it drains the queue without waiting.
func (w *worker) gather() {
	defer w.p.wg.Done()
	// While a commit is in flight a backlog may gather up to Spread full
	// commits' worth.
	limit := w.p.cfg.MaxBatch * w.p.cfg.Spread
	stop := w.p.stop
	closing := false
	// A hand-off needs the idle token (no commit in flight) and next, a
	// free slot to gather the following batch into.
	var next *batchSlot
	idle := false
	for {
		// Fast path: take what is queued.
	queued:
		for len(w.cur.batch) < limit {
			select {
			case r := <-w.q:
				w.add(r)
			default:
				break queued
			}
		}
		if !idle {
			select {
			case <-w.idle:
				idle, w.idleAt = true, Stamp()
			default:
			}
		}
		if next == nil {
			select {
			case next = <-w.free:
			default:
			}
		}
		var at time.Time // when the batch is due if nothing else arrives
		if len(w.cur.batch) > 0 && idle && next != nil {
			now := time.Now()
			at = w.commitAt(now)
			if closing || !now.Before(at) {
				w.handOff(now)
				w.cur, next, idle = next, nil, false
				continue
			}
		}
		if closing && len(w.cur.batch) == 0 {
			// submit can no longer enqueue and the queue is empty: let the
			// commit in flight finish, then stop the pipeline behind it.
			if !idle {
				<-w.idle
			}
			close(w.todo)
			return
		}
		// Slow path: wait for a publish, the pipeline, the window or Close.
		qc := w.q
		if len(w.cur.batch) >= limit {
			qc = nil
		}
		var ic <-chan struct{}
		if !idle {
			ic = w.idle
		}
		var fc <-chan *batchSlot
		if next == nil {
			fc = w.free
		}
		var tc <-chan time.Time
		if !at.IsZero() {
			// Not due yet: waiting for company until at (each publish
			// that comes in the meantime moves it).
			w.timer.Reset(time.Until(at))
			tc = w.timer.C
		}
		select {
		case r := <-qc:
			w.add(r)
		case <-ic:
			idle, w.idleAt = true, Stamp()
		case next = <-fc:
		case <-tc:
		case <-stop:
			closing, stop = true, nil
		}
		if tc != nil {
			w.timer.Stop()
		}
	}
}

func (w *worker) add(r *PubRequest) {
	if len(w.cur.batch) == 0 {
		w.firstAt = time.Now()
	}
	w.cur.batch = append(w.cur.batch, r)
	w.cur.rows = append(w.cur.rows, &r.Row)
	w.held.Add(1)
	r.Taken = Stamp()
}

// commitAt returns when the gathered batch is due for commit, given that
// no commit is in flight and nothing else arrives before: a time not after
// now means at once. See holdUntil for the rule.
func (w *worker) commitAt(now time.Time) time.Time {
	n := len(w.cur.batch)
	return w.p.cfg.holdUntil(n, w.firstAt, w.seen.rate(n, now.Sub(w.lastHand)))
}

// holdUntil is the commit rule: when a batch of n publishes whose first
// was taken at first is committed, for a worker that sees rate publishes/s
// and has no commit in flight (a batch always waits for the commit in
// flight, and gathers meanwhile).
//
// A commit costs PostgreSQL a fixed ~250–400 µs of CPU besides ~17 µs per
// publish, so waiting for company pays most where it makes a batch of
// MinFill (its fixed cost is then under a third of the total); a batch the
// window cannot fill stays expensive however long it waits, and holding it
// then costs latency for a small saving. So:
//
//   - n ≥ MinFill: at once.
//   - Otherwise the hold is the window scaled by the share of MinFill
//     the window brings at this rate: hold = Window × min(1, rate ×
//     Window / MinFill). At 4,800/s and more (defaults) that is the whole
//     window, and the batch goes when it fills; at 1,500/s 3.1 ms.
//   - The batch goes once not even one more publish is due before the
//     hold ends: at first + hold − 1/rate (1,500/s: 2.5 ms; 1,000/s:
//     1.1 ms). Below ~700/s (defaults) that is never later than first,
//     so a lone publish, or the first after a pause, goes at once.
//
// The result is never after first + Window.
func (c *PoolConfig) holdUntil(n int, first time.Time, rate float64) time.Time {
	if n >= c.MinFill || c.Window < 0 || rate <= 0 {
		return first
	}
	win := c.Window.Seconds()
	hold := win * min(1, rate*win/float64(c.MinFill))
	hold -= 1 / rate
	if hold <= 0 {
		return first
	}
	return first.Add(time.Duration(hold * float64(time.Second)))
}

// arrivals estimates a worker's publish rate from the batches it handed
// off: publishes and seconds per hand-off interval, summed with older
// intervals weighing less (each hand-off multiplies the past by
// arrivalDecay, so about the last eight count, and silence fades the past
// too, see rate).
type arrivals struct {
	n, secs float64
	// fade: the silence after which the past weighs 1/e of its value
	// (4 × Window), and the longest interval handOff counts (2 × Window).
	fade, maxSpan time.Duration
}

const arrivalDecay = 7.0 / 8

func newArrivals(window time.Duration) arrivals {
	window = max(window, time.Millisecond)
	return arrivals{fade: 4 * window, maxSpan: 2 * window}
}

// handOff records an interval of span that brought n publishes. A span
// counts up to maxSpan: a pause is a fact about the past, and once
// publishes come again the estimate should follow them within a few
// batches rather than stay depressed by it. (While it lasts, the pause
// counts in full, see rate.)
func (a *arrivals) handOff(n int, span time.Duration) {
	a.n = a.n*arrivalDecay + float64(n)
	a.secs = a.secs*arrivalDecay + min(span, a.maxSpan).Seconds()
}

// rate is the publishes/s seen, counting the current interval (since the
// last hand-off, n publishes so far) in full and the past less the longer
// the current interval has been: the longer nothing comes, the lower the
// rate, so the first publish after a pause does not wait for company.
func (a *arrivals) rate(n int, since time.Duration) float64 {
	f := arrivalDecay * math.Exp(-float64(since)/float64(a.fade))
	secs := a.secs*f + since.Seconds()
	if secs <= 0 {
		return 0
	}
	return (a.n*f + float64(n)) / secs
}

// handOff gives the gathered batch to the committer.
func (w *worker) handOff(now time.Time) {
	if !w.lastHand.IsZero() {
		w.seen.handOff(len(w.cur.batch), now.Sub(w.lastHand))
	}
	w.lastHand = now
	for h, i := now.Sub(monoEpoch), 0; i < len(w.cur.batch); i++ {
		r := w.cur.batch[i] // the ack's time split (AckPhases)
		r.Idle, r.Handed = max(w.idleAt, r.Taken), h
	}
	w.todo <- w.cur
}

// commitLoop is the worker's committer goroutine: one CommitBatch at a
// time. It passes each batch on to be answered and takes the next one at
// once, so a commit overlaps the encoding and answering of the previous.
func (w *worker) commitLoop() {
	defer w.p.wg.Done()
	defer close(w.committed)
	defer close(w.spread)
	backoff := time.Duration(0)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for sl := range w.todo {
		w.commit(sl)
		for t, i := Stamp(), 0; i < len(sl.batch); i++ {
			sl.batch[i].CommitEnd = t // the ack's time split (AckPhases)
		}
		w.committed <- sl
		if sl.ok {
			backoff = 0
		} else {
			backoff = min(max(2*backoff, minBackoff), maxBackoff)
			timer.Reset(backoff)
			select {
			case <-timer.C:
			case <-w.p.stop:
				timer.Stop()
			}
		}
		w.idle <- struct{}{}
	}
}

// commit stores sl.rows, which hold the results (see store); sl.ok is
// false when the store was unreachable. A batch above MaxBatch means the store is behind: it
// is spread over up to Spread room-disjoint commits of about MaxBatch each
// that run in parallel.
//
// The read marks due now (readHandoff.take) go into the transaction of
// this one (of its first part when spread).
func (w *worker) commit(sl *batchSlot) {
	marks := w.p.cfg.reads.take()
	if n := len(sl.rows); n > w.p.cfg.MaxBatch {
		w.commitSpread(sl, min(len(w.parts), (n+w.p.cfg.MaxBatch-1)/w.p.cfg.MaxBatch), marks)
		return
	}
	sl.ok = w.store(sl.rows, marks)
}

// store commits rows, which get their results. A store that cannot be reached fails
// them all (overloaded: nothing was stored, the clients retry). A store
// that refuses the statement itself (PostgreSQL: a value it cannot take)
// would fail everybody's publishes for one bad request, so the batch is
// split in halves, committed in order (per room, seqs keep the batch's
// order), until the request that fails stands alone: it alone gets the
// error, logged with the reason. Each bad request costs about 2·log2(batch)
// extra commits. It reports false only when the store was unreachable.
//
// marks (nil mostly) are read marks written in the same transaction; a
// failed commit gives them back to the positions goroutine and the rows
// are not tried with them again: a mark never costs a publish.
func (w *worker) store(rows []*persist.Row, marks []persist.ReadMark) bool {
	p := w.p
	for _, r := range rows {
		r.Stored = persist.Stored{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.Timeout)
	var err error
	if len(marks) > 0 {
		err = p.cfg.reads.reads.CommitReads(ctx, rows, marks)
		p.cfg.reads.done(marks, err == nil)
		switch {
		case errors.Is(err, persist.ErrReadsNotSaved):
			err = nil // the rows are stored; the marks go again later
		case err != nil && !isOverload(err) && !errors.Is(err, proto.ErrClosed):
			// Refused with the marks: the rows alone, as if they had come
			// without them.
			err = p.st.CommitBatch(ctx, rows)
		}
	} else {
		err = p.st.CommitBatch(ctx, rows)
	}
	cancel()
	if err == nil {
		p.batches.Add(1)
		p.batchSizes[bucketOf(len(rows))].Add(1)
		return true
	}
	p.commitErrors.Add(1)
	overload := isOverload(err) || errors.Is(err, proto.ErrClosed)
	if !overload && len(rows) > 1 {
		h := len(rows) / 2
		a := w.store(rows[:h], nil)
		b := w.store(rows[h:], nil)
		return a && b
	}
	// Never acknowledge what the store did not confirm, whatever it left
	// in the rows.
	rerr := proto.ErrOverloaded
	if !overload {
		rerr = err
	}
	for _, r := range rows {
		e := r.Err
		if e == nil {
			e = rerr
		}
		r.Stored = persist.Stored{Err: e}
	}
	if overload {
		p.logCommitError(len(rows), err)
		return false
	}
	p.refused.Add(1)
	p.logRefused(rows[0], err)
	return true
}

// throttled reports whether a line may be logged now (one a second per
// kind); quiet counts the ones that were not.
func throttled(last *atomic.Int64, quiet *atomic.Uint64) (ok bool, skipped uint64) {
	now := time.Now().UnixNano()
	l := last.Load()
	if now-l < int64(time.Second) || !last.CompareAndSwap(l, now) {
		quiet.Add(1)
		return false, 0
	}
	return true, quiet.Swap(0)
}

func (p *pool) logCommitError(n int, err error) {
	if ok, skipped := throttled(&p.errLogged, &p.errQuiet); ok {
		p.cfg.Logger.Warn("fanout: group commit failed; its publishes were answered overloaded and are retried by their clients",
			"requests", n, "err", err, "failed_total", p.commitErrors.Load(), "not_logged", skipped)
	}
}

func (p *pool) logRefused(req *persist.Row, err error) {
	if ok, skipped := throttled(&p.refusedLogged, &p.refusedQuiet); ok {
		app, room := proto.SplitKey(req.Key)
		p.cfg.Logger.Warn("fanout: the store refused a publish; only it failed (err internal), the rest of its batch was committed",
			"app", app, "room", room, "from", req.From, "id", string(req.ID),
			"err", err, "refused_total", p.refused.Load(), "not_logged", skipped)
	}
}

// part is one room-disjoint share of a spread commit.
type part struct {
	rows []*persist.Row
	ok   bool
	wg   *sync.WaitGroup
}

// commitSpread splits sl.rows by room over w.parts and commits the parts
// in parallel (each room's publishes stay together and in order); each
// row holds its own result, so nothing is gathered back. A part that
// fails fails alone: the others are stored and acknowledged. The read
// marks go with the first part.
func (w *worker) commitSpread(sl *batchSlot, parts int, marks []persist.ReadMark) {
	k := uint32(parts)
	for _, pt := range w.parts {
		pt.rows = pt.rows[:0]
	}
	for _, r := range sl.rows {
		// The room's worker was chosen by roomHash % Workers; dividing
		// first keeps the parts even when Workers > 1.
		pt := w.parts[(w.p.roomHash(r.Key)/uint32(len(w.p.workers)))%k]
		pt.rows = append(pt.rows, r)
	}
	var wg sync.WaitGroup
	for _, pt := range w.parts[1:] {
		if len(pt.rows) > 0 {
			wg.Add(1)
			pt.wg = &wg
			w.spread <- pt
		}
	}
	first := w.parts[0]
	if len(first.rows) > 0 {
		first.ok = w.store(first.rows, marks)
	} else if marks != nil {
		w.p.cfg.reads.done(marks, false) // back for the next commit
	}
	wg.Wait()
	sl.ok = true
	for _, pt := range w.parts {
		if len(pt.rows) == 0 {
			continue
		}
		sl.ok = sl.ok && pt.ok
		clear(pt.rows) // the slot holds the requests
	}
}

// spreadLoop is one helper goroutine of spread commits.
func (w *worker) spreadLoop() {
	defer w.p.wg.Done()
	for pt := range w.spread {
		pt.ok = w.store(pt.rows, nil)
		pt.wg.Done()
	}
}

// answerLoop is the worker's answerer goroutine: it encodes the frame of
// each new message of a committed batch, once, and hands the batch to
// done, batches in commit order.
func (w *worker) answerLoop() {
	defer w.p.wg.Done()
	p := w.p
	for sl := range w.committed {
		n := len(sl.batch)
		dups := 0
		for _, req := range sl.batch {
			if req.Err == nil {
				if req.Duplicate {
					dups++
				} else {
					req.Frame = w.encode(req)
				}
			}
		}
		p.done(sl.batch)
		clear(sl.batch) // done owns the requests now
		clear(sl.rows)
		w.held.Add(-int64(n))
		p.requests.Add(uint64(n))
		if dups > 0 {
			p.duplicates.Add(uint64(dups))
		}
		sl.batch, sl.rows = sl.batch[:0], sl.rows[:0]
		w.free <- sl
	}
}

// roomHash maps a room key to its worker and to its part of a spread
// commit: cheap and allocation-free.
func (p *pool) roomHash(key string) uint32 {
	return uint32(maphash.String(p.seed, key))
}

func isOverload(err error) bool {
	return errors.Is(err, proto.ErrOverloaded) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, context.Canceled)
}

func bucketOf(n int) int {
	for i, b := range BatchBuckets {
		if n <= b {
			return i
		}
	}
	return len(BatchBuckets)
}

// Frame arena: frames are carved out of arenaChunk-sized chunks so that
// encoding costs no allocation per message. A chunk is never reused: frames
// are shared and immutable, referenced by receivers on every loop until the
// GC frees the chunk with its last frame. A frame larger than
// arenaMaxFrame gets its own allocation instead of wasting a chunk's tail.
const (
	arenaChunk    = 64 << 10
	arenaMaxFrame = arenaChunk / 4
	// frameOverhead bounds the frame bytes besides the escaped fields:
	// WebSocket header (<= 10), the JSON keys and punctuation, two uint64
	// numbers.
	frameOverhead = 160
)

func (w *worker) encode(req *PubRequest) []byte {
	_, room := proto.SplitKey(req.Key)
	// JSON escaping grows a string at most 6× (\u00XX); room names are
	// plain, the body is copied verbatim.
	need := frameOverhead + len(room) + 6*(len(req.ID)+len(req.From)) + len(req.Body)
	if req.Kind != proto.KindMsg {
		need += 64 // "kind" and "ref"
	}
	if need > arenaMaxFrame {
		f := proto.AppendMsgFrameKind(make([]byte, 0, need), room, req.Seq, req.ID, req.From, req.TS, req.Kind, req.Ref, req.Body)
		return f[:len(f):len(f)]
	}
	if cap(w.arena)-len(w.arena) < need {
		w.arena = make([]byte, 0, arenaChunk)
	}
	start := len(w.arena)
	free := w.arena[start:cap(w.arena)]
	out := proto.AppendMsgFrameKind(free[:0], room, req.Seq, req.ID, req.From, req.TS, req.Kind, req.Ref, req.Body)
	if cap(out) == cap(free) && unsafe.SliceData(out) == unsafe.SliceData(free) {
		w.arena = w.arena[:start+len(out)]
	} // else the estimate was short and append moved the frame to its own buffer
	// The cap limit keeps anyone appending to a frame out of the next one.
	return out[:len(out):len(out)]
}
