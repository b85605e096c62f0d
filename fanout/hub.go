package fanout

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
)

// MaxLoops bounds the loops of one node: a room's loops are a 64-bit set.
const MaxLoops = 64

// subscriber is the node's broker as the hub sees it (pubsub.Broker fits).
type subscriber interface {
	Subscribe(key string, ready func(error))
	Unsubscribe(key string)
}

// loopSet is how the hub reaches the event loops (the Node, through each
// loop's Loop). Every method may be called from any goroutine and must not
// block: it posts to the loop.
type loopSet interface {
	// deliver hands one message of room key to loop, with its SSE event
	// when the node has SSE members in the room (nil otherwise).
	deliver(loop int, key string, seq uint64, frame, sse []byte)
	// subscribed tells loop that the node's subscription to key is active
	// (err == nil) or failed.
	subscribed(loop int, key string, err error)
	// reset tells loop the broker may have lost messages: check every room.
	reset(loop int)
}

// hub knows which loops hold which room, and subscribes the node to a room
// while any loop holds it. The broker's deliveries reach it through the
// Node (the broker's pubsub.Handler).
//
// Lock order: a shard lock is never held while calling the subscriber or
// the loops (the in-process broker calls back synchronously).
type hub struct {
	seed   maphash.Seed
	shards [256]hubShard
	loops  loopSet
	nloops int

	// ops keeps Subscribe/Unsubscribe calls for one key in the order the
	// hub decided them, without holding a shard lock across them.
	opsMu sync.Mutex
	// sub is the broker, set by New right after building it (the broker
	// needs the hub as its handler) and before any join.
	sub subscriber
}

type hubShard struct {
	mu    sync.RWMutex
	rooms map[string]*hubRoom
	// arena holds the SSE events of the shard's rooms, built by whichever
	// goroutine delivers (a publish worker, a broker reader), under
	// arenaMu; nil until a room of the shard has SSE members.
	arenaMu sync.Mutex
	arena   *Arena
	_       [8]byte // keep shards on separate cache lines
}

type hubRoom struct {
	loops   uint64 // loops holding the room
	active  bool   // subscription confirmed
	waiting uint64 // loops waiting for the subscription
	sse     int32  // live SSE members on all loops
	// msgs counts the messages delivered to the room on this node, for the
	// admin page's busiest rooms: one atomic add per message, not per frame.
	msgs atomic.Uint64
}

// newHub returns a hub for nloops loops.
func newHub(loops loopSet, nloops int) *hub {
	if nloops < 1 || nloops > MaxLoops {
		panic("BUG: fanout: loop count out of range")
	}
	h := &hub{seed: maphash.MakeSeed(), loops: loops, nloops: nloops}
	for i := range h.shards {
		h.shards[i].rooms = make(map[string]*hubRoom)
	}
	return h
}

func (h *hub) shard(key string) *hubShard {
	return &h.shards[maphash.String(h.seed, key)%uint64(len(h.shards))]
}

// join records that loop holds key. The loop hears back through
// loopSet.subscribed once the node's subscription is active (at once if it
// already is).
func (h *hub) join(key string, loop int) {
	bit := uint64(1) << uint(loop)
	s := h.shard(key)
	s.mu.Lock()
	r := s.rooms[key]
	first := r == nil
	if first {
		r = &hubRoom{}
		s.rooms[key] = r
	}
	r.loops |= bit
	active := r.active
	if !active {
		r.waiting |= bit
	}
	s.mu.Unlock()
	switch {
	case first:
		h.opsMu.Lock()
		h.sub.Subscribe(key, func(err error) { h.subscribed(key, r, err) })
		h.opsMu.Unlock()
	case active:
		h.loops.subscribed(loop, key, nil)
	}
}

func (h *hub) subscribed(key string, r *hubRoom, err error) {
	s := h.shard(key)
	s.mu.Lock()
	if s.rooms[key] != r { // left and maybe re-joined meanwhile: a newer entry answers
		s.mu.Unlock()
		return
	}
	waiting := r.waiting & r.loops
	r.waiting = 0
	if err == nil {
		r.active = true
	} else {
		// Forget the room: every waiting loop fails its joins and drops it;
		// the next join subscribes afresh.
		delete(s.rooms, key)
	}
	s.mu.Unlock()
	if err != nil {
		h.opsMu.Lock()
		h.sub.Unsubscribe(key)
		h.opsMu.Unlock()
	}
	for i := 0; waiting != 0; i++ {
		if waiting&1 != 0 {
			h.loops.subscribed(i, key, err)
		}
		waiting >>= 1
	}
}

// leave records that loop no longer holds key; the node unsubscribes when
// no loop does.
func (h *hub) leave(key string, loop int) {
	bit := uint64(1) << uint(loop)
	s := h.shard(key)
	s.mu.Lock()
	r := s.rooms[key]
	if r == nil {
		s.mu.Unlock()
		return
	}
	r.loops &^= bit
	r.waiting &^= bit
	last := r.loops == 0
	if last {
		delete(s.rooms, key)
	}
	s.mu.Unlock()
	if last {
		h.opsMu.Lock()
		h.sub.Unsubscribe(key)
		h.opsMu.Unlock()
	}
}

// OnMessage hands a message to every loop holding its room (pubsub.Handler).
// Fast path: one read lock of one shard and one queue push per loop.
func (h *hub) OnMessage(key string, seq uint64, frame []byte) {
	s := h.shard(key)
	s.mu.RLock()
	r := s.rooms[key]
	var loops uint64
	var sse bool
	if r != nil {
		loops, sse = r.loops, r.sse > 0
		r.msgs.Add(1)
	}
	s.mu.RUnlock()
	var event []byte
	if sse {
		// Once per message for the whole node, as the frame: every loop's
		// SSE members share it.
		s.arenaMu.Lock()
		if s.arena == nil {
			s.arena = NewArena(16 << 10)
		}
		event = buildSSEEvent(s.arena, key, seq, frame)
		s.arenaMu.Unlock()
	}
	for i := 0; loops != 0; i++ {
		if loops&1 != 0 {
			h.loops.deliver(i, key, seq, frame, event)
		}
		loops >>= 1
	}
}

// sseMembers adds delta to the room's count of live SSE members (a loop's
// member went live or left). Any goroutine.
func (h *hub) sseMembers(key string, delta int32) {
	s := h.shard(key)
	s.mu.Lock()
	if r := s.rooms[key]; r != nil {
		r.sse += delta
	}
	s.mu.Unlock()
}

// OnReset tells every loop to check its rooms for gaps (pubsub.Handler).
func (h *hub) OnReset() {
	for i := 0; i < h.nloops; i++ {
		h.loops.reset(i)
	}
}

// rooms is the number of rooms the node holds.
func (h *hub) rooms() int {
	n := 0
	for i := range h.shards {
		s := &h.shards[i]
		s.mu.RLock()
		n += len(s.rooms)
		s.mu.RUnlock()
	}
	return n
}

// each calls fn with every loop holding key. fn runs without the lock.
func (h *hub) each(key string, fn func(loop int)) {
	s := h.shard(key)
	s.mu.RLock()
	var loops uint64
	if r := s.rooms[key]; r != nil {
		loops = r.loops
	}
	s.mu.RUnlock()
	for i := 0; loops != 0; i++ {
		if loops&1 != 0 {
			fn(i)
		}
		loops >>= 1
	}
}

// activity calls fn with every room's key and its count of messages
// delivered on this node. It holds one shard's read lock at a time.
func (h *hub) activity(fn func(key string, msgs uint64)) {
	for i := range h.shards {
		s := &h.shards[i]
		s.mu.RLock()
		for key, r := range s.rooms {
			fn(key, r.msgs.Load())
		}
		s.mu.RUnlock()
	}
}
