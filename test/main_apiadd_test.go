package test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/roost-chat/roost/pubsub/redistest"
)

// TestServerAPIAdditions, two nodes with Redis and PostgreSQL, members
// connected to both: a room's presence through either node's API names
// the users of both; the rooms listing counts them; a broadcast reaches
// the members of its rooms on both nodes, once, and a retry stores
// nothing; a broadcast to 1,001 rooms is refused and stores nothing.
func TestServerAPIAdditions(t *testing.T) {
	redistest.Require(t)
	e := newEnv(t, redistest.Addr)
	apps := writeAPIApps(t)
	n0, api0 := apiNode(t, e, "node0", apps)
	n1, api1 := apiNode(t, e, "node1", apps)
	alice := dialClient(t, n0, "alice")
	bob := dialClient(t, n1, "bob")
	carol := dialClient(t, n1, "carol")
	alice.join(t, "lobby")
	alice.join(t, "side")
	bob.join(t, "lobby")
	carol.join(t, "lobby")

	base := "/v1/apps/" + testApp
	for _, api := range []string{api0, api1} {
		redistest.WaitFor(t, 10*time.Second, func() error {
			a := apiCall(t, http.MethodGet, api+base+"/rooms/lobby/presence", apiSecret, "")
			if a.status != 200 || string(a.body) != `{"room":"lobby","count":3,"users":["alice","bob","carol"],"more":false}`+"\n" {
				return fmt.Errorf("presence through %s: %d %s", api, a.status, a.body)
			}
			return nil
		})
	}
	a := apiCall(t, http.MethodGet, api1+base+"/rooms?limit=10", apiSecret, "")
	if a.status != 200 || string(a.body) != `{"rooms":[{"room":"lobby","seq":0,"presence":{"count":3}},{"room":"side","seq":0,"presence":{"count":1}}],"more":false}`+"\n" {
		t.Fatalf("listing: %d %s", a.status, a.body)
	}

	body := `{"rooms":["lobby","side","fresh"],"id":"b-1","from":"bot","body":{"text":"hello all"}}`
	first := apiCall(t, http.MethodPost, api0+base+"/broadcast", apiSecret, body)
	if first.status != 200 || string(first.body) != `{"results":[{"room":"lobby","seq":1},{"room":"side","seq":1},{"room":"fresh","seq":1}]}`+"\n" {
		t.Fatalf("broadcast: %d %s", first.status, first.body)
	}
	again := apiCall(t, http.MethodPost, api1+base+"/broadcast", apiSecret, body)
	if again.status != 200 || string(again.body) != string(first.body) {
		t.Fatalf("retry through the other node: %d %s", again.status, again.body)
	}
	if n := storedRows(t, e.dbURL, "bot", "b-1"); n != 3 {
		t.Fatalf("%d rows of the broadcast, want 3", n)
	}
	got := func(c *wsClient, room string) []uint64 {
		c.mu.Lock()
		defer c.mu.Unlock()
		return slices.Clone(c.msgs[room])
	}
	redistest.WaitFor(t, 10*time.Second, func() error {
		for _, w := range []struct {
			c    *wsClient
			room string
		}{{alice, "lobby"}, {alice, "side"}, {bob, "lobby"}, {carol, "lobby"}} {
			if s := got(w.c, w.room); !slices.Equal(s, []uint64{1}) {
				return fmt.Errorf("%s in %s got seqs %v, want [1]", w.c.user, w.room, s)
			}
		}
		return nil
	})
	if s := got(bob, "side"); len(s) != 0 {
		t.Fatalf("bob got side's message without joining it: %v", s)
	}

	rooms := make([]string, 1001)
	for i := range rooms {
		rooms[i] = fmt.Sprintf("r%d", i)
	}
	list, _ := json.Marshal(rooms)
	over := apiCall(t, http.MethodPost, api0+base+"/broadcast", apiSecret, `{"rooms":`+string(list)+`,"id":"b-2","from":"bot","body":1}`)
	over.want(t, "1,001 rooms", 400, "bad_request")
	if !strings.Contains(string(over.body), "at most 1000 rooms") {
		t.Fatalf("1,001 rooms: the reason is not given: %s", over.body)
	}
	if n := storedRows(t, e.dbURL, "bot", "b-2"); n != 0 {
		t.Fatalf("a refused broadcast stored %d rows", n)
	}
}
