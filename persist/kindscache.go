package persist

import (
	"maps"
	"sync"
	"time"

	"github.com/roost-chat/roost/proto"
)

// kindsCache is what a node knows of its rooms for committing changes
// without reading first (runChanges): per room, the last_seq and message
// count its last commit left, the messages (kind msg) it saw stored and
// the users' standing reactions it saw. It is right only while nothing
// else wrote to the room: every batch committed from it carries a guard
// (changesGuardSQL) that checks the room's last_seq and kept_from (no
// message named removed) under the room lock, and a failed guard or any
// failed commit forgets the rooms. Bounded: a room past kcMaxRefs
// messages or kcMaxReacts reactions is forgotten (its next batch reads,
// as without the cache), and past kcMaxRooms rooms one is forgotten for
// each one learned.
type kindsCache struct {
	mu    sync.Mutex
	rooms map[int64]*kcRoom
}

const (
	kcMaxRooms  = 1024
	kcMaxRefs   = 4096
	kcMaxReacts = 65536
)

type kcRoom struct {
	last, msgs int64
	refs       map[int64]refState
	reacts     map[reactKey]reactState
	// complete: messages stored while the room was known, whose every
	// reaction is then in reacts (none standing when absent).
	complete map[int64]bool
}

// known returns what s's rules start from when the node knows all of it,
// else nil. The maps are copies: the rules change them.
func (c *kindsCache) known(s *pgScratch) *knownBatch {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := &knownBatch{rooms: make(map[int64]*roomSeqs, len(s.rooms)), refs: map[refKey]*refState{}, reacts: map[reactKey]reactState{}}
	for _, id := range s.rooms {
		r := c.rooms[id]
		if r == nil {
			return nil
		}
		k.rooms[id] = &roomSeqs{r.last, r.msgs}
	}
	for j := range s.uOrd {
		if s.uKind[j] == int16(proto.KindMsg) {
			continue
		}
		r := c.rooms[s.uRoom[j]]
		rk := refKey{s.uRoom[j], s.uRef[j]}
		ref, ok := r.refs[rk.seq]
		if !ok {
			return nil
		}
		if k.refs[rk] == nil {
			cp := ref
			cp.counts = maps.Clone(ref.counts) // the rules change them
			k.refs[rk] = &cp
		}
		if proto.Kind(s.uKind[j]).IsReaction() {
			key := reactKey{rk.room, rk.seq, s.uSender[j], s.uText[j]}
			st, ok := r.reacts[key]
			if !ok {
				if !r.complete[rk.seq] {
					return nil
				}
				st = reactState{entry: rk.seq, ts: ref.ts}
			}
			k.reacts[key] = st
		}
	}
	return k
}

// learn records a committed batch: base is its rooms' seqs before it, k
// what its rules ended with, created the messages it stored.
func (c *kindsCache) learn(base map[int64]roomSeqs, k *knownBatch, created map[refKey]bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.rooms == nil {
		c.rooms = map[int64]*kcRoom{}
	}
	for id, after := range k.rooms {
		r := c.rooms[id]
		if r == nil || r.last != base[id].last {
			// Unknown, or known as it was before another commit: what this
			// batch read and wrote is all that is known.
			if r == nil && len(c.rooms) >= kcMaxRooms {
				for other := range c.rooms {
					delete(c.rooms, other)
					break
				}
			}
			r = &kcRoom{refs: map[int64]refState{}, reacts: map[reactKey]reactState{}, complete: map[int64]bool{}}
			c.rooms[id] = r
		}
		r.last, r.msgs = after.last, after.msgs
	}
	for rk, ref := range k.refs {
		if r := c.rooms[rk.room]; r != nil && ref.kind == int16(proto.KindMsg) {
			r.refs[rk.seq] = *ref
		}
	}
	for key, st := range k.reacts {
		if r := c.rooms[key.room]; r != nil {
			r.reacts[key] = st
		}
	}
	for rk := range created {
		if r := c.rooms[rk.room]; r != nil {
			r.complete[rk.seq] = true
		}
	}
	for id := range k.rooms {
		if r := c.rooms[id]; len(r.refs) > kcMaxRefs || len(r.reacts) > kcMaxReacts {
			delete(c.rooms, id)
		}
	}
}

// forget drops what is known of rooms.
func (c *kindsCache) forget(rooms []int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range rooms {
		delete(c.rooms, id)
	}
}

// kcExtension is a batch of plain messages committed in rooms the node
// knows: their seqs before it and what it stored.
type kcExtension struct {
	base    map[int64]int64 // room → last_seq before the batch
	entries []kcEntry
}

type kcEntry struct {
	room, seq int64
	sender    string
	ts        int64 // Unix ms
}

// extending returns an extension for s's rooms that the node knows (nil:
// none), before s's seqs are numbered (s.base holds each room's last_seq
// before the batch).
func (c *kindsCache) extending(s *pgScratch) *kcExtension {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.rooms) == 0 {
		return nil
	}
	var e *kcExtension
	for _, id := range s.rooms {
		if c.rooms[id] == nil {
			continue
		}
		if b, ok := s.base[id]; ok {
			if e == nil {
				e = &kcExtension{base: map[int64]int64{}}
			}
			e.base[id] = int64(b)
		}
	}
	return e
}

func (e *kcExtension) add(room int64, seq uint64, sender string, ts int64) {
	if _, ok := e.base[room]; ok {
		e.entries = append(e.entries, kcEntry{room, int64(seq), sender, ts})
	}
}

// extend records a committed batch of plain messages: known rooms as they
// stood before it now also know its messages, each with no reaction; a
// room known as it stood before another commit is forgotten.
func (c *kindsCache) extend(e *kcExtension) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, base := range e.base {
		if r := c.rooms[id]; r != nil && r.last != base {
			delete(c.rooms, id)
		}
	}
	for _, m := range e.entries {
		r := c.rooms[m.room]
		if r == nil {
			continue
		}
		r.last, r.msgs = m.seq, r.msgs+1
		r.refs[m.seq] = refState{kind: int16(proto.KindMsg), sender: m.sender, ts: time.UnixMilli(m.ts)}
		r.complete[m.seq] = true
	}
	for id := range e.base {
		if r := c.rooms[id]; r != nil && len(r.refs) > kcMaxRefs {
			delete(c.rooms, id)
		}
	}
}
