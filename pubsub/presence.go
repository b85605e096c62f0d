package pubsub

import (
	"context"
	"sync"
	"time"
)

// Presence is who is in which room, over every node: the distinct users
// with at least one connection joined to a room. Each node reports the
// changes of its own users (a user's first connection in a room on this
// node, the end of the last one once its grace period passed), and which
// rooms it has presence subscribers in; Presence adds them up over the
// nodes. The node's fanout keeps the per-connection counts and the grace
// period: what reaches Presence is per node and per user, never per
// connection.
//
// Two implementations: in process (one node) and Redis (many nodes, with
// a lease per node so that a dead node's users leave when it ends).
type Presence interface {
	// Apply applies one tick's changes of this node, in order, in one
	// round trip where there is a network, and returns the rooms whose
	// users changed, each marked Watched when some node watches it (only
	// those are sent to presence subscribers; the others serve connection
	// events). Each transition is returned to exactly one node: the one
	// whose change made it. It also keeps this node's lease and ends the
	// presence of nodes whose lease ended (their users appear in Left).
	// Changes are idempotent: after an error the caller applies the same
	// changes again. Called by one goroutine at a time. The returned
	// slices are the caller's.
	Apply(ctx context.Context, changes []PresenceChange) ([]PresenceDiff, error)
	// RenewAt is when this node's lease needs an Apply, with or without
	// changes (zero: it has no lease; Apply is for changes only). Called
	// by Apply's goroutine.
	RenewAt() time.Time
	// Query returns the room's number of users and at most limit of their
	// names. Any goroutine.
	Query(ctx context.Context, key string, limit int) (count int, users []string, err error)
	// Count returns the room's number of users, in O(1). Any goroutine.
	Count(ctx context.Context, key string) (int, error)
	// Counts sets counts[i] to the number of users of the room keys[i],
	// each in O(1), all in one round trip where there is a network (the
	// server API's rooms listing). Any goroutine.
	Counts(ctx context.Context, keys []string, counts []int) error
	// Close ends this node's presence (its users leave at once where
	// other nodes see it) and stops.
	Close() error
}

// PresenceOp is what a PresenceChange does.
type PresenceOp uint8

const (
	PresenceJoin    PresenceOp = iota + 1 // User is in Key on this node
	PresenceLeave                         // User is no longer in Key on this node
	PresenceWatch                         // this node has presence subscribers in Key
	PresenceUnwatch                       // ... and no longer has any
)

// PresenceChange is one change of this node's presence. User is empty for
// Watch and Unwatch.
type PresenceChange struct {
	Op   PresenceOp
	Key  string // proto.RoomKey(app, room)
	User string
}

// PresenceDiff is a room's users that joined (their first connection on
// any node) and left (their last one, on every node). Watched: some node
// has presence subscribers in the room.
type PresenceDiff struct {
	Key          string
	Joined, Left []string
	Watched      bool
}

// MemoryPresence is the in-process Presence of a single node.
type MemoryPresence struct {
	mu    sync.Mutex
	rooms map[string]*memRoom
}

type memRoom struct {
	users   map[string]struct{}
	watched bool
}

var _ Presence = (*MemoryPresence)(nil)

// NewMemoryPresence returns an empty in-process Presence.
func NewMemoryPresence() *MemoryPresence {
	return &MemoryPresence{rooms: make(map[string]*memRoom)}
}

// Apply implements Presence.
func (p *MemoryPresence) Apply(_ context.Context, changes []PresenceChange) ([]PresenceDiff, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var diffs []PresenceDiff
	at := map[string]int{} // room -> index in diffs
	for i := range changes {
		c := &changes[i]
		r := p.rooms[c.Key]
		if r == nil {
			if c.Op == PresenceLeave || c.Op == PresenceUnwatch {
				continue
			}
			r = &memRoom{users: make(map[string]struct{})}
			p.rooms[c.Key] = r
		}
		changed := false
		switch c.Op {
		case PresenceWatch:
			r.watched = true
		case PresenceUnwatch:
			r.watched = false
		case PresenceJoin:
			if _, ok := r.users[c.User]; !ok {
				r.users[c.User] = struct{}{}
				changed = true
			}
		case PresenceLeave:
			if _, ok := r.users[c.User]; ok {
				delete(r.users, c.User)
				changed = true
			}
		}
		if changed {
			k, ok := at[c.Key]
			if !ok {
				k = len(diffs)
				at[c.Key] = k
				diffs = append(diffs, PresenceDiff{Key: c.Key})
			}
			diffs[k].Watched = r.watched
			if c.Op == PresenceJoin {
				diffs[k].Joined = append(diffs[k].Joined, c.User)
			} else {
				diffs[k].Left = append(diffs[k].Left, c.User)
			}
		}
		if len(r.users) == 0 && !r.watched {
			delete(p.rooms, c.Key)
		}
	}
	return diffs, nil
}

// RenewAt implements Presence: one process has no lease to keep.
func (p *MemoryPresence) RenewAt() time.Time { return time.Time{} }

// Query implements Presence.
func (p *MemoryPresence) Query(_ context.Context, key string, limit int) (int, []string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.rooms[key]
	if r == nil {
		return 0, nil, nil
	}
	users := make([]string, 0, min(limit, len(r.users)))
	for u := range r.users {
		if len(users) == limit {
			break
		}
		users = append(users, u)
	}
	return len(r.users), users, nil
}

// Count implements Presence.
func (p *MemoryPresence) Count(_ context.Context, key string) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r := p.rooms[key]; r != nil {
		return len(r.users), nil
	}
	return 0, nil
}

// Counts implements Presence.
func (p *MemoryPresence) Counts(_ context.Context, keys []string, counts []int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, key := range keys {
		counts[i] = 0
		if r := p.rooms[key]; r != nil {
			counts[i] = len(r.users)
		}
	}
	return nil
}

// Close implements Presence.
func (p *MemoryPresence) Close() error { return nil }
