package persist

import (
	"context"
	"errors"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/roost-chat/roost/proto"
)

// PoolConfig sizes the publish pool. Zero fields take their defaults.
type PoolConfig struct {
	Workers  int           // goroutines, each owning a shard of rooms; default 4
	MaxBatch int           // publishes per CommitBatch; default 256
	Window   time.Duration // after the first publish, wait up to this for more; default 1ms, <0 means do not wait
	QueueLen int           // queued publishes per worker before Submit says proto.ErrOverloaded; default 8192
	Timeout  time.Duration // per CommitBatch; default 5s
	// Logger gets failed commits and refused publishes, at most one line
	// of each a second; default slog.Default().
	Logger *slog.Logger
}

func (c *PoolConfig) setDefaults() {
	if c.Workers <= 0 {
		c.Workers = 4
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = 256
	}
	if c.Window == 0 {
		c.Window = time.Millisecond
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
	Rejected uint64 // Submit calls refused with proto.ErrOverloaded (queue full)
	// BatchSizes[i] counts committed batches of size <= BatchBuckets[i]
	// (and > the previous bound); the last element counts larger ones.
	BatchSizes [len(BatchBuckets) + 1]uint64
	QueueDepth int // publishes waiting in all worker queues now
}

// Pool is the publish goroutine pool with group commit. Each worker owns the
// rooms whose key hashes to it, so the order of a room's publishes is the
// order of Submit calls for it, and a room's CommitBatch calls never run
// concurrently on one node.
//
// Results reach the Sink in batch order per worker. The *proto.PubResult passed to
// Committed points into the worker's scratch and is valid during the call
// only; its Frame is immutable and may be kept and shared forever. A
// result with Err set never carries a seq or a frame: nothing was
// acknowledged as stored.
//
// Submit and Stats may be called from any goroutine; Close once.
type Pool struct {
	st      Store
	sink    Sink
	cfg     PoolConfig
	workers []*worker

	// Close must not strand a request that a concurrent Submit is
	// enqueueing: Submit counts itself in submitting before checking closed,
	// and Close waits for the count to drain after setting closed.
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
	p     *Pool
	q     chan *proto.PubRequest
	batch []*proto.PubRequest
	res   []proto.PubResult
	arena []byte // current frame chunk: frames are carved from arena[len:cap]
}

// NewPool starts cfg.Workers workers committing to st and handing results
// to sink.
func NewPool(st Store, sink Sink, cfg PoolConfig) *Pool {
	cfg.setDefaults()
	p := &Pool{st: st, sink: sink, cfg: cfg, stop: make(chan struct{})}
	p.workers = make([]*worker, cfg.Workers)
	for i := range p.workers {
		w := &worker{
			p:     p,
			q:     make(chan *proto.PubRequest, cfg.QueueLen),
			batch: make([]*proto.PubRequest, 0, cfg.MaxBatch),
			res:   make([]proto.PubResult, cfg.MaxBatch),
		}
		p.workers[i] = w
		p.wg.Add(1)
		go w.run()
	}
	return p
}

// Submit queues req for its room's worker without blocking. On success the
// pool owns req until it hands it to Sink.Committed; on error the caller
// keeps it. proto.ErrOverloaded: that worker's queue is full. proto.ErrClosed: Close was
// called.
func (p *Pool) Submit(req *proto.PubRequest) error {
	p.submitting.Add(1)
	defer p.submitting.Add(-1)
	if p.closed.Load() {
		return proto.ErrClosed
	}
	w := p.workers[hashKey(req.Key)%uint32(len(p.workers))]
	select {
	case w.q <- req:
		return nil
	default:
		p.rejected.Add(1)
		return proto.ErrOverloaded
	}
}

// Close stops accepting publishes, commits and delivers everything already
// queued, and returns when every worker has finished. It does not close the
// store.
func (p *Pool) Close() {
	if p.closed.Swap(true) {
		return
	}
	for p.submitting.Load() != 0 {
		runtime.Gosched()
	}
	close(p.stop)
	p.wg.Wait()
}

// Stats returns the pool's counters; it takes no lock.
func (p *Pool) Stats() PoolStats {
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
		s.QueueDepth += len(w.q)
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

func (w *worker) run() {
	defer w.p.wg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	backoff := time.Duration(0)
	for {
		var first *proto.PubRequest
		select {
		case first = <-w.q:
		case <-w.p.stop:
			// Submit can no longer enqueue: drain what is left, then stop.
			select {
			case first = <-w.q:
			default:
				return
			}
		}
		w.gather(first, timer)
		if w.commit() {
			backoff = 0
			continue
		}
		backoff = min(max(2*backoff, minBackoff), maxBackoff)
		timer.Reset(backoff)
		select {
		case <-timer.C:
		case <-w.p.stop:
			timer.Stop()
		}
	}
}

// gather fills w.batch: first, whatever is queued, then whatever arrives
// within the window, up to MaxBatch.
func (w *worker) gather(first *proto.PubRequest, timer *time.Timer) {
	limit := w.p.cfg.MaxBatch
	w.batch = append(w.batch[:0], first)
queued:
	for len(w.batch) < limit {
		select {
		case r := <-w.q:
			w.batch = append(w.batch, r)
		default:
			break queued
		}
	}
	if len(w.batch) >= limit || w.p.cfg.Window < 0 || w.p.closed.Load() {
		return
	}
	timer.Reset(w.p.cfg.Window)
	for len(w.batch) < limit {
		select {
		case r := <-w.q:
			w.batch = append(w.batch, r)
		case <-timer.C:
			return
		case <-w.p.stop:
			timer.Stop()
			return
		}
	}
	timer.Stop()
}

// commit stores w.batch, answers every request in order, and reports
// whether the store could be reached (false: back off before the next).
func (w *worker) commit() bool {
	p := w.p
	n := len(w.batch)
	res := w.res[:n]
	ok := w.store(w.batch, res)
	dups := 0
	for i, req := range w.batch {
		r := &res[i]
		if r.Err == nil {
			if r.Duplicate {
				dups++
			} else {
				r.Frame = w.encode(req, r)
			}
		}
		p.sink.Committed(req, r)
		w.batch[i] = nil // the sink owns req now
	}
	p.requests.Add(uint64(n))
	if dups > 0 {
		p.duplicates.Add(uint64(dups))
	}
	return ok
}

// store commits reqs and fills res. A store that cannot be reached fails
// them all (overloaded: nothing was stored, the clients retry). A store
// that refuses the statement itself (PostgreSQL: a value it cannot take)
// would fail everybody's publishes for one bad request, so the batch is
// split in halves, committed in order (per room, seqs keep the batch's
// order), until the request that fails stands alone: it alone gets the
// error, logged with the reason. Each bad request costs about 2·log2(batch)
// extra commits. It reports false only when the store was unreachable.
func (w *worker) store(reqs []*proto.PubRequest, res []proto.PubResult) bool {
	p := w.p
	clear(res)
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.Timeout)
	err := p.st.CommitBatch(ctx, reqs, res)
	cancel()
	if err == nil {
		p.batches.Add(1)
		p.batchSizes[bucketOf(len(reqs))].Add(1)
		return true
	}
	p.commitErrors.Add(1)
	overload := isOverload(err) || errors.Is(err, proto.ErrClosed)
	if !overload && len(reqs) > 1 {
		h := len(reqs) / 2
		a := w.store(reqs[:h], res[:h])
		b := w.store(reqs[h:], res[h:])
		return a && b
	}
	// Never acknowledge what the store did not confirm, whatever it left
	// in res.
	rerr := proto.ErrOverloaded
	if !overload {
		rerr = err
	}
	for i := range res {
		e := res[i].Err
		if e == nil {
			e = rerr
		}
		res[i] = proto.PubResult{Err: e}
	}
	if overload {
		p.logCommitError(len(reqs), err)
		return false
	}
	p.refused.Add(1)
	p.logRefused(reqs[0], err)
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

func (p *Pool) logCommitError(n int, err error) {
	if ok, skipped := throttled(&p.errLogged, &p.errQuiet); ok {
		p.cfg.Logger.Warn("persist: group commit failed; its publishes were answered overloaded and are retried by their clients",
			"requests", n, "err", err, "failed_total", p.commitErrors.Load(), "not_logged", skipped)
	}
}

func (p *Pool) logRefused(req *proto.PubRequest, err error) {
	if ok, skipped := throttled(&p.refusedLogged, &p.refusedQuiet); ok {
		app, room := proto.SplitKey(req.Key)
		p.cfg.Logger.Warn("persist: the store refused a publish; only it failed (err internal), the rest of its batch was committed",
			"app", app, "room", room, "from", req.From, "id", string(req.ID),
			"err", err, "refused_total", p.refused.Load(), "not_logged", skipped)
	}
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

func (w *worker) encode(req *proto.PubRequest, res *proto.PubResult) []byte {
	_, room := proto.SplitKey(req.Key)
	// JSON escaping grows a string at most 6× (\u00XX); room names are
	// plain, the body is copied verbatim.
	need := frameOverhead + len(room) + 6*(len(req.ID)+len(req.From)) + len(req.Body)
	if need > arenaMaxFrame {
		f := proto.AppendMsgFrame(make([]byte, 0, need), room, res.Seq, req.ID, req.From, res.TS, req.Body)
		return f[:len(f):len(f)]
	}
	if cap(w.arena)-len(w.arena) < need {
		w.arena = make([]byte, 0, arenaChunk)
	}
	start := len(w.arena)
	free := w.arena[start:cap(w.arena)]
	out := proto.AppendMsgFrame(free[:0], room, res.Seq, req.ID, req.From, res.TS, req.Body)
	if cap(out) == cap(free) && unsafe.SliceData(out) == unsafe.SliceData(free) {
		w.arena = w.arena[:start+len(out)]
	} // else the estimate was short and append moved the frame to its own buffer
	// The cap limit keeps anyone appending to a frame out of the next one.
	return out[:len(out):len(out)]
}

// requestPool recycles PubRequests with their ID and Body buffers.
var requestPool = sync.Pool{New: func() any { return new(proto.PubRequest) }}

// maxPooledBody caps the Body capacity kept by PutRequest so one huge
// publish does not pin its buffer in the pool forever.
const maxPooledBody = 64 << 10

// GetRequest returns an empty proto.PubRequest, with ID and Body capacity from an
// earlier use when there is one.
func GetRequest() *proto.PubRequest { return requestPool.Get().(*proto.PubRequest) }

// PutRequest resets r and returns it to the pool. The caller must not use r
// (nor its ID or Body) afterwards; frames never alias them, so a frame may
// outlive the request.
func PutRequest(r *proto.PubRequest) {
	r.Key = ""
	r.From = ""
	r.ID = r.ID[:0]
	if cap(r.Body) > maxPooledBody {
		r.Body = nil
	} else {
		r.Body = r.Body[:0]
	}
	r.Origin = nil
	requestPool.Put(r)
}
