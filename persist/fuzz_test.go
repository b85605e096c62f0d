package persist

import (
	"bytes"
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/roost-chat/roost/persist/pgtest"
	"github.com/roost-chat/roost/proto"
)

// FuzzStoreInput drives the paths by which a user id and a room name reach
// the store: the query of the upgrade (percent-decoded, then ValidUser) and
// a pub frame (Decode: room, id, body). Whatever those accept must be
// stored without error, by the memory store and by PostgreSQL, and read
// back byte for byte; whatever they refuse never reaches a store. One bad
// value in a group commit used to fail everybody's publishes.
func FuzzStoreInput(f *testing.F) {
	f.Add("user=alice", []byte(`{"op":"pub","room":"lobby","id":"m-1","body":{"t":"hi"}}`))
	f.Add("user=ev%00il", []byte(`{"op":"pub","room":"r","id":"1","body":1}`))
	f.Add("user=%ff%fe", []byte(`{"op":"pub","room":"r","id":"1","body":1}`))
	f.Add("user=Zo%C3%AB&app=demo", []byte(`{"op":"pub","room":"a.b:c-d_e","id":"\u00e9\ud83d\ude00","body":"\u0000"}`))
	f.Add("user=tab%09x", []byte(`{"op":"pub","room":"r","id":"\u0000","body":[]}`))
	f.Add("user=x", []byte(`{"op":"pub","room":"ro\u0000om","id":"1","body":1}`))
	f.Add("user=x", []byte(`{"op":"pub","room":"r","id":"\ud800","body":1}`))
	f.Add("user=%E6%97%A5%E6%9C%AC", []byte(`{"op":"pub","room":"r","id":"`+string(bytes.Repeat([]byte("é"), 64))+`","body":null}`))

	stores := []Store{NewMemory(10)}
	if url := fuzzPG(f); url != "" {
		pg := openTestPG(f, url, PGConfig{})
		f.Cleanup(pg.Close)
		stores = append(stores, pg)
	}
	var n int
	f.Fuzz(func(t *testing.T, query string, frame []byte) {
		user, ok := proto.QueryValue([]byte(query), "user", nil)
		if !ok || !proto.ValidUser(user) {
			return
		}
		var cmd proto.Command
		if proto.Decode(frame, &cmd) != nil || cmd.Op != proto.OpPub {
			return
		}
		n++
		// A fresh id per run: the fuzzer repeats inputs, and a duplicate
		// would be answered from the first run.
		id := append(append([]byte{}, cmd.ID...), byte(n), byte(n>>8), byte(n>>16))
		req := &Row{Key: proto.RoomKey("fz", string(cmd.Room)), From: string(user), ID: id, Body: cmd.Body}
		for _, st := range stores {
			res := make([]Stored, 1)
			if err := commitInto(context.Background(), st, []*Row{req}, res); err != nil || res[0].Err != nil {
				t.Fatalf("%T refused accepted input user %q room %q id %q: %v %v", st, user, cmd.Room, cmd.ID, err, res[0].Err)
			}
			if res[0].Duplicate {
				continue
			}
			msgs, _, err := st.History(context.Background(), req.Key, res[0].Seq+1, Bounds{Limit: 1})
			if err != nil || len(msgs) != 1 {
				t.Fatalf("%T: read back %v %v", st, msgs, err)
			}
			m := msgs[0]
			if m.From != req.From || m.ID != string(req.ID) || !bytes.Equal(m.Body, req.Body) || m.Room != string(cmd.Room) {
				t.Fatalf("%T: stored %+v, sent user %q room %q id %q body %q", st, m, user, cmd.Room, id, cmd.Body)
			}
		}
	})
}

// fuzzPG is a database of its own when PostgreSQL is reachable (required
// with CI=true), else "" and the fuzzer checks the memory store only.
func fuzzPG(f *testing.F) string {
	if os.Getenv("ROOST_FUZZ_MEMORY_ONLY") != "" {
		return ""
	}
	if os.Getenv("CI") != "true" {
		c, err := pgx.Connect(context.Background(), pgtest.AdminURL())
		if err != nil {
			f.Logf("PostgreSQL not reachable, memory store only: %v", err)
			return ""
		}
		c.Close(context.Background())
	}
	return pgtest.NewDB(f)
}
