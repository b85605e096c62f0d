package persist

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/roost-chat/roost/proto"
)

func TestMemoryListRooms(t *testing.T) {
	testListRooms(t, NewMemory(10))
}

func TestPostgresListRooms(t *testing.T) {
	p := newPG(t)
	ctx := context.Background()
	// Names in a locale's order, as most databases have them (this
	// machine's is C.UTF-8, byte order for ASCII): the listing must be in
	// byte order all the same.
	var icu bool
	if err := p.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_collation WHERE collname = 'en-US-x-icu')`).Scan(&icu); err != nil {
		t.Fatal(err)
	}
	if icu {
		if _, err := p.pool.Exec(ctx, `ALTER TABLE rooms ALTER COLUMN name TYPE text COLLATE "en-US-x-icu"`); err != nil {
			t.Fatal(err)
		}
	} else {
		t.Log("no en-US-x-icu collation: room names keep the database's collation")
	}
	testListRooms(t, p)
	// One range scan of the byte-order index, never a sort of the app's
	// rooms (ANALYZE first: the planner needs to know the table is big).
	if _, err := p.pool.Exec(ctx, `ANALYZE rooms`); err != nil {
		t.Fatal(err)
	}
	rows, err := p.pool.Query(ctx, `EXPLAIN `+listRoomsSQL, "app", "r", "r\x7f", "", 101)
	if err != nil {
		t.Fatal(err)
	}
	var plan []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, line)
	}
	rows.Close()
	all := strings.Join(plan, "\n")
	if !strings.Contains(all, "rooms_app_name_bytes") || strings.Contains(all, "Sort") {
		t.Fatalf("listing is not one scan of rooms_app_name_bytes:\n%s", all)
	}
}

// roomNames are n distinct names over the room alphabet, in no order:
// punctuation, digits and both cases, whose byte order differs from most
// collations' (a locale's order would show as a gap or a repeat), and a
// few inboxes.
func roomNames(n int) []string {
	const alphabet = "AZaz09_.:-"
	rng := rand.New(rand.NewPCG(1, 2))
	seen := map[string]bool{}
	var out []string
	for len(out) < n {
		var b strings.Builder
		if rng.IntN(20) == 0 {
			b.WriteByte('@')
		}
		b.WriteString([]string{"r", "R", "r-", "r.", "r_", "s", "0"}[rng.IntN(7)])
		for k := 1 + rng.IntN(6); k > 0; k-- {
			b.WriteByte(alphabet[rng.IntN(len(alphabet))])
		}
		if name := b.String(); !seen[name] {
			seen[name] = true
			out = append(out, name)
		}
	}
	return out
}

// testListRooms pages through 10,000 rooms of an app (some made by a
// read, with no message) beside another app's, whole and by prefixes, and
// finds each room once, in byte order, with its newest seq.
func testListRooms(t *testing.T, st interface {
	Store
	RoomLister
}) {
	ctx := context.Background()
	names := roomNames(10_000)
	last := map[string]uint64{}
	var batch []*Row
	for i, name := range names {
		switch i % 3 {
		case 0: // made by a read: seq 0
			if _, err := st.Head(ctx, proto.RoomKey("app", name)); err != nil {
				t.Fatal(err)
			}
			last[name] = 0
		default:
			batch = append(batch, req(proto.RoomKey("app", name), "u", "a", `1`))
			last[name] = 1
			if i%3 == 2 {
				batch = append(batch, req(proto.RoomKey("app", name), "u", "b", `2`))
				last[name] = 2
			}
		}
		batch = append(batch, req(proto.RoomKey("other", name+"x"), "u", "a", `1`))
		if len(batch) >= 500 || i == len(names)-1 {
			commit(t, st, batch...)
			batch = nil
		}
	}
	// The app's connection events room is no room anyone lists.
	commit(t, st, req(proto.RoomKey("app", proto.EventsRoom), "roost", "ev-1", `{"type":"online","user":"u","ts":1}`))
	sorted := slices.Clone(names)
	slices.Sort(sorted)

	pageAll := func(prefix string, limit int) []string {
		t.Helper()
		var got []string
		after := ""
		for pages := 0; ; pages++ {
			if pages > len(names)+1 {
				t.Fatalf("prefix %q limit %d: paging does not end", prefix, limit)
			}
			rooms, more, err := st.ListRooms(ctx, "app", prefix, after, limit)
			if err != nil {
				t.Fatal(err)
			}
			if len(rooms) > limit || more && len(rooms) < limit {
				t.Fatalf("prefix %q after %q limit %d: %d rooms, more %v", prefix, after, limit, len(rooms), more)
			}
			for _, r := range rooms {
				if r.Last != last[r.Name] {
					t.Fatalf("room %q: last %d, want %d", r.Name, r.Last, last[r.Name])
				}
				got = append(got, r.Name)
			}
			if !more {
				return got
			}
			after = rooms[len(rooms)-1].Name
		}
	}
	for _, c := range []struct {
		prefix string
		limit  int
	}{{"", 1000}, {"", 97}, {"r", 100}, {"r-", 7}, {"R", 1000}, {"@", 50}, {"r.A", 3}, {"zzz", 10}} {
		var want []string
		for _, n := range sorted {
			if strings.HasPrefix(n, c.prefix) {
				want = append(want, n)
			}
		}
		if got := pageAll(c.prefix, c.limit); !slices.Equal(got, want) {
			t.Fatalf("prefix %q limit %d: %d rooms listed, want %d (first difference at %s)", c.prefix, c.limit, len(got), len(want), firstDiff(got, want))
		}
	}
	// after need not be a room, nor start with the prefix.
	rooms, more, err := st.ListRooms(ctx, "app", "r", "R", 2)
	if err != nil || len(rooms) != 2 || !more || !strings.HasPrefix(rooms[0].Name, "r") {
		t.Fatalf("after below the prefix: %v %v %v", rooms, more, err)
	}
	if rooms, more, err := st.ListRooms(ctx, "nobody", "", "", 10); err != nil || len(rooms) != 0 || more {
		t.Fatalf("an app without rooms: %v %v %v", rooms, more, err)
	}
}

func firstDiff(a, b []string) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return fmt.Sprintf("%d: %q vs %q", i, a[i], b[i])
		}
	}
	return fmt.Sprint(min(len(a), len(b)))
}

// Rooms made while an app is paged through: each room that existed when
// the paging started is listed once, the new ones past the cursor too, and
// none twice (the memory index merges new names as pages go).
func TestMemoryListRoomsWhileMade(t *testing.T) {
	st := NewMemory(10)
	ctx := context.Background()
	names := roomNames(6000)
	for _, n := range names[:3000] {
		if _, err := st.Head(ctx, proto.RoomKey("app", n)); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]bool{}
	after, next := "", 3000
	for {
		rooms, more, err := st.ListRooms(ctx, "app", "", after, 50)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rooms {
			if seen[r.Name] || r.Name <= after {
				t.Fatalf("room %q listed twice or out of order (after %q)", r.Name, after)
			}
			seen[r.Name] = true
		}
		for k := 0; k < 40 && next < len(names); k++ { // more rooms than a page
			if _, err := st.Head(ctx, proto.RoomKey("app", names[next])); err != nil {
				t.Fatal(err)
			}
			next++
		}
		if !more {
			break
		}
		after = rooms[len(rooms)-1].Name
	}
	for _, n := range names[:3000] {
		if !seen[n] {
			t.Fatalf("room %q existed before the paging and was not listed", n)
		}
	}
}
