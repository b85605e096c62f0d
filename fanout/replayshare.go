package fanout

import (
	"context"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
)

// ReplayShare serves the catch-up reads of joins with since so that the
// rejoins of one room share their store reads. A reconnect storm brings a
// dead node's members back to the survivors within a few seconds, each
// with a since close to every other member's of its room: read one by one,
// that is one store read per client. Here the first rejoin of a room reads
// from its since to the room's newest message, the result is kept for a
// moment, and every rejoin whose since and upto fall inside it is served
// from memory; one that arrives while the read is in flight waits for it.
// A later rejoin that needs more (a message committed since) reads only
// the missing tail. A storm then costs the database about one read per
// room and per message committed during it, not one per client.
//
// What it keeps is sound to serve: a room's messages commit in seq order,
// so once a read has seen seq n, every message up to n is stored and none
// will be added below it; a message retention removes afterwards may still
// be replayed from here for up to the keep time, which a client that asked
// for it cannot tell from having read it a moment earlier.
type ReplayShare struct {
	store    persist.Store
	keep     time.Duration
	maxRooms int
	maxBytes int // per room

	mu    sync.Mutex
	rooms map[string]*sharedRange

	reads  *atomic.Uint64 // store reads made
	served *atomic.Uint64 // Range calls answered
}

// sharedRange holds every stored message of one room with lo < seq <= hi.
type sharedRange struct {
	lo, hi  uint64
	msgs    []proto.Message
	bytes   int
	at      time.Time // when last filled
	pending *readFlight
}

type readFlight struct {
	from, upto uint64 // reading (from, upto]
	done       chan struct{}
	err        error
}

// ReplaySharePage is how many messages one shared read fetches at most: a
// client further behind is served page by page, each page shared.
const ReplaySharePage = 500

// replaySlack is how far below the since that starts a range it begins:
// the members of a room that lost their node together last saw nearly the
// same seq, and their rejoins arrive in any order, so a range that starts
// a little early serves the ones a few messages behind the first.
const replaySlack = 32

// NewReplayShare serves reads from store, keeping each room's range for
// keep after it was filled, for at most maxRooms rooms of at most maxBytes
// each (a room past that is read but not kept).
func NewReplayShare(store persist.Store, keep time.Duration, maxRooms, maxBytes int) *ReplayShare {
	return &ReplayShare{store: store, keep: keep, maxRooms: maxRooms, maxBytes: maxBytes, rooms: map[string]*sharedRange{},
		reads: new(atomic.Uint64), served: new(atomic.Uint64)}
}

// Reads is the number of store reads made; Served the number of Range
// calls answered. Reads/Served is the store reads per catch-up.
func (g *ReplayShare) Reads() uint64  { return g.reads.Load() }
func (g *ReplayShare) Served() uint64 { return g.served.Load() }

// Range answers as Store.Range does: the stored messages with after < seq
// <= upto in seq order within b, more when b stopped it short of upto. The
// messages are shared with other callers: read them, never modify them.
func (g *ReplayShare) Range(ctx context.Context, key string, after, upto uint64, b persist.Bounds) ([]proto.Message, bool, error) {
	g.served.Add(1)
	if upto <= after {
		return nil, false, nil
	}
	for {
		g.mu.Lock()
		e := g.rooms[key]
		if e != nil && e.pending == nil && time.Since(e.at) > g.keep {
			delete(g.rooms, key)
			e = nil
		}
		if e != nil && e.lo <= after && upto <= e.hi {
			msgs, more := e.slice(after, upto, b)
			g.mu.Unlock()
			return msgs, more, nil
		}
		if e != nil && e.lo <= after && after < e.hi {
			// A caller whose bounds end inside what is kept (a page of a
			// long, paced catch-up) is served from it, not sent to read
			// the tail it does not need yet.
			if msgs, more := e.slice(after, e.hi, b); more {
				g.mu.Unlock()
				return msgs, true, nil
			}
		}
		if e != nil && e.pending != nil {
			f := e.pending
			if (f.from <= after || e.lo <= after && f.from <= e.hi) && upto <= f.upto {
				// the read in flight will cover this one: wait for it
				g.mu.Unlock()
				select {
				case <-f.done:
				case <-ctx.Done():
					return nil, false, ctx.Err()
				}
				if f.err != nil {
					return nil, false, f.err
				}
				continue
			}
			// another read of the room is in flight and will not cover
			// this one: read alone rather than wait twice
			g.mu.Unlock()
			g.reads.Add(1)
			return g.store.Range(ctx, key, after, upto, b)
		}
		from := after
		if e != nil && e.lo <= after && after <= e.hi {
			from = e.hi // only the tail is missing
		} else {
			from = after - min(after, replaySlack)
			e = &sharedRange{lo: from, hi: from}
			g.put(key, e)
		}
		f := &readFlight{from: from, upto: upto, done: make(chan struct{})}
		e.pending = f
		g.mu.Unlock()

		// up to the newest stored message, not only upto: the rejoins that
		// follow have seen newer messages committed
		// A caller bounded by bytes (a paced catch-up page) gets a read
		// bounded by bytes too, at half what a room may keep: a page of
		// big messages is not read whole for a caller that takes a
		// fraction of it, and what is read stays to serve the next pages.
		inner := persist.Bounds{Limit: ReplaySharePage}
		if b.MaxBytes > 0 {
			inner.MaxBytes = max(b.MaxBytes, g.maxBytes/2)
		}
		msgs, more, err := g.store.Range(ctx, key, from, math.MaxUint64, inner)
		g.reads.Add(1)

		g.mu.Lock()
		e.pending = nil
		f.err = err
		if err == nil {
			e.add(msgs, more, upto)
			if e.bytes > g.maxBytes && g.rooms[key] == e {
				// too big to keep: this caller is served from it below,
				// the next one reads again
				delete(g.rooms, key)
			}
		} else if g.rooms[key] == e && len(e.msgs) == 0 {
			delete(g.rooms, key)
		}
		close(f.done)
		if err != nil {
			g.mu.Unlock()
			return nil, false, err
		}
		if e.lo <= after && upto <= e.hi {
			out, more := e.slice(after, upto, b)
			g.mu.Unlock()
			return out, more, nil
		}
		// a full page ended before upto: serve what it holds, the caller
		// asks again from its cursor
		out, _ := e.slice(after, e.hi, b)
		g.mu.Unlock()
		return out, true, nil
	}
}

// put adds e for key, dropping the oldest idle room when full. Called
// with g.mu held.
func (g *ReplayShare) put(key string, e *sharedRange) {
	if _, ok := g.rooms[key]; !ok && len(g.rooms) >= g.maxRooms {
		var oldest string
		var at time.Time
		for k, r := range g.rooms {
			if r.pending == nil && (oldest == "" || r.at.Before(at)) {
				oldest, at = k, r.at
			}
		}
		if oldest == "" {
			return // every room kept has a read in flight: e is not kept
		}
		delete(g.rooms, oldest)
	}
	g.rooms[key] = e
}

// add appends a read of (hi, ...] to the range. Without more, the read
// reached the newest stored message, so everything up to upto (which the
// caller knows is committed) is in; with more, up to the last message read.
func (e *sharedRange) add(msgs []proto.Message, more bool, upto uint64) {
	for i := range msgs {
		if msgs[i].Seq > e.hi {
			e.msgs = append(e.msgs, msgs[i])
			e.bytes += persist.MsgSize(&msgs[i])
		}
	}
	switch {
	case more && len(msgs) > 0:
		e.hi = max(e.hi, msgs[len(msgs)-1].Seq)
	case !more:
		last := upto
		if len(msgs) > 0 {
			last = max(last, msgs[len(msgs)-1].Seq)
		}
		e.hi = max(e.hi, last)
	}
	e.at = time.Now()
}

// slice returns the kept messages with after < seq <= upto within b, and
// whether b stopped it short. Called with the lock held; the result is
// capped so that an append by the caller cannot write into the range.
func (e *sharedRange) slice(after, upto uint64, b persist.Bounds) ([]proto.Message, bool) {
	i := sort.Search(len(e.msgs), func(k int) bool { return e.msgs[k].Seq > after })
	j := sort.Search(len(e.msgs), func(k int) bool { return e.msgs[k].Seq > upto })
	more := false
	if b.Limit > 0 && j-i > b.Limit {
		j, more = i+b.Limit, true
	}
	if b.MaxBytes > 0 {
		n := 0
		for k := i; k < j; k++ {
			n += persist.MsgSize(&e.msgs[k])
			if n > b.MaxBytes && k > i {
				j, more = k, true
				break
			}
		}
	}
	return e.msgs[i:j:j], more
}
