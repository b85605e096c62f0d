package fanout

import (
	"hash/maphash"
	"sync"
)

// MaxLoops bounds the loops of one node: a room's loops are a 64-bit set.
const MaxLoops = 64

// Subscriber is the node's broker as the hub sees it (pubsub.Broker fits).
type Subscriber interface {
	Subscribe(key string, ready func(error))
	Unsubscribe(key string)
}

// Loops is how the hub reaches the event loops. Both methods may be called
// from any goroutine and must not block: they push onto the loop's queue.
type Loops interface {
	// Deliver hands one message of room key to loop.
	Deliver(loop int, key string, seq uint64, frame []byte)
	// Subscribed tells loop that the node's subscription to key is active
	// (err == nil) or failed.
	Subscribed(loop int, key string, err error)
	// Reset tells loop the broker may have lost messages: check every room.
	Reset(loop int)
}

// Hub knows which loops hold which room, and subscribes the node to a room
// while any loop holds it. It implements pubsub.Handler.
//
// Lock order: a shard lock is never held while calling Subscriber or Loops
// (the in-process broker calls back synchronously).
type Hub struct {
	seed   maphash.Seed
	shards [256]hubShard
	loops  Loops
	nloops int

	// ops keeps Subscribe/Unsubscribe calls for one key in the order the
	// hub decided them, without holding a shard lock across them.
	opsMu sync.Mutex
	sub   Subscriber
}

type hubShard struct {
	mu    sync.RWMutex
	rooms map[string]*hubRoom
	_     [24]byte // keep shards on separate cache lines
}

type hubRoom struct {
	loops   uint64 // loops holding the room
	active  bool   // subscription confirmed
	waiting uint64 // loops waiting for the subscription
}

// NewHub returns a hub for nloops loops.
func NewHub(loops Loops, nloops int) *Hub {
	if nloops < 1 || nloops > MaxLoops {
		panic("BUG: fanout: loop count out of range")
	}
	h := &Hub{seed: maphash.MakeSeed(), loops: loops, nloops: nloops}
	for i := range h.shards {
		h.shards[i].rooms = make(map[string]*hubRoom)
	}
	return h
}

// SetSubscriber wires the broker (it needs the hub as its handler, so the
// two are built in two steps). Call before any Join.
func (h *Hub) SetSubscriber(s Subscriber) { h.sub = s }

func (h *Hub) shard(key string) *hubShard {
	return &h.shards[maphash.String(h.seed, key)%uint64(len(h.shards))]
}

// Join records that loop holds key. The loop hears back through
// Loops.Subscribed once the node's subscription is active (at once if it
// already is).
func (h *Hub) Join(key string, loop int) {
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
		h.loops.Subscribed(loop, key, nil)
	}
}

func (h *Hub) subscribed(key string, r *hubRoom, err error) {
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
			h.loops.Subscribed(i, key, err)
		}
		waiting >>= 1
	}
}

// Leave records that loop no longer holds key; the node unsubscribes when
// no loop does.
func (h *Hub) Leave(key string, loop int) {
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
func (h *Hub) OnMessage(key string, seq uint64, frame []byte) {
	s := h.shard(key)
	s.mu.RLock()
	r := s.rooms[key]
	var loops uint64
	if r != nil {
		loops = r.loops
	}
	s.mu.RUnlock()
	for i := 0; loops != 0; i++ {
		if loops&1 != 0 {
			h.loops.Deliver(i, key, seq, frame)
		}
		loops >>= 1
	}
}

// OnReset tells every loop to check its rooms for gaps (pubsub.Handler).
func (h *Hub) OnReset() {
	for i := 0; i < h.nloops; i++ {
		h.loops.Reset(i)
	}
}

// Rooms is the number of rooms the node holds.
func (h *Hub) Rooms() int {
	n := 0
	for i := range h.shards {
		s := &h.shards[i]
		s.mu.RLock()
		n += len(s.rooms)
		s.mu.RUnlock()
	}
	return n
}
