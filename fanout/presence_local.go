package fanout

import (
	"context"
	"time"

	"github.com/roost-chat/roost/pubsub"
)

// localPresence is the Presence of a node that has no shared one (no
// Redis): the node's own counts answer it. A user is present in a room
// from the tick that applied its Join (presUser.reported) to the one that
// applied its Leave, which is what an in-process store given the same
// changes would hold (pubsub.MemoryPresence); holding that set a second
// time cost an idle joined connection a map slot of its own (density:
// docs/bench-notes/2026-12-06.md, "density2").
//
// Apply runs on the presence goroutine after collect, which has already
// set reported and watched for the tick's changes: it only turns them into
// diffs, each room's marked Watched as the tick left it (every transition
// is one: collect reports a Join only when not reported, a Leave only when
// reported; connection events want the unwatched rooms' too).
type localPresence struct{ pr *presence }

var _ pubsub.Presence = localPresence{}

// Apply implements pubsub.Presence.
func (l localPresence) Apply(_ context.Context, changes []pubsub.PresenceChange) ([]pubsub.PresenceDiff, error) {
	var diffs []pubsub.PresenceDiff
	var at map[string]int // room -> index in diffs
	for i := range changes {
		c := &changes[i]
		if c.Op != pubsub.PresenceJoin && c.Op != pubsub.PresenceLeave {
			continue
		}
		k, ok := at[c.Key]
		if !ok {
			if at == nil {
				at = make(map[string]int)
			}
			k = len(diffs)
			at[c.Key] = k
			s := l.pr.shard(c.Key)
			s.mu.Lock()
			r := s.rooms[c.Key] // nil: dropped, so not watched
			watched := r != nil && r.watched
			s.mu.Unlock()
			diffs = append(diffs, pubsub.PresenceDiff{Key: c.Key, Watched: watched})
		}
		if c.Op == pubsub.PresenceJoin {
			diffs[k].Joined = append(diffs[k].Joined, c.User)
		} else {
			diffs[k].Left = append(diffs[k].Left, c.User)
		}
	}
	return diffs, nil
}

// RenewAt implements pubsub.Presence: one process has no lease to keep.
func (localPresence) RenewAt() time.Time { return time.Time{} }

// Query implements pubsub.Presence.
func (l localPresence) Query(_ context.Context, key string, limit int) (int, []string, error) {
	s := l.pr.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.rooms[key]
	if r == nil || r.present == 0 {
		return 0, nil, nil
	}
	users := make([]string, 0, min(limit, r.present))
	for name, u := range r.users {
		if len(users) == limit {
			break
		}
		if u.reported {
			users = append(users, name)
		}
	}
	return r.present, users, nil
}

// Count implements pubsub.Presence.
func (l localPresence) Count(_ context.Context, key string) (int, error) {
	s := l.pr.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.rooms[key]; r != nil {
		return r.present, nil
	}
	return 0, nil
}

// Counts implements pubsub.Presence.
func (l localPresence) Counts(ctx context.Context, keys []string, counts []int) error {
	for i, key := range keys {
		counts[i], _ = l.Count(ctx, key)
	}
	return nil
}

// Close implements pubsub.Presence.
func (localPresence) Close() error { return nil }
