package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/roost-chat/roost/fanout"
	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/persist/pgtest"
	"github.com/roost-chat/roost/proto"
	"github.com/roost-chat/roost/pubsub"
	"github.com/roost-chat/roost/pubsub/redistest"
)

// The server API additions (docs/protocol.md, Server API additions): the
// rooms listing, a room's presence, broadcast. Each runs on the memory
// store and on PostgreSQL.

// stores runs f on the memory store and on a PostgreSQL database of its
// own.
func stores(t *testing.T, f func(t *testing.T, st persist.Store)) {
	t.Run("memory", func(t *testing.T) {
		st := persist.NewMemory(1000)
		t.Cleanup(st.Close)
		f(t, st)
	})
	t.Run("postgres", func(t *testing.T) {
		url := pgtest.NewDB(t)
		ctx := context.Background()
		if err := persist.Migrate(ctx, url); err != nil {
			t.Fatal(err)
		}
		st, err := persist.OpenPostgres(ctx, url, persist.PGConfig{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.Close)
		f(t, st)
	})
}

// apiOn is the API on store and a real publish path (presence, when not
// nil, builds the node's presence).
func apiOn(tb testing.TB, store persist.Store, cfg Config, parts fanout.Parts) (*Server, *fanout.Node) {
	tb.Helper()
	parts.Store = store
	if parts.Pool.Window == 0 {
		parts.Pool.Window = -1
	}
	fan, err := fanout.New(fanout.Config{Loops: 1, OutboundLimit: 1 << 20, MaxRooms: 256, Readers: 2, GapWindow: 250 * time.Millisecond}, parts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { fan.Close() })
	if cfg.Static == nil {
		cfg.Static = map[string][]byte{"chat": []byte(testSecret)}
	}
	return New(cfg, Parts{Fan: fan, Store: store, Disconnect: func(string, string, time.Duration) int { return 0 }}), fan
}

type listAnswer struct {
	Rooms []struct {
		Room     string
		Seq      uint64
		Presence struct{ Count int }
	}
	More bool
}

// Paging through 10,000 rooms, whole and by prefix, lists each once, in
// byte order, with its seq, whatever the page size.
func TestListRoomsAPI(t *testing.T) {
	stores(t, func(t *testing.T, st persist.Store) {
		s, _ := apiOn(t, st, Config{}, fanout.Parts{})
		ctx := context.Background()
		var names []string
		seq := map[string]uint64{}
		var batch []*persist.Row
		for i := range 10_000 {
			name := fmt.Sprintf("%s%d", []string{"team-", "team.", "team_", "Team", "dm:"}[i%5], i)
			names = append(names, name)
			n := uint64(1 + i%3)
			for k := range n {
				batch = append(batch, &persist.Row{Key: proto.RoomKey("chat", name), From: "u", ID: fmt.Appendf(nil, "m%d", k), Body: []byte(`1`)})
			}
			seq[name] = n
			if len(batch) >= 900 {
				if err := st.CommitBatch(ctx, batch); err != nil {
					t.Fatal(err)
				}
				batch = batch[:0]
			}
		}
		if err := st.CommitBatch(ctx, batch); err != nil {
			t.Fatal(err)
		}
		// Another app's rooms are not listed.
		if err := st.CommitBatch(ctx, []*persist.Row{{Key: proto.RoomKey("other", "team-1x"), From: "u", ID: []byte("a"), Body: []byte(`1`)}}); err != nil {
			t.Fatal(err)
		}
		slices.Sort(names)
		for _, c := range []struct {
			prefix string
			limit  int
		}{{"", 1000}, {"", 0}, {"team-", 333}, {"team", 1000}, {"dm:", 999}, {"Team99", 2}, {"nothing", 5}} {
			var want []string
			for _, n := range names {
				if strings.HasPrefix(n, c.prefix) {
					want = append(want, n)
				}
			}
			var got []string
			after := ""
			for {
				q := url.Values{}
				if c.prefix != "" {
					q.Set("prefix", c.prefix)
				}
				if after != "" {
					q.Set("after", after)
				}
				if c.limit > 0 {
					q.Set("limit", fmt.Sprint(c.limit))
				}
				rec := call(s, http.MethodGet, "/v1/apps/chat/rooms?"+q.Encode(), "")
				var a listAnswer
				if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &a) != nil {
					t.Fatalf("%s: %d %s", q.Encode(), rec.Code, rec.Body)
				}
				page := c.limit
				if page == 0 {
					page = defaultRoomsLimit
				}
				if len(a.Rooms) > page || a.More && len(a.Rooms) != page {
					t.Fatalf("%s: %d rooms, more %v", q.Encode(), len(a.Rooms), a.More)
				}
				for _, r := range a.Rooms {
					if r.Seq != seq[r.Room] || r.Presence.Count != 0 {
						t.Fatalf("room %+v: want seq %d", r, seq[r.Room])
					}
					got = append(got, r.Room)
				}
				if !a.More {
					break
				}
				after = a.Rooms[len(a.Rooms)-1].Room
			}
			if !slices.Equal(got, want) {
				t.Fatalf("prefix %q limit %d: %d rooms listed, want %d", c.prefix, c.limit, len(got), len(want))
			}
		}
		// Above 1000 counts as 1000.
		rec := call(s, http.MethodGet, "/v1/apps/chat/rooms?limit=5000", "")
		var a listAnswer
		if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &a) != nil || len(a.Rooms) != 1000 || !a.More {
			t.Fatalf("limit 5000: %d, %d rooms", rec.Code, len(a.Rooms))
		}
		for _, bad := range []string{"limit=0", "limit=-1", "limit=x", "prefix=a%20b", "prefix=" + strings.Repeat("x", 130), "after=a/b", "after=@"} {
			rec := call(s, http.MethodGet, "/v1/apps/chat/rooms?"+bad, "")
			if rec.Code != 400 || !strings.Contains(rec.Body.String(), `"bad_request"`) {
				t.Errorf("%s: %d %s", bad, rec.Code, rec.Body)
			}
		}
		if rec := call(s, http.MethodGet, "/v1/apps/chat/rooms?prefix=@", ""); rec.Code != 200 || strings.TrimSpace(rec.Body.String()) != `{"rooms":[],"more":false}` {
			t.Errorf("no inboxes: %d %s", rec.Code, rec.Body)
		}
	})
}

type bcastAnswer struct {
	Results []struct {
		Room  string
		Seq   uint64
		Error *struct{ Code, Message string }
	}
	Error *struct{ Code, Message string }
}

func bcastBody(rooms []string, id, body string) string {
	b, _ := json.Marshal(rooms)
	return `{"rooms":` + string(b) + `,"id":"` + id + `","from":"bot","body":` + body + `}`
}

// A broadcast to 1,000 rooms stores one message per room, each with the
// room's next seq; retried, it stores nothing and answers the same seqs.
func TestBroadcastAPI(t *testing.T) {
	stores(t, func(t *testing.T, st persist.Store) {
		s, fan := apiOn(t, st, Config{MaxMsg: 1024}, fanout.Parts{})
		ctx := context.Background()
		rooms := make([]string, MaxBroadcastRooms)
		for i := range rooms {
			rooms[i] = fmt.Sprintf("b%04d", i)
		}
		// Some rooms hold messages already: their broadcast seq follows.
		for i := 0; i < len(rooms); i += 10 {
			if rec := call(s, http.MethodPost, "/v1/apps/chat/rooms/"+rooms[i]+"/messages", `{"id":"x","from":"u","body":0}`); rec.Code != 200 {
				t.Fatal(rec.Body)
			}
		}
		before := fan.PoolStats().Batches
		body := bcastBody(rooms, "k-1", `{"text":"hi", "n":[1,2.50]}`)
		first := call(s, http.MethodPost, "/v1/apps/chat/broadcast", body)
		var a bcastAnswer
		if first.Code != 200 || json.Unmarshal(first.Body.Bytes(), &a) != nil || len(a.Results) != len(rooms) {
			t.Fatalf("broadcast: %d %.300s", first.Code, first.Body)
		}
		t.Logf("1000 rooms in %d group commits", fan.PoolStats().Batches-before)
		for i, r := range a.Results {
			want := uint64(1)
			if i%10 == 0 {
				want = 2
			}
			if r.Room != rooms[i] || r.Seq != want || r.Error != nil {
				t.Fatalf("result %d: %+v, want room %s seq %d", i, r, rooms[i], want)
			}
		}
		again := call(s, http.MethodPost, "/v1/apps/chat/broadcast", body)
		if again.Code != 200 || again.Body.String() != first.Body.String() {
			t.Fatalf("retry: %d %.300s", again.Code, again.Body)
		}
		for i, room := range rooms {
			last, err := st.LastSeq(ctx, proto.RoomKey("chat", room))
			if err != nil || last != a.Results[i].Seq {
				t.Fatalf("room %s: last seq %d (%v), want %d: stored twice?", room, last, err, a.Results[i].Seq)
			}
		}
		if got := s.Stats.Duplicates.Load(); got != uint64(len(rooms)) {
			t.Fatalf("duplicates %d, want %d", got, len(rooms))
		}
		msgs, _, err := st.Range(ctx, proto.RoomKey("chat", rooms[7]), 0, 1, persist.Bounds{Limit: 1})
		if err != nil || len(msgs) != 1 || string(msgs[0].Body) != `{"text":"hi", "n":[1,2.50]}` || msgs[0].From != "bot" || string(msgs[0].ID) != "k-1" {
			t.Fatalf("stored %+v %v", msgs, err)
		}

		// Bad input: a clear error, nothing stored.
		fresh := make([]string, MaxBroadcastRooms+1)
		for i := range fresh {
			fresh[i] = fmt.Sprintf("n%04d", i)
		}
		for _, c := range []struct {
			body string
			code int
			has  string
		}{
			{bcastBody(fresh, "k", `1`), 400, "at most 1000 rooms"},
			{bcastBody(fresh[:3], "k", `"`+strings.Repeat("x", 1100)+`"`), 413, "max-msg"},
			{bcastBody([]string{"n0001", "n0002", "n0001"}, "k", `1`), 400, "listed twice"},
			{bcastBody([]string{"n0001", "bad room"}, "k", `1`), 400, "invalid room name"},
			{bcastBody(nil, "k", `1`), 400, "rooms must be"},
			{bcastBody(fresh[:2], "", `1`), 400, "id must be"},
			{`{"rooms":["n0001"],"id":"k","body":1}`, 400, "from must be"},
			{`{"rooms":["n0001"],"id":"k","from":"bot"}`, 400, "missing body"},
			{`{"rooms":"n0001","id":"k","from":"bot","body":1}`, 400, "not a JSON object"},
		} {
			rec := call(s, http.MethodPost, "/v1/apps/chat/broadcast", c.body)
			if rec.Code != c.code || !strings.Contains(rec.Body.String(), c.has) {
				t.Errorf("%.80s: %d %s, want %d with %q", c.body, rec.Code, rec.Body, c.code, c.has)
			}
		}
		for _, room := range fresh {
			if last, _ := st.LastSeq(ctx, proto.RoomKey("chat", room)); last != 0 {
				t.Fatalf("room %s holds seq %d after refused broadcasts", room, last)
			}
		}
	})
}

// A broadcast counts one API request per room: over the burst it is
// refused as a whole, past the rate it waits, and nothing is stored
// either way.
func TestBroadcastRate(t *testing.T) {
	s, _ := apiOn(t, persist.NewMemory(10), Config{Rate: 10, Burst: 100}, fanout.Parts{})
	rooms := func(n int, p string) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("%s%d", p, i)
		}
		return out
	}
	if rec := call(s, http.MethodPost, "/v1/apps/chat/broadcast", bcastBody(rooms(101, "a"), "k", `1`)); rec.Code != 400 || !strings.Contains(rec.Body.String(), "--api-burst") {
		t.Fatalf("over the burst: %d %s", rec.Code, rec.Body)
	}
	if rec := call(s, http.MethodPost, "/v1/apps/chat/broadcast", bcastBody(rooms(60, "b"), "k", `1`)); rec.Code != 200 {
		t.Fatalf("within the burst: %d %s", rec.Code, rec.Body)
	}
	rec := call(s, http.MethodPost, "/v1/apps/chat/broadcast", bcastBody(rooms(60, "c"), "k", `1`))
	if rec.Code != 429 || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("past the rate: %d %s", rec.Code, rec.Body)
	}
	if last, _ := s.store.LastSeq(context.Background(), "chat/c0"); last != 0 {
		t.Fatal("a refused broadcast stored a message")
	}
}

// FuzzBroadcast: whatever the body, a broadcast is answered 200, 400 or
// 413 with a JSON answer; a 200 lists each room named once, with a seq.
func FuzzBroadcast(f *testing.F) {
	for _, seed := range []string{
		`{"rooms":["a","b"],"id":"k","from":"bot","body":{"x":[1,2.50,"\u00e9"]}}`,
		`{"rooms":["a","a"],"id":"k","from":"bot","body":1}`,
		`{"rooms":[],"id":"k","from":"bot","body":1}`,
		`{"rooms":null,"id":"k","from":"bot","body":1}`,
		`{"rooms":["@alice","x.y:z-_"],"id":"k","from":"bot","body":null}`,
		`{"rooms":["a b"],"id":"k","from":"bot","body":1}`,
		`{"rooms":[1],"id":"k","from":"bot","body":1}`,
		`{"rooms":["a"],"id":"k","from":"b\u0000","body":1}`,
		"{\"rooms\":[\"a\"],\"id\":\"k\",\"from\":\"b\",\"body\":\"\xff\"}",
		`{"rooms":["a"],"rooms":["b"],"id":"k","from":"b","body":1}`,
		`[]`, ``, `{`,
	} {
		f.Add(seed)
	}
	s, _ := apiOn(f, persist.NewMemory(10), Config{MaxMsg: 256}, fanout.Parts{})
	f.Fuzz(func(t *testing.T, body string) {
		rec := call(s, http.MethodPost, "/v1/apps/chat/broadcast", body)
		if rec.Code != 200 && rec.Code != 400 && rec.Code != 413 {
			t.Fatalf("%q answered %d %s", body, rec.Code, rec.Body)
		}
		if !json.Valid(rec.Body.Bytes()) {
			t.Fatalf("%q: answer %q is not JSON", body, rec.Body)
		}
		if rec.Code != 200 {
			return
		}
		var a bcastAnswer
		var req struct{ Rooms []string }
		_ = json.Unmarshal(rec.Body.Bytes(), &a)
		_ = json.Unmarshal([]byte(body), &req)
		if len(a.Results) != len(req.Rooms) {
			t.Fatalf("%q: %d results for %d rooms", body, len(a.Results), len(req.Rooms))
		}
		for i, r := range a.Results {
			if r.Room != req.Rooms[i] || r.Seq == 0 || !proto.ValidRoom([]byte(r.Room)) {
				t.Fatalf("%q: result %+v", body, r)
			}
		}
	})
}

type presenceAnswer struct {
	Room  string
	Count int
	Users []string
	More  bool
}

// A room's users, on every node: with Redis, two nodes' presences hold
// the room's members, and either node's API answers all of them (and
// counts them in the listing).
func TestPresenceAPI(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		mp := pubsub.NewMemoryPresence()
		s, _ := apiOn(t, persist.NewMemory(10), Config{}, fanout.Parts{NewPresence: func(pubsub.Broker) (pubsub.Presence, error) { return mp, nil }})
		var joins []pubsub.PresenceChange
		for i := range 1001 {
			joins = append(joins, pubsub.PresenceChange{Op: pubsub.PresenceJoin, Key: "chat/big", User: fmt.Sprintf("u%04d", i)})
		}
		if _, err := mp.Apply(context.Background(), joins); err != nil {
			t.Fatal(err)
		}
		var a presenceAnswer
		rec := call(s, http.MethodGet, "/v1/apps/chat/rooms/big/presence", "")
		if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &a) != nil || a.Count != 1001 || len(a.Users) != 1000 || !a.More || !slices.IsSorted(a.Users) {
			t.Fatalf("%d: count %d, %d users, more %v", rec.Code, a.Count, len(a.Users), a.More)
		}
		rec = call(s, http.MethodGet, "/v1/apps/chat/rooms/empty/presence", "")
		if rec.Code != 200 || strings.TrimSpace(rec.Body.String()) != `{"room":"empty","count":0,"users":[],"more":false}` {
			t.Fatalf("empty room: %d %s", rec.Code, rec.Body)
		}
		if rec := call(s, http.MethodGet, "/v1/apps/chat/rooms/a%20b/presence", ""); rec.Code != 400 {
			t.Fatalf("bad room: %d", rec.Code)
		}
	})
	t.Run("redis", func(t *testing.T) {
		redistest.Require(t)
		prefix := redistest.Prefix(t)
		st := persist.NewMemory(10) // the nodes' store is not what this tests
		t.Cleanup(st.Close)
		var servers []*Server
		var presences []pubsub.Presence
		for range 2 {
			var pr pubsub.Presence
			s, _ := apiOn(t, st, Config{}, fanout.Parts{
				NewBroker: func(h pubsub.Handler) (pubsub.Broker, error) {
					return pubsub.NewRedis(context.Background(), pubsub.RedisConfig{Addrs: []string{redistest.Addr}, Prefix: prefix}, h, nil)
				},
				NewPresence: func(bus pubsub.Broker) (pubsub.Presence, error) {
					pr = bus.(*pubsub.Redis).NewPresence(pubsub.RedisPresenceConfig{Lease: time.Minute, Grace: time.Second})
					return pr, nil
				},
			})
			servers, presences = append(servers, s), append(presences, pr)
		}
		ctx := context.Background()
		join := func(p pubsub.Presence, users ...string) {
			var cs []pubsub.PresenceChange
			for _, u := range users {
				cs = append(cs, pubsub.PresenceChange{Op: pubsub.PresenceJoin, Key: "chat/lobby", User: u})
			}
			if _, err := p.Apply(ctx, cs); err != nil {
				t.Fatal(err)
			}
		}
		join(presences[0], "alice", "bob")
		join(presences[1], "bob", "carol")
		if _, err := st.Head(ctx, "chat/lobby"); err != nil {
			t.Fatal(err)
		}
		for i, s := range servers {
			var a presenceAnswer
			rec := call(s, http.MethodGet, "/v1/apps/chat/rooms/lobby/presence", "")
			if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &a) != nil || a.Count != 3 || !slices.Equal(a.Users, []string{"alice", "bob", "carol"}) || a.More {
				t.Fatalf("node %d: %d %s", i, rec.Code, rec.Body)
			}
			rec = call(s, http.MethodGet, "/v1/apps/chat/rooms?prefix=lob", "")
			if rec.Code != 200 || strings.TrimSpace(rec.Body.String()) != `{"rooms":[{"room":"lobby","seq":0,"presence":{"count":3}}],"more":false}` {
				t.Fatalf("node %d listing: %d %s", i, rec.Code, rec.Body)
			}
		}
	})
}

// benchStores runs f on the memory store and on PostgreSQL.
func benchStores(b *testing.B, f func(b *testing.B, st persist.Store)) {
	b.Run("memory", func(b *testing.B) {
		st := persist.NewMemory(100)
		b.Cleanup(st.Close)
		f(b, st)
	})
	b.Run("postgres", func(b *testing.B) {
		url := pgtest.NewDB(b)
		ctx := context.Background()
		if err := persist.Migrate(ctx, url); err != nil {
			b.Fatal(err)
		}
		st, err := persist.OpenPostgres(ctx, url, persist.PGConfig{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(st.Close)
		f(b, st)
	})
}

// BenchmarkBroadcast1000: one broadcast of a small body to 1,000 rooms
// per op, each a new message (a new id per op), through the real publish
// pool (its default 10 ms window); rooms/s is the commits per second.
func BenchmarkBroadcast1000(b *testing.B) {
	benchStores(b, func(b *testing.B, st persist.Store) {
		s, fan := apiOn(b, st, Config{MaxMsg: 1024}, fanout.Parts{Pool: fanout.PoolConfig{Window: 10 * time.Millisecond}})
		rooms := make([]string, MaxBroadcastRooms)
		for i := range rooms {
			rooms[i] = fmt.Sprintf("room-%04d", i)
		}
		list, _ := json.Marshal(rooms)
		batches := fan.PoolStats().Batches
		b.ResetTimer()
		for i := range b.N {
			rec := call(s, http.MethodPost, "/v1/apps/chat/broadcast", `{"rooms":`+string(list)+`,"id":"b-`+fmt.Sprint(i)+`","from":"bot","body":{"text":"hello"}}`)
			if rec.Code != 200 {
				b.Fatal(rec.Body)
			}
		}
		b.ReportMetric(float64(b.N*len(rooms))/b.Elapsed().Seconds(), "rooms/s")
		b.ReportMetric(float64(fan.PoolStats().Batches-batches)/float64(b.N), "commits/op")
	})
}

// BenchmarkListRooms1000: one page of 1,000 rooms (of 20,000) per op,
// with their presence counts.
func BenchmarkListRooms1000(b *testing.B) {
	benchStores(b, func(b *testing.B, st persist.Store) {
		s, _ := apiOn(b, st, Config{}, fanout.Parts{})
		ctx := context.Background()
		var batch []*persist.Row
		for i := range 20_000 {
			batch = append(batch, &persist.Row{Key: proto.RoomKey("chat", fmt.Sprintf("room-%05d", i)), From: "u", ID: []byte("a"), Body: []byte(`1`)})
			if len(batch) == 1000 {
				if err := st.CommitBatch(ctx, batch); err != nil {
					b.Fatal(err)
				}
				batch = batch[:0]
			}
		}
		b.ResetTimer()
		for i := range b.N {
			rec := call(s, http.MethodGet, fmt.Sprintf("/v1/apps/chat/rooms?limit=1000&after=room-%05d", (i*1000)%19_000), "")
			if rec.Code != 200 {
				b.Fatal(rec.Body)
			}
		}
	})
}
