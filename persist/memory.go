package persist

import (
	"context"
	"sync"
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
// horizon). Nothing survives a restart.
type Memory struct {
	keep   int
	shards [memShards]memShard
}

var _ Store = (*Memory)(nil)

type memShard struct {
	mu    sync.Mutex
	rooms map[string]*memRoom
	_     [40]byte // keep neighbouring shard locks off one cache line
}

type memKey struct {
	from string
	id   string
}

type memRoom struct {
	last uint64     // newest seq
	ring []memEntry // ring[(seq-1)%keep] holds seq while it is kept
	n    int        // kept messages: seqs last-n+1 .. last
	idem map[memKey]uint64
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
	for i := range m.shards {
		m.shards[i].rooms = make(map[string]*memRoom)
	}
	return m
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
	room := sh.rooms[r.Key]
	if room == nil {
		room = &memRoom{idem: make(map[memKey]uint64)}
		sh.rooms[r.Key] = room
	}
	// Lookup with a borrowed string: no allocation for the duplicate check.
	if seq, ok := room.idem[memKey{r.From, unsafe.String(unsafe.SliceData(r.ID), len(r.ID))}]; ok {
		return proto.PubResult{Seq: seq, TS: room.entry(m.keep, seq).ts, Duplicate: true}
	}
	// One allocation per stored message: the id and the body together.
	buf := make([]byte, len(r.ID)+len(r.Body))
	copy(buf, r.ID)
	copy(buf[len(r.ID):], r.Body)
	room.last++
	e := memEntry{seq: room.last, ts: ts, from: r.From, buf: buf, idLen: len(r.ID)}
	if room.n == m.keep {
		old := room.entry(m.keep, room.last-uint64(m.keep))
		delete(room.idem, memKey{old.from, old.id()})
		room.n--
	}
	if len(room.ring) < m.keep { // filling up: seq-1 == len(ring)
		room.ring = append(room.ring, e)
	} else {
		room.ring[(room.last-1)%uint64(m.keep)] = e
	}
	room.n++
	room.idem[memKey{e.from, e.id()}] = e.seq
	return proto.PubResult{Seq: e.seq, TS: ts}
}

// entry returns the kept entry of seq; the caller checks that seq is kept.
func (r *memRoom) entry(keep int, seq uint64) *memEntry {
	return &r.ring[(seq-1)%uint64(keep)]
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

// Range implements Store. Messages older than the keep window are gone, so
// the result starts at the oldest kept seq above after.
func (m *Memory) Range(_ context.Context, key string, after, upto uint64, limit int) ([]proto.Message, error) {
	sh := m.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	room := sh.rooms[key]
	if room == nil || limit <= 0 {
		return nil, nil
	}
	lo := max(after+1, room.first())
	hi := min(upto, room.last)
	if lo > hi {
		return nil, nil
	}
	if hi-lo+1 > uint64(limit) {
		hi = lo + uint64(limit) - 1
	}
	return room.messages(m.keep, key, lo, hi), nil
}

// History implements Store.
func (m *Memory) History(_ context.Context, key string, before uint64, limit int) ([]proto.Message, error) {
	sh := m.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	room := sh.rooms[key]
	if room == nil || limit <= 0 {
		return nil, nil
	}
	hi := room.last
	if before != 0 {
		if before <= 1 {
			return nil, nil
		}
		hi = min(hi, before-1)
	}
	lo := room.first()
	if lo > hi {
		return nil, nil
	}
	if hi-lo+1 > uint64(limit) {
		lo = hi - uint64(limit) + 1
	}
	return room.messages(m.keep, key, lo, hi), nil
}

// messages copies out lo..hi (all kept). The byte slices alias the stored,
// immutable buffers.
func (r *memRoom) messages(keep int, key string, lo, hi uint64) []proto.Message {
	_, name := proto.SplitKey(key)
	out := make([]proto.Message, 0, hi-lo+1)
	for seq := lo; seq <= hi; seq++ {
		e := r.entry(keep, seq)
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

// Close implements Store; the memory store holds nothing to release.
func (m *Memory) Close() {}

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
