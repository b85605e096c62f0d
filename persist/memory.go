package persist

import (
	"context"
	crand "crypto/rand"
	"encoding/base32"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/roost-chat/roost/proto"
)

// memShards spreads rooms over independent locks so that publishes and
// reads of different rooms do not contend (no global lock).
const memShards = 64

// DefaultMemoryKeep is the number of newest messages per room the memory
// store keeps when NewMemory is given keep <= 0.
const DefaultMemoryKeep = 1000

// Memory is the embedded store: each room keeps its newest keep messages in
// a ring, with the idempotency keys of exactly those messages. A key is
// forgotten when its message leaves the ring, so a re-publish older than the
// window is stored again (the window is the memory store's exactly-once
// horizon). keep is the memory store's retention by count; a retention
// policy may keep fewer per app, and drop messages by age. Nothing survives
// a restart: every store starts with epochs of its own, so a client holding
// seqs of an earlier process is told they are gone.
type Memory struct {
	keep   int
	policy RetentionPolicy
	// epochBase is random per store; each room adds its creation number,
	// so a room dropped and made again (if the store ever drops rooms)
	// gets a new epoch too.
	epochBase string
	roomGen   atomic.Uint64
	shards    [memShards]memShard
	ret       retentionCounters

	stopMu  sync.Mutex
	stop    context.CancelFunc
	stopped chan struct{}
}

var _ Store = (*Memory)(nil)

type memShard struct {
	mu      sync.Mutex
	rooms   map[string]*memRoom
	evicted uint64   // messages pushed out of full rings (retention by count), under mu
	_       [32]byte // keep neighbouring shard locks off one cache line
}

type memKey struct {
	from string
	id   string
}

type memRoom struct {
	last   uint64     // newest seq
	ring   []memEntry // ring[(seq-1)%cap] holds seq while it is kept
	n      int        // kept messages: seqs last-n+1 .. last
	cap    int        // messages kept at most: keep, or the app's max count if lower
	maxAge int64      // ms; 0: no age limit
	epoch  string
	idem   map[memKey]uint64
}

type memEntry struct {
	seq  uint64
	ts   int64
	from string
	// buf holds id then body in one allocation; idLen splits it. It is
	// never written after the message is stored, so ids and bodies handed
	// out by Range/History may alias it and the idempotency map may key on
	// an unsafe string over it.
	buf   []byte
	idLen int
}

func (e *memEntry) id() string {
	if e.idLen == 0 {
		return ""
	}
	return unsafe.String(&e.buf[0], e.idLen)
}

// NewMemory returns an empty memory store keeping the newest keep messages
// per room (DefaultMemoryKeep if keep <= 0).
func NewMemory(keep int) *Memory {
	if keep <= 0 {
		keep = DefaultMemoryKeep
	}
	m := &Memory{keep: keep}
	var seed [10]byte
	_, _ = crand.Read(seed[:])
	m.epochBase = base32.HexEncoding.WithPadding(base32.NoPadding).EncodeToString(seed[:])
	for i := range m.shards {
		m.shards[i].rooms = make(map[string]*memRoom)
	}
	return m
}

// SetRetentionPolicy sets the per-app retention on top of keep. Call it
// before the store is used: rooms take their app's limits when they are
// made.
func (m *Memory) SetRetentionPolicy(p RetentionPolicy) { m.policy = p }

// room returns key's room, making it if needed. Caller holds sh.mu.
func (m *Memory) roomLocked(sh *memShard, key string) *memRoom {
	if room := sh.rooms[key]; room != nil {
		return room
	}
	app, _ := proto.SplitKey(key)
	ret, _ := m.policy.For(app)
	room := &memRoom{cap: m.keep, idem: make(map[memKey]uint64)}
	if ret.MaxCount > 0 && ret.MaxCount < room.cap {
		room.cap = ret.MaxCount
	}
	room.maxAge = ret.MaxAge.Milliseconds()
	// base (16) + "." + creation number: at most 16+1+13 bytes.
	room.epoch = m.epochBase + "." + strconv.FormatUint(m.roomGen.Add(1), 36)
	sh.rooms[key] = room
	return room
}

func (m *Memory) shard(key string) *memShard {
	return &m.shards[hashKey(key)%memShards]
}

// CommitBatch implements Store. It never fails except on a done context,
// which it checks before storing anything, so all-or-nothing holds.
func (m *Memory) CommitBatch(ctx context.Context, reqs []*proto.PubRequest, res []proto.PubResult) error {
	if err := ctx.Err(); err != nil {
		for i := range reqs {
			res[i] = proto.PubResult{Err: proto.ErrOverloaded}
		}
		return err
	}
	ts := time.Now().UnixMilli()
	for i, r := range reqs {
		sh := m.shard(r.Key)
		sh.mu.Lock()
		res[i] = m.commitLocked(sh, r, ts)
		sh.mu.Unlock()
	}
	return nil
}

func (m *Memory) commitLocked(sh *memShard, r *proto.PubRequest, ts int64) proto.PubResult {
	room := m.roomLocked(sh, r.Key)
	// Lookup with a borrowed string: no allocation for the duplicate check.
	if seq, ok := room.idem[memKey{r.From, unsafe.String(unsafe.SliceData(r.ID), len(r.ID))}]; ok {
		return proto.PubResult{Seq: seq, TS: room.entry(seq).ts, Duplicate: true}
	}
	// One allocation per stored message: the id and the body together.
	buf := make([]byte, len(r.ID)+len(r.Body))
	copy(buf, r.ID)
	copy(buf[len(r.ID):], r.Body)
	if room.n == room.cap {
		room.dropOldest()
		sh.evicted++
	}
	room.last++
	e := memEntry{seq: room.last, ts: ts, from: r.From, buf: buf, idLen: len(r.ID)}
	if len(room.ring) < room.cap { // filling up: seq-1 == len(ring)
		room.ring = append(room.ring, e)
	} else {
		room.ring[(room.last-1)%uint64(room.cap)] = e
	}
	room.n++
	room.idem[memKey{e.from, e.id()}] = e.seq
	return proto.PubResult{Seq: e.seq, TS: ts}
}

// dropOldest forgets the oldest kept message and its idempotency key.
func (r *memRoom) dropOldest() {
	old := r.entry(r.first())
	delete(r.idem, memKey{old.from, old.id()})
	*old = memEntry{}
	r.n--
}

// entry returns the kept entry of seq; the caller checks that seq is kept.
func (r *memRoom) entry(seq uint64) *memEntry {
	return &r.ring[(seq-1)%uint64(r.cap)]
}

// first returns the oldest kept seq (last+1 when nothing is kept).
func (r *memRoom) first() uint64 { return r.last - uint64(r.n) + 1 }

// LastSeq implements Store.
func (m *Memory) LastSeq(_ context.Context, key string) (uint64, error) {
	sh := m.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if room := sh.rooms[key]; room != nil {
		return room.last, nil
	}
	return 0, nil
}

// Head implements Store.
func (m *Memory) Head(_ context.Context, key string) (Head, error) {
	sh := m.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	room := m.roomLocked(sh, key)
	return Head{Last: room.last, Epoch: room.epoch}, nil
}

// Range implements Store. Messages older than the keep window are gone, so
// the result starts at the oldest kept seq above after.
func (m *Memory) Range(_ context.Context, key string, after, upto uint64, b Bounds) ([]proto.Message, bool, error) {
	sh := m.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	room := sh.rooms[key]
	if room == nil || b.Limit <= 0 {
		return nil, false, nil
	}
	lo := max(after+1, room.first())
	hi := min(upto, room.last)
	if lo > hi {
		return nil, false, nil
	}
	more := false
	if hi-lo+1 > uint64(b.Limit) {
		hi = lo + uint64(b.Limit) - 1
		more = true
	}
	if n := room.fit(lo, hi, 1, b.MaxBytes, key); n < hi-lo+1 {
		hi = lo + n - 1
		more = true
	}
	return room.messages(key, lo, hi), more, nil
}

// History implements Store.
func (m *Memory) History(_ context.Context, key string, before uint64, b Bounds) ([]proto.Message, bool, error) {
	sh := m.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	room := sh.rooms[key]
	if room == nil || b.Limit <= 0 {
		return nil, false, nil
	}
	hi := room.last
	if before != 0 {
		if before <= 1 {
			return nil, false, nil
		}
		hi = min(hi, before-1)
	}
	lo := room.first()
	if lo > hi {
		return nil, false, nil
	}
	more := false
	if hi-lo+1 > uint64(b.Limit) {
		lo = hi - uint64(b.Limit) + 1
		more = true
	}
	if n := room.fit(hi, lo, -1, b.MaxBytes, key); n < hi-lo+1 {
		lo = hi - n + 1
		more = true
	}
	return room.messages(key, lo, hi), more, nil
}

// fit counts the messages from seq from towards to (step +1 or -1, both
// kept) that fit in maxBytes, always at least one.
func (r *memRoom) fit(from, to uint64, step int, maxBytes int, key string) uint64 {
	total := to - from + 1
	if step < 0 {
		total = from - to + 1
	}
	if maxBytes <= 0 {
		return total
	}
	_, name := proto.SplitKey(key)
	size := 0
	seq := from
	for n := uint64(0); n < total; n++ {
		e := r.entry(seq)
		size += len(e.buf) + len(e.from) + len(name) + msgOverhead
		if n > 0 && size > maxBytes {
			return n
		}
		if step > 0 {
			seq++
		} else {
			seq--
		}
	}
	return total
}

// messages copies out lo..hi (all kept). The byte slices alias the stored,
// immutable buffers.
func (r *memRoom) messages(key string, lo, hi uint64) []proto.Message {
	_, name := proto.SplitKey(key)
	out := make([]proto.Message, 0, hi-lo+1)
	for seq := lo; seq <= hi; seq++ {
		e := r.entry(seq)
		out = append(out, proto.Message{
			Room: name,
			Seq:  e.seq,
			ID:   e.id(),
			From: e.from,
			TS:   e.ts,
			Body: e.buf[e.idLen:len(e.buf):len(e.buf)],
		})
	}
	return out
}

// EnforceRetention removes, once, the messages older than their app's max
// age, and returns how many. (The count limit holds at every commit.)
func (m *Memory) EnforceRetention(now time.Time) int {
	nowMS := now.UnixMilli()
	removed := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for _, room := range sh.rooms {
			if room.maxAge <= 0 {
				continue
			}
			// Seq order is commit order: the expired ones are the oldest.
			for room.n > 0 && room.entry(room.first()).ts < nowMS-room.maxAge {
				room.dropOldest()
				removed++
			}
		}
		sh.mu.Unlock()
	}
	m.ret.byAge.Add(uint64(removed))
	m.ret.runs.Add(1)
	return removed
}

// StartRetention runs EnforceRetention every interval until ctx is done or
// the store is closed; without an age limit in the policy there is nothing
// to run. Call it once.
func (m *Memory) StartRetention(ctx context.Context, every time.Duration) {
	aged := m.policy.Default.MaxAge > 0
	for _, r := range m.policy.Apps {
		aged = aged || r.MaxAge > 0
	}
	if !aged {
		return
	}
	m.stopMu.Lock()
	defer m.stopMu.Unlock()
	if m.stop != nil {
		return
	}
	ctx, m.stop = context.WithCancel(ctx)
	m.stopped = make(chan struct{})
	go func() {
		defer close(m.stopped)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				m.EnforceRetention(now)
			}
		}
	}()
}

// RetentionStats implements Store.
func (m *Memory) RetentionStats() RetentionStats {
	st := m.ret.stats()
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		st.DeletedByCount += sh.evicted
		sh.mu.Unlock()
	}
	return st
}

// Close implements Store: it stops the retention job.
func (m *Memory) Close() {
	m.stopMu.Lock()
	defer m.stopMu.Unlock()
	if m.stop != nil {
		m.stop()
		<-m.stopped
		m.stop = nil
	}
}

// hashKey is FNV-1a over the room key: cheap, allocation-free and stable,
// used both for store shards and for the pool's room → worker mapping.
func hashKey(key string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return h
}
