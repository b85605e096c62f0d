package persist

import (
	"context"
	crand "crypto/rand"
	"encoding/base32"
	"maps"
	"slices"
	"strconv"
	"strings"
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

	// maxBytes is the store's byte budget (0: none); bytes is what it
	// holds by the accounting of msgBytes and roomCost. Each app keeps its
	// own bytes and its rooms that hold messages in the order of their
	// latest commit: the budget evicts from the app holding the most,
	// least recent room first (evictOver).
	maxBytes int64
	bytes    atomic.Int64
	evicted  atomic.Uint64 // messages dropped by the byte budget

	// maxAppRooms bounds the rooms of one app (0: no bound).
	maxAppRooms  int
	roomsRefused atomic.Uint64

	reads memReads // users' read positions (reads.go)

	appsMu sync.Mutex // apps, and every app's lru list
	apps   map[string]*memApp

	// registry is the retention the app registry gives apps (keep_age,
	// keep_count): below the policy's per-app entries, above its default.
	// Read lock-free where rooms are made; regMu orders its writers.
	registry atomic.Pointer[map[string]Retention]
	regMu    sync.Mutex

	stopMu   sync.Mutex
	stop     context.CancelFunc
	stopped  chan struct{}
	closed   bool
	retCtx   context.Context // StartRetention's, kept to start aging later
	retEvery time.Duration
}

// memApp is what the limits track of one app.
type memApp struct {
	rooms int          // rooms made (under Memory.appsMu)
	bytes atomic.Int64 // its share of Memory.bytes
	lru   memRoom      // sentinel of its rooms holding messages: lru.next is the most recent
	names memNames     // its rooms by name, for ListRooms (under Memory.appsMu; rooms.go)
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
	key    string
	last   uint64     // newest seq
	ring   []memEntry // ring[(seq-1-off)%cap] holds seq while it is kept
	off    uint64     // seqs before the ring was last allocated: 0, or last when it was released
	n      int        // kept messages: seqs last-n+1 .. last
	cap    int        // messages kept at most: keep, or the app's max count if lower
	maxAge int64      // ms; 0: no age limit
	epoch  string
	idem   map[memKey]uint64

	// msgs counts the room's KindMsg entries ever stored (unread counts:
	// each entry keeps the count up to itself).
	msgs uint64
	// fold is the state of messages that changed (edited, deleted,
	// reacted to), by seq; deps the seqs of the changes of each message,
	// which retention removes with it. Both nil until a change is stored.
	fold map[uint64]*memFold
	deps map[uint64][]uint64

	app *memApp
	// In app.lru while it holds messages (under Memory.appsMu).
	prev, next *memRoom
	// ringBytes is the ring's capacity as counted in Memory.bytes.
	ringBytes int64
}

// Accounting of the byte budget: a message costs its id and body plus
// msgCost (its ring slot, its idempotency map entry); a room costs
// roomCost, its key and epoch, and its ring's capacity. Close enough to
// what the heap holds that a budget holds RSS in check (tested).
const (
	msgCost   = 112
	roomCost  = 320
	entrySize = int64(unsafe.Sizeof(memEntry{}))
)

func msgBytes(e *memEntry) int64 { return int64(len(e.buf)) + msgCost }

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
	kind  proto.Kind
	ref   uint64
	msgs  uint64 // the room's KindMsg entries up to and including this one
	// gone: removed with the message it changed (retention); its slot
	// stays until the ring passes it, and reads skip it.
	gone bool
}

// memFold is what changed of one message.
type memFold struct {
	edited  int64  // latest edit's commit time (0: none)
	body    []byte // latest edit's body (aliases its entry's buf)
	deleted bool
	users   map[memReactKey]memReact // per user and reaction: the entry that stands
	counts  map[string]int           // reactions held, by text
	bytes   int64                    // what it counts against the byte budget (foldCost and its maps' entries)
}

// foldCost approximates a message's state and the entry of each change in
// it: they count against the byte budget with the message and leave with it.
const foldCost = 160

type memReactKey struct{ from, text string }

type memReact struct {
	seq    uint64 // the react, or the unreact that took it back
	ts     int64
	active bool
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
	m := &Memory{keep: keep, apps: make(map[string]*memApp)}
	var seed [10]byte
	_, _ = crand.Read(seed[:])
	m.epochBase = base32.HexEncoding.WithPadding(base32.NoPadding).EncodeToString(seed[:])
	for i := range m.shards {
		m.shards[i].rooms = make(map[string]*memRoom)
	}
	return m
}

// SetLimits sets the byte budget (maxBytes, 0: none) and the rooms one app
// may have (maxAppRooms, 0: no bound). Call it before the store is used.
//
// The budget's rule: after each commit, while the store holds more than
// maxBytes, the app holding the most bytes gives way: its room written
// least recently loses its oldest messages (and their idempotency keys),
// then its next least recent room, and so on, the largest app chosen again
// after each room. So an app that floods the store evicts its own history
// first and other apps keep theirs; within an app, hot rooms keep their
// history and the flood's own oldest rooms go first. A room itself is never dropped (its seq
// and epoch stay, so members and resuming clients are not confused), only
// its messages; a client that asks for what was evicted gets what is left
// (join with since: recovered false). Rooms are bounded by maxAppRooms:
// past it, a publish or join that would make a new room of that app fails
// with proto.ErrRoomLimit.
func (m *Memory) SetLimits(maxBytes int64, maxAppRooms int) {
	m.maxBytes = max(maxBytes, 0)
	m.maxAppRooms = max(maxAppRooms, 0)
}

// MemoryStats is the byte budget's view of the store.
type MemoryStats struct {
	Bytes, MaxBytes int64  // held now, and the budget (0: none)
	Evicted         uint64 // messages dropped to stay within the budget
	RoomsRefused    uint64 // publishes and joins refused by the app's room limit
}

// Stats returns the budget's counters.
func (m *Memory) Stats() MemoryStats {
	return MemoryStats{Bytes: m.bytes.Load(), MaxBytes: m.maxBytes, Evicted: m.evicted.Load(), RoomsRefused: m.roomsRefused.Load()}
}

// SetRetentionPolicy sets the per-app retention on top of keep. Call it
// before the store is used: rooms take their app's limits when they are
// made.
func (m *Memory) SetRetentionPolicy(p RetentionPolicy) { m.policy = p }

// retentionFor is app's retention: its --app-retention entry, else the
// registry's, else the default.
func (m *Memory) retentionFor(app string) Retention {
	if r, named := m.policy.For(app); named {
		return r
	}
	if reg := m.registry.Load(); reg != nil {
		if r, ok := (*reg)[app]; ok {
			return r
		}
	}
	return m.policy.Default
}

// roomRetention is what a room of app keeps: at most keep messages (--keep,
// or the app's count if lower), none older than maxAge ms (0: no limit).
func (m *Memory) roomRetention(app string) (keep int, maxAge int64) {
	ret := m.retentionFor(app)
	keep = m.keep
	if ret.MaxCount > 0 && ret.MaxCount < keep {
		keep = ret.MaxCount
	}
	return keep, ret.MaxAge.Milliseconds()
}

// SetAppRetention sets the retention the app registry gives apps (their
// keep_age and keep_count; an app absent, or with both 0, has the
// default), and applies it to the rooms that exist: a lower count drops
// their oldest messages at once, a higher one lets them keep more from now
// on, an age applies from the next retention round. Any goroutine. The
// registry's periodic re-read calls it with the same apps every interval:
// an unchanged map costs a comparison, not a walk of the rooms.
func (m *Memory) SetAppRetention(apps map[string]Retention) {
	m.regMu.Lock()
	defer m.regMu.Unlock()
	if cur := m.registry.Load(); cur != nil && maps.Equal(*cur, apps) || cur == nil && len(apps) == 0 {
		return
	}
	reg := maps.Clone(apps)
	m.registry.Store(&reg)
	var dropped uint64
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for _, room := range sh.rooms {
			app, _ := proto.SplitKey(room.key)
			keep, maxAge := m.roomRetention(app)
			room.maxAge = maxAge
			if keep != room.cap {
				dropped += m.resizeLocked(room, keep)
			}
		}
		sh.mu.Unlock()
	}
	m.ret.byCount.Add(dropped)
	for _, r := range reg {
		if r.MaxAge > 0 {
			m.startAging()
			break
		}
	}
}

// resizeLocked gives r room for capacity messages, dropping its oldest
// beyond it, and returns how many it dropped. The kept messages move to a
// ring that starts at the oldest of them. Caller holds r's shard.
func (m *Memory) resizeLocked(r *memRoom, capacity int) uint64 {
	var dropped uint64
	for r.n > capacity {
		m.dropOldest(r)
		dropped++
	}
	if r.n > 0 {
		ring := make([]memEntry, r.n, capacity)
		first := r.first()
		for i := range ring {
			ring[i] = *r.entry(first + uint64(i))
		}
		// ring[(seq-1-off)%capacity] holds seq, and appending fills the
		// next slot, as for a ring being filled.
		r.ring, r.off = ring, first-1
		rb := int64(cap(ring)) * entrySize
		m.account(r, rb-r.ringBytes)
		r.ringBytes = rb
	}
	r.cap = capacity
	return dropped
}

// room returns key's room, making it if needed; nil when the app has its
// maxAppRooms already. Caller holds sh.mu.
func (m *Memory) roomLocked(sh *memShard, key string) *memRoom {
	if room := sh.rooms[key]; room != nil {
		return room
	}
	app, _ := proto.SplitKey(key)
	ma := m.countRoom(app)
	if ma == nil {
		m.roomsRefused.Add(1)
		return nil
	}
	room := &memRoom{key: key, app: ma, idem: make(map[memKey]uint64)}
	room.cap, room.maxAge = m.roomRetention(app)
	// base (16) + "." + creation number: at most 16+1+13 bytes.
	room.epoch = m.epochBase + "." + strconv.FormatUint(m.roomGen.Add(1), 36)
	sh.rooms[key] = room
	m.account(room, roomCost+int64(len(key)+len(room.epoch)))
	m.indexRoom(ma, key)
	return room
}

// countRoom counts a new room of app and returns the app, or nil when the
// app is at maxAppRooms.
func (m *Memory) countRoom(app string) *memApp {
	m.appsMu.Lock()
	defer m.appsMu.Unlock()
	ma := m.apps[app]
	if ma == nil {
		ma = &memApp{}
		ma.lru.prev, ma.lru.next = &ma.lru, &ma.lru
		m.apps[app] = ma
	}
	if m.maxAppRooms > 0 && ma.rooms >= m.maxAppRooms {
		return nil
	}
	ma.rooms++
	return ma
}

// account adds d bytes to the store and to r's app.
func (m *Memory) account(r *memRoom, d int64) {
	m.bytes.Add(d)
	r.app.bytes.Add(d)
}

func (m *Memory) shard(key string) *memShard {
	return &m.shards[hashKey(key)%memShards]
}

// CommitBatch implements Store. It never fails except on a done context,
// which it checks before storing anything, so all-or-nothing holds.
func (m *Memory) CommitBatch(ctx context.Context, rs []*Row) error {
	if err := ctx.Err(); err != nil {
		for _, r := range rs {
			r.Stored = Stored{Err: proto.ErrOverloaded}
		}
		return err
	}
	ts := time.Now().UnixMilli()
	for _, r := range rs {
		sh := m.shard(r.Key)
		sh.mu.Lock()
		r.Stored = m.commitLocked(sh, r, ts)
		sh.mu.Unlock()
	}
	m.evictOver()
	return nil
}

func (m *Memory) commitLocked(sh *memShard, r *Row, ts int64) Stored {
	room := m.roomLocked(sh, r.Key)
	if room == nil {
		return Stored{Err: proto.ErrRoomLimit}
	}
	// Lookup with a borrowed string: no allocation for the duplicate check.
	if seq, ok := room.idem[memKey{r.From, unsafe.String(unsafe.SliceData(r.ID), len(r.ID))}]; ok {
		return Stored{Seq: seq, TS: room.entry(seq).ts, Duplicate: true}
	}
	var text string
	if r.Kind != proto.KindMsg {
		var st Stored
		var done bool
		if text, st, done = room.checkChange(r); done {
			return st
		}
	}
	// One allocation per stored message: the id and the body together.
	buf := make([]byte, len(r.ID)+len(r.Body))
	copy(buf, r.ID)
	copy(buf[len(r.ID):], r.Body)
	if room.n == room.cap {
		m.dropOldest(room)
		sh.evicted++
	}
	room.last++
	if r.Kind == proto.KindMsg {
		room.msgs++
	}
	e := memEntry{seq: room.last, ts: ts, from: r.From, buf: buf, idLen: len(r.ID), kind: r.Kind, ref: r.Ref, msgs: room.msgs}
	if len(room.ring) < room.cap { // filling up: seq-1-off == len(ring)
		room.ring = append(room.ring, e)
		if rb := int64(cap(room.ring)) * entrySize; rb != room.ringBytes {
			m.account(room, rb-room.ringBytes)
			room.ringBytes = rb
		}
	} else {
		room.ring[(room.last-1-room.off)%uint64(room.cap)] = e
	}
	room.n++
	room.idem[memKey{e.from, e.id()}] = e.seq
	m.account(room, msgBytes(&e))
	if r.Kind != proto.KindMsg {
		m.account(room, room.applyChange(&e, text))
	}
	if m.maxBytes > 0 {
		m.touch(room)
	}
	return Stored{Seq: e.seq, TS: ts}
}

// dropOldest forgets the oldest kept message of r and its idempotency
// key. A room left with no message gives its ring back (a long-idle room
// costs no slots) and leaves the eviction order. Caller holds r's shard.
func (m *Memory) dropOldest(r *memRoom) {
	old := r.entry(r.first())
	if !old.gone {
		m.forget(r, old)
	}
	if old.kind == proto.KindMsg && r.fold != nil {
		// Its changes go with it (they are newer: still in the ring, or
		// gone with the ring already).
		for _, d := range r.deps[old.seq] {
			if d >= r.first() && d <= r.last {
				if e := r.entry(d); !e.gone {
					m.forget(r, e)
					e.gone = true
					e.buf, e.idLen = nil, 0
				}
			}
		}
		if f := r.fold[old.seq]; f != nil {
			m.account(r, -f.bytes)
		}
		delete(r.deps, old.seq)
		delete(r.fold, old.seq)
	}
	*old = memEntry{}
	r.n--
	if r.n == 0 {
		r.ring, r.off = nil, r.last
		m.account(r, -r.ringBytes)
		r.ringBytes = 0
		if m.maxBytes > 0 {
			m.appsMu.Lock()
			if r.next != nil {
				r.prev.next, r.next.prev = r.next, r.prev
				r.prev, r.next = nil, nil
			}
			m.appsMu.Unlock()
		}
	}
}

// forget drops e's idempotency key and its bytes. Caller holds r's shard.
func (m *Memory) forget(r *memRoom, e *memEntry) {
	delete(r.idem, memKey{e.from, e.id()})
	m.account(r, -msgBytes(e))
}

// checkChange checks r, a change, against the rules. done reports that
// the answer is st and nothing is to be stored; else text is a reaction's
// text. Caller holds r's shard.
func (room *memRoom) checkChange(r *Row) (text string, st Stored, done bool) {
	ref := room.kept(r.Ref)
	if ref == nil || ref.kind != proto.KindMsg {
		return "", Stored{Err: proto.ErrRefNotFound}, true
	}
	f := room.fold[r.Ref]
	if f != nil && f.deleted {
		return "", Stored{Err: proto.ErrRefNotFound}, true
	}
	switch r.Kind {
	case proto.KindEdit, proto.KindDelete:
		if !r.Any && ref.from != r.From {
			return "", Stored{Err: proto.ErrRefForbidden}, true
		}
	case proto.KindReact, proto.KindUnreact:
		t, ok := proto.ReactionText(nil, r.Body)
		if !ok {
			return "", Stored{Err: proto.ErrBadReaction}, true
		}
		text = string(t)
		var cur memReact
		if f != nil {
			cur = f.users[memReactKey{r.From, text}]
		}
		if cur.active == (r.Kind == proto.KindReact) {
			if cur.seq == 0 { // never reacted so: the message itself
				cur.seq, cur.ts = ref.seq, ref.ts
			}
			return "", Stored{Seq: cur.seq, TS: cur.ts, Duplicate: true}, true
		}
	default:
		return "", Stored{Err: proto.ErrBadKind}, true
	}
	return text, Stored{}, false
}

// applyChange records e, a change just stored, in its message's state,
// and returns the bytes that state grew by.
func (room *memRoom) applyChange(e *memEntry, text string) int64 {
	if room.fold == nil {
		room.fold = make(map[uint64]*memFold)
		room.deps = make(map[uint64][]uint64)
	}
	f := room.fold[e.ref]
	grew := int64(16) // its seq in deps
	if f == nil {
		f = &memFold{}
		room.fold[e.ref] = f
		grew += foldCost
	}
	room.deps[e.ref] = append(room.deps[e.ref], e.seq)
	switch e.kind {
	case proto.KindEdit:
		f.edited, f.body = e.ts, e.buf[e.idLen:len(e.buf):len(e.buf)]
	case proto.KindDelete:
		f.deleted, f.body = true, nil
	case proto.KindReact, proto.KindUnreact:
		if f.users == nil {
			f.users = make(map[memReactKey]memReact)
			f.counts = make(map[string]int)
		}
		on := e.kind == proto.KindReact
		k := memReactKey{e.from, text}
		if _, ok := f.users[k]; !ok {
			grew += int64(len(e.from)+len(text)) + 64
		}
		if _, ok := f.counts[text]; !ok && on {
			grew += int64(len(text)) + 32
		}
		f.users[k] = memReact{seq: e.seq, ts: e.ts, active: on}
		if on {
			f.counts[text]++
		} else if f.counts[text]--; f.counts[text] <= 0 {
			delete(f.counts, text)
		}
	}
	f.bytes += grew
	return grew
}

// kept returns the entry of seq if the ring holds it and it is not gone.
func (room *memRoom) kept(seq uint64) *memEntry {
	if seq < room.first() || seq > room.last || seq == 0 {
		return nil
	}
	if e := room.entry(seq); !e.gone {
		return e
	}
	return nil
}

// msgsBefore is the count of KindMsg entries with seq <= seq (unread
// counts): read from the entry itself, or, for a seq the ring no longer
// holds, from the oldest one it does.
func (room *memRoom) msgsUpTo(seq uint64) uint64 {
	switch {
	case seq >= room.last:
		return room.msgs
	case room.n == 0:
		return room.msgs // nothing kept after seq to count
	case seq >= room.first():
		return room.entry(seq).msgs
	}
	e := room.entry(room.first())
	if e.kind == proto.KindMsg {
		return e.msgs - 1
	}
	return e.msgs
}

// touch moves r to the front of its app's eviction order. Caller holds
// r's shard.
func (m *Memory) touch(r *memRoom) {
	lru := &r.app.lru
	m.appsMu.Lock()
	if r.next != nil {
		r.prev.next, r.next.prev = r.next, r.prev
	}
	r.prev, r.next = lru, lru.next
	lru.next.prev = r
	lru.next = r
	m.appsMu.Unlock()
}

// victim is the room to evict from: the least recently written of the
// app that holds the most bytes; nil when no room holds a message.
func (m *Memory) victim() *memRoom {
	m.appsMu.Lock()
	defer m.appsMu.Unlock()
	var big *memApp
	for _, a := range m.apps {
		if a.lru.prev != &a.lru && (big == nil || a.bytes.Load() > big.bytes.Load()) {
			big = a
		}
	}
	if big == nil {
		return nil
	}
	return big.lru.prev
}

// evictOver enforces the byte budget (see SetLimits). It picks the victim
// under the apps lock only, then trims it under its shard's lock: the
// commit path locks shard then apps, never the reverse.
func (m *Memory) evictOver() {
	for m.maxBytes > 0 && m.bytes.Load() > m.maxBytes {
		victim := m.victim()
		if victim == nil {
			return // nothing left to evict: rooms alone fill the budget
		}
		sh := m.shard(victim.key)
		sh.mu.Lock()
		for victim.n > 0 && m.bytes.Load() > m.maxBytes {
			m.dropOldest(victim)
			m.evicted.Add(1)
		}
		sh.mu.Unlock()
	}
}

// entry returns the kept entry of seq; the caller checks that seq is kept.
func (r *memRoom) entry(seq uint64) *memEntry {
	return &r.ring[(seq-1-r.off)%uint64(r.cap)]
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

// LastSeqs implements Store.
func (m *Memory) LastSeqs(ctx context.Context, keys []string, last []uint64) error {
	for i, k := range keys {
		last[i], _ = m.LastSeq(ctx, k)
	}
	return nil
}

// Head implements Store.
func (m *Memory) Head(_ context.Context, key string) (Head, error) {
	sh := m.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	room := m.roomLocked(sh, key)
	if room == nil {
		return Head{}, proto.ErrRoomLimit
	}
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
	msgs, more := room.walk(key, lo, hi, 1, b, false)
	return msgs, more, nil
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
	msgs, more := room.walk(key, hi, lo, -1, b, false)
	return msgs, more, nil
}

// Fold implements Folder: a walk of the ring that lists messages only.
func (m *Memory) Fold(_ context.Context, key string, q FoldQuery, b Bounds) ([]proto.Message, bool, error) {
	sh := m.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	room := sh.rooms[key]
	if room == nil || b.Limit <= 0 || room.n == 0 {
		return nil, false, nil
	}
	if q.Forward {
		lo := max(q.After+1, room.first())
		if lo > room.last {
			return nil, false, nil
		}
		msgs, more := room.walk(key, lo, room.last, 1, b, true)
		return msgs, more, nil
	}
	hi := room.last
	if q.Before != 0 {
		if q.Before <= 1 {
			return nil, false, nil
		}
		hi = min(hi, q.Before-1)
	}
	if room.first() > hi {
		return nil, false, nil
	}
	msgs, more := room.walk(key, hi, room.first(), -1, b, true)
	return msgs, more, nil
}

// walk copies out the kept entries from seq from towards to (step +1 or
// -1, both kept seqs), oldest first, within b (the first one always);
// fold lists only messages, as they stand. more reports entries it would
// list left beyond b. The byte slices alias the stored, immutable buffers.
func (r *memRoom) walk(key string, from, to uint64, step int, b Bounds, fold bool) ([]proto.Message, bool) {
	_, name := proto.SplitKey(key)
	span := to - from + 1
	if step < 0 {
		span = from - to + 1
	}
	out := make([]proto.Message, 0, min(uint64(b.Limit), span))
	size := 0
	more := false
	seq := from
	for n := uint64(0); n < span; n++ {
		e := r.entry(seq)
		if step > 0 {
			seq++
		} else {
			seq--
		}
		if e.gone || fold && e.kind != proto.KindMsg {
			continue
		}
		size += len(e.buf) + len(e.from) + len(name) + msgOverhead
		if len(out) == b.Limit || len(out) > 0 && b.MaxBytes > 0 && size > b.MaxBytes {
			more = true
			break
		}
		msg := proto.Message{
			Room: name,
			Seq:  e.seq,
			ID:   e.id(),
			From: e.from,
			TS:   e.ts,
			Body: e.buf[e.idLen:len(e.buf):len(e.buf)],
			Kind: e.kind,
			Ref:  e.ref,
		}
		if fold {
			msg.Folded = true
			if f := r.fold[e.seq]; f != nil {
				msg.Edited, msg.Deleted = f.edited, f.deleted
				if f.edited != 0 {
					msg.Body = f.body
				}
				if f.deleted {
					msg.Body = nil
				}
				msg.Reactions = sortedReactions(f.counts)
			}
		}
		out = append(out, msg)
	}
	if step < 0 {
		slices.Reverse(out)
	}
	return out, more
}

// sortedReactions lists counts by text.
func sortedReactions(counts map[string]int) []proto.Reaction {
	if len(counts) == 0 {
		return nil
	}
	out := make([]proto.Reaction, 0, len(counts))
	for t, n := range counts {
		out = append(out, proto.Reaction{Text: t, Count: n})
	}
	slices.SortFunc(out, func(a, b proto.Reaction) int { return strings.Compare(a.Text, b.Text) })
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
				m.dropOldest(room)
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
	m.stopMu.Lock()
	m.retCtx, m.retEvery = ctx, every
	m.stopMu.Unlock()
	aged := m.policy.Default.MaxAge > 0
	for _, r := range m.policy.Apps {
		aged = aged || r.MaxAge > 0
	}
	if reg := m.registry.Load(); reg != nil {
		for _, r := range *reg {
			aged = aged || r.MaxAge > 0
		}
	}
	if aged {
		m.startAging()
	}
}

// startAging runs EnforceRetention every retEvery, once StartRetention has
// been called and until Close; a registry that gains an age limit later
// starts it then.
func (m *Memory) startAging() {
	m.stopMu.Lock()
	defer m.stopMu.Unlock()
	if m.stop != nil || m.closed || m.retCtx == nil {
		return
	}
	every := m.retEvery
	ctx, stop := context.WithCancel(m.retCtx)
	m.stop = stop
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
	m.closed = true
	if m.stop != nil {
		m.stop()
		<-m.stopped
		m.stop = nil
	}
}

// hashKey is FNV-1a over the room key: cheap, allocation-free and stable,
// for the store's room shards.
func hashKey(key string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return h
}
