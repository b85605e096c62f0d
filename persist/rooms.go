package persist

import (
	"context"
	"slices"
	"strings"

	"github.com/roost-chat/roost/proto"
)

// RoomInfo is one room of a listing: its name (without the app) and its
// newest committed seq (0: nothing stored yet).
type RoomInfo struct {
	Name string
	Last uint64
}

// RoomLister lists an app's rooms by name, for the server API's
// GET /v1/apps/{app}/rooms. Memory and Postgres implement it.
type RoomLister interface {
	// ListRooms returns at most limit rooms of app whose names start with
	// prefix and sort after after ("": from the first), in byte order of
	// their names, each with its newest seq. more reports that rooms with
	// prefix are left past the last one returned: the caller pages on with
	// after set to that name. A room exists from its first publish or read
	// (Head); rooms are never removed, so paging through an app sees every
	// room that existed when it started, once. Any goroutine.
	ListRooms(ctx context.Context, app, prefix, after string, limit int) (rooms []RoomInfo, more bool, err error)
}

var (
	_ RoomLister = (*Memory)(nil)
	_ RoomLister = (*Postgres)(nil)
)

// --- memory ---

// memNames is the memory store's index of one app's room names, kept
// under Memory.appsMu. A new room is appended to fresh (O(1) where rooms
// are made, which holds a room shard's lock); a listing sorts fresh when
// it must and reads the page from both sorted lists at once, and fresh is
// merged into sorted only once it holds a sixteenth as many names (at
// least freshMerge), so that rooms made between listings cost an
// amortized constant each and a listing of an app of a million rooms does
// not copy them all.
type memNames struct {
	sorted      []string // room names (substrings of their keys), ascending
	fresh       []string // made since the last merge
	freshSorted bool
}

// freshMerge is the fewest fresh names merged into sorted at once.
const freshMerge = 1024

func (n *memNames) add(name string) {
	n.fresh = append(n.fresh, name)
	n.freshSorted = false
}

// page appends to dst at most limit+1 names with prefix that sort after
// after, ascending. Caller holds Memory.appsMu.
func (n *memNames) page(dst []string, prefix, after string, limit int) []string {
	if !n.freshSorted {
		slices.Sort(n.fresh)
		n.freshSorted = true
	}
	if len(n.fresh) >= max(freshMerge, len(n.sorted)/16) {
		merged := make([]string, 0, len(n.sorted)+len(n.fresh))
		n.sorted = mergeSorted(merged, n.sorted, n.fresh)
		n.fresh = n.fresh[:0]
	}
	a, b := n.sorted[startAt(n.sorted, prefix, after):], n.fresh[startAt(n.fresh, prefix, after):]
	for len(dst) <= limit {
		var name string
		switch {
		case len(a) > 0 && (len(b) == 0 || a[0] < b[0]):
			name, a = a[0], a[1:]
		case len(b) > 0:
			name, b = b[0], b[1:]
		default:
			return dst
		}
		if !strings.HasPrefix(name, prefix) {
			return dst // past the names with prefix
		}
		dst = append(dst, name)
	}
	return dst
}

// startAt is the index of the first name of sorted that is >= prefix and
// > after.
func startAt(sorted []string, prefix, after string) int {
	i, _ := slices.BinarySearch(sorted, prefix)
	if after != "" {
		j, found := slices.BinarySearch(sorted, after)
		if found {
			j++
		}
		i = max(i, j)
	}
	return i
}

func mergeSorted(dst, a, b []string) []string {
	for len(a) > 0 && len(b) > 0 {
		if a[0] < b[0] {
			dst, a = append(dst, a[0]), a[1:]
		} else {
			dst, b = append(dst, b[0]), b[1:]
		}
	}
	return append(append(dst, a...), b...)
}

// indexRoom adds a new room of ma to its app's name index. Called where
// the room is made, under the room's shard lock (which is taken before
// appsMu, as in countRoom).
func (m *Memory) indexRoom(ma *memApp, key string) {
	_, name := proto.SplitKey(key)
	if name == proto.EventsRoom {
		return // an app's connection events: no room anyone lists
	}
	m.appsMu.Lock()
	ma.names.add(name)
	m.appsMu.Unlock()
}

// ListRooms implements RoomLister: the names come from the app's index
// (one lock, a binary search and at most limit+1 names read), then each
// room's newest seq from its shard.
func (m *Memory) ListRooms(ctx context.Context, app, prefix, after string, limit int) ([]RoomInfo, bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	if limit <= 0 {
		return nil, false, nil
	}
	m.appsMu.Lock()
	var names []string
	if ma := m.apps[app]; ma != nil {
		names = ma.names.page(make([]string, 0, min(limit+1, 1024)), prefix, after, limit)
	}
	m.appsMu.Unlock()
	more := len(names) > limit
	if more {
		names = names[:limit]
	}
	out := make([]RoomInfo, len(names))
	for i, name := range names {
		key := proto.RoomKey(app, name)
		sh := m.shard(key)
		sh.mu.Lock()
		if r := sh.rooms[key]; r != nil {
			out[i] = RoomInfo{Name: name, Last: r.last}
		}
		sh.mu.Unlock()
	}
	return out, more, nil
}

// --- PostgreSQL ---

// listRoomsSQL reads one page of an app's rooms in one range scan of
// rooms_app_name_bytes (migration 0010), in byte order whatever the
// database's collation. Room names are ASCII below '~' (0x7e, which
// starts only the reserved proto.EventsRoom, never listed), so those with
// prefix $2 are exactly those in [$2, $2 || '~').
const listRoomsSQL = `
SELECT name, last_seq FROM rooms
WHERE app = $1 AND name COLLATE "C" >= $2 AND name COLLATE "C" < $3 AND name COLLATE "C" > $4
ORDER BY name COLLATE "C" LIMIT $5`

// ListRooms implements RoomLister.
func (p *Postgres) ListRooms(ctx context.Context, app, prefix, after string, limit int) ([]RoomInfo, bool, error) {
	if limit <= 0 {
		return nil, false, nil
	}
	if p.closed.Load() {
		return nil, false, proto.ErrClosed
	}
	rows, err := p.pool.Query(ctx, listRoomsSQL, app, prefix, prefix+"~", after, limit+1)
	if err != nil {
		return nil, false, p.wrap("list rooms", err)
	}
	defer rows.Close()
	out := make([]RoomInfo, 0, min(limit+1, 1024))
	for rows.Next() {
		var name string
		var last int64
		if err := rows.Scan(&name, &last); err != nil {
			return nil, false, p.wrap("list rooms", err)
		}
		out = append(out, RoomInfo{Name: name, Last: uint64(last)})
	}
	if err := rows.Err(); err != nil {
		return nil, false, p.wrap("list rooms", err)
	}
	more := len(out) > limit
	if more {
		out = out[:limit]
	}
	return out, more, nil
}
