package fanout

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
)

// The presence transitions an app wants become events of its events room,
// committed in order (online, joined before left, offline) and handed to
// OnCommitted as their JSON; rooms and apps that want none make none; a
// return within the grace makes nothing.
func TestConnEventsCommitted(t *testing.T) {
	store := persist.NewMemory(100)
	var mu sync.Mutex
	var got []string
	n, err := New(Config{Loops: 1, OutboundLimit: 1 << 20, MaxRooms: 8, Readers: 1, GapWindow: time.Second}, Parts{
		Store: store, Pool: PoolConfig{Window: -1}, PresenceGrace: 300 * time.Millisecond,
		ConnEvents: func(e proto.ConnEvent, app, room string) bool { return app == "a" && room != "quiet" },
		OnCommitted: func(key string, seq uint64, ts int64, frame []byte) {
			mu.Lock()
			defer mu.Unlock()
			if key != "a/"+proto.EventsRoom {
				t.Errorf("event in %s", key)
			}
			got = append(got, fmt.Sprintf("%d %s", seq, frame))
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	wait := func(k int) []string {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			mu.Lock()
			g := slices.Clone(got)
			mu.Unlock()
			if len(g) >= k || time.Now().After(deadline) {
				return g
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	n.Online("a", "bob", true)
	n.pres.join("a/r", "bob", false)
	n.pres.join("a/quiet", "bob", false)
	n.Online("b", "bob", true) // an app that wants none
	g := wait(2)
	if len(g) != 2 || !strings.HasPrefix(g[0], `1 {"type":"online","user":"bob","ts":`) || !strings.HasPrefix(g[1], `2 {"type":"joined","room":"r","user":"bob","ts":`) {
		t.Fatalf("events %q", g)
	}
	// A reload: gone and back within the grace.
	n.pres.leave("a/r", "bob", false, time.Now().UnixMilli())
	n.Online("a", "bob", false)
	n.Online("a", "bob", true)
	n.pres.join("a/r", "bob", false)
	time.Sleep(600 * time.Millisecond)
	if g := wait(3); len(g) != 2 {
		t.Fatalf("a reload made events: %q", g)
	}
	now := time.Now().UnixMilli()
	n.pres.leave("a/r", "bob", false, now)
	n.pres.leave("a/quiet", "bob", false, now)
	n.Online("a", "bob", false)
	n.Online("b", "bob", false)
	g = wait(4)
	if len(g) != 4 || !strings.HasPrefix(g[2], `3 {"type":"left","room":"r","user":"bob"`) || !strings.HasPrefix(g[3], `4 {"type":"offline","user":"bob"`) {
		t.Fatalf("events %q", g)
	}
	// Stored as messages of the events room, the event as the body.
	msgs, _, err := store.History(context.Background(), "a/"+proto.EventsRoom, 0, persist.Bounds{Limit: 10})
	if err != nil || len(msgs) != 4 || !strings.HasPrefix(string(msgs[3].Body), `{"type":"offline"`) {
		t.Fatalf("stored: %v %+v", err, msgs)
	}
	cs := n.ConnEventStats()
	if cs.Made[proto.EventOnline].Load() != 1 || cs.Made[proto.EventJoined].Load() != 1 || cs.Committed.Load() != 4 || cs.Owed.Load() != 0 {
		t.Fatalf("stats: made %d %d, committed %d, owed %d", cs.Made[proto.EventOnline].Load(), cs.Made[proto.EventJoined].Load(), cs.Committed.Load(), cs.Owed.Load())
	}
}
