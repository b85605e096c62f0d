package test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/roost-chat/roost/proto/prototest"
	"github.com/roost-chat/roost/pubsub/redistest"
	"github.com/roost-chat/roost/test/harness"
)

// Connection events (docs/protocol.md, Connection events) against real
// nodes: two `roost serve` processes sharing PostgreSQL and Redis, an
// app whose webhook wants msg, presence and connection, and a real HTTP
// receiver recording every event it answered 2xx for.

// connEvent is one event as the receiver got it.
type connEvent struct {
	Type string `json:"type"`
	Room string `json:"room"`
	User string `json:"user"`
	TS   int64  `json:"ts"`
}

func (e connEvent) String() string {
	if e.Room != "" {
		return e.Type + ":" + e.Room
	}
	return e.Type
}

// eventReceiver is the app's webhook: it records the connection events
// per user, in the order they arrived, and answers 503 while down.
type eventReceiver struct {
	srv  *httptest.Server
	down atomic.Bool

	mu     sync.Mutex
	byUser map[string][]connEvent
	total  int
	posts  int
}

func newEventReceiver(t *testing.T) *eventReceiver {
	r := &eventReceiver{byUser: map[string][]connEvent{}}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		if r.down.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		var p struct {
			Events []connEvent `json:"events"`
		}
		if err := json.Unmarshal(body, &p); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		r.mu.Lock()
		r.posts++
		for _, e := range p.Events {
			if e.Type == "msg" {
				continue
			}
			r.byUser[e.User] = append(r.byUser[e.User], e)
			r.total++
		}
		r.mu.Unlock()
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *eventReceiver) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.total
}

func (r *eventReceiver) of(user string) []connEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.byUser[user])
}

// waitCount waits until the receiver holds at least n events.
func (r *eventReceiver) waitCount(t *testing.T, n int, d time.Duration) {
	t.Helper()
	prototest.WaitFor(t, d, func() error {
		if got := r.count(); got < n {
			return fmt.Errorf("%d of %d events received", got, n)
		}
		return nil
	})
}

// connEventNodes starts two nodes serving testApp with a webhook to recv
// that wants every kind of event: presence grace 1s, presence and webhook
// leases 2s.
func connEventNodes(t *testing.T, recv *eventReceiver, n int) ([]*roostNode, *env) {
	t.Helper()
	redistest.Require(t)
	e := newEnv(t, redistest.Addr)
	f := filepath.Join(t.TempDir(), "apps.json")
	body := fmt.Sprintf(`{"apps":[{"id":%q,"secret":%q,"webhook":{"url":%q,"events":["msg","presence","connection"]}}]}`, testApp, apiSecret, recv.srv.URL)
	if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	nodes := startNodes(t, e, n, "--apps", f, "--presence-grace", "1s", "--presence-lease", "2s", "--webhook-lease", "2s")
	return nodes, e
}

// eventUser dials n as user and joins room (none when room is "").
func eventUser(t *testing.T, n *roostNode, user, room string) *prototest.Client {
	t.Helper()
	c := prototest.DialT(t, "ws://"+n.Addr+"/ws?user="+user+"&app="+testApp, prototest.Options{})
	if room != "" {
		if err := c.Send(`{"op":"join","room":"` + room + `"}`); err != nil {
			t.Fatal(err)
		}
		if _, _, err := c.Expect("joined", 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// wantEvents checks user's events are exactly want, in order.
func wantEvents(t *testing.T, recv *eventReceiver, user string, want ...string) {
	t.Helper()
	got := recv.of(user)
	var s []string
	for _, e := range got {
		s = append(s, e.String())
	}
	if !slices.Equal(s, want) {
		t.Fatalf("%s: events %v, want %v", user, s, want)
	}
	for i := 1; i < len(got); i++ {
		if got[i].TS < got[i-1].TS {
			t.Fatalf("%s: ts going back: %v", user, got)
		}
	}
}

// A page reload (a new connection to the same node within the grace) and
// a reconnect to the other node make no event; the user's events are
// online, joined when it comes, left and offline when it is gone for the
// grace, in that order, once each.
func TestConnEventsReloadAndMove(t *testing.T) {
	recv := newEventReceiver(t)
	nodes, _ := connEventNodes(t, recv, 2)
	a, b := nodes[0], nodes[1]
	c := eventUser(t, a, "alice", "r")
	recv.waitCount(t, 2, 10*time.Second)
	wantEvents(t, recv, "alice", "online", "joined:r")
	// Reload: the page's connection ends and the next one joins at once.
	c.Close()
	c = eventUser(t, a, "alice", "r")
	// Reconnect to the other node (its first one gone with its node).
	time.Sleep(300 * time.Millisecond)
	c.Close()
	c = eventUser(t, b, "alice", "r")
	// Well past the grace: nothing.
	time.Sleep(2500 * time.Millisecond)
	wantEvents(t, recv, "alice", "online", "joined:r")
	// Leaves the room but stays connected: left only; then gone: offline.
	if err := c.Send(`{"op":"leave","room":"r"}`); err != nil {
		t.Fatal(err)
	}
	recv.waitCount(t, 3, 10*time.Second)
	wantEvents(t, recv, "alice", "online", "joined:r", "left:r")
	c.Close()
	recv.waitCount(t, 4, 10*time.Second)
	time.Sleep(1500 * time.Millisecond) // nothing more comes
	wantEvents(t, recv, "alice", "online", "joined:r", "left:r", "offline")
}

// 1,000 users, half on each node, each join a room and leave: exactly
// their 4,000 transitions, each user's in order.
func TestConnEvents1000Users(t *testing.T) {
	recv := newEventReceiver(t)
	nodes, _ := connEventNodes(t, recv, 2)
	const users = 1000
	clients := make([]*prototest.Client, users)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 50)
	for i := range clients {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			clients[i] = eventUser(t, nodes[i%2], fmt.Sprintf("u%04d", i), fmt.Sprintf("r%d", i%10))
		}()
	}
	wg.Wait()
	recv.waitCount(t, 2*users, 30*time.Second)
	for _, c := range clients {
		c.Close()
	}
	recv.waitCount(t, 4*users, 30*time.Second)
	time.Sleep(1500 * time.Millisecond) // nothing more comes
	if n := recv.count(); n != 4*users {
		t.Fatalf("%d events, want %d", n, 4*users)
	}
	for i := 0; i < users; i++ {
		r := fmt.Sprintf("r%d", i%10)
		wantEvents(t, recv, fmt.Sprintf("u%04d", i), "online", "joined:"+r, "left:"+r, "offline")
	}
}

// A node killed with SIGKILL holding 500 users, their online and joined
// committed but not delivered (the receiver was failing): the other node
// delivers those from the store once the killed node's webhook lease ends,
// and once its presence lease ends sends each user's left and offline,
// exactly once, after them; its own user stays.
func TestConnEventsNodeKilled(t *testing.T) {
	recv := newEventReceiver(t)
	nodes, _ := connEventNodes(t, recv, 2)
	a, b := nodes[0], nodes[1]
	eventUser(t, a, "stays", "k")
	recv.waitCount(t, 2, 10*time.Second)
	recv.down.Store(true)
	const users = 500
	var wg sync.WaitGroup
	sem := make(chan struct{}, 50)
	for i := 0; i < users; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			eventUser(t, b, fmt.Sprintf("k%03d", i), "k")
		}()
	}
	wg.Wait()
	// Committed within a presence tick or two; the POSTs fail.
	time.Sleep(1500 * time.Millisecond)
	killed := time.Now()
	b.Kill()
	recv.down.Store(false)
	recv.waitCount(t, 4*users+2, 30*time.Second)
	took := time.Since(killed)
	time.Sleep(3 * time.Second) // a sweep and a lease later: nothing more comes
	if n := recv.count(); n != 4*users+2 {
		t.Fatalf("%d events, want %d", n, 4*users+2)
	}
	for i := 0; i < users; i++ {
		wantEvents(t, recv, fmt.Sprintf("k%03d", i), "online", "joined:k", "left:k", "offline")
	}
	wantEvents(t, recv, "stays", "online", "joined:k")
	t.Logf("every event of the killed node's 500 users arrived %v after SIGKILL (presence lease 2s, webhook lease 2s)", took)
}

// The receiver down for 30 s while users come and go: once it is back,
// every event arrives, each user's in order, none twice.
func TestConnEventsReceiverDown(t *testing.T) {
	if testing.Short() {
		t.Skip("takes over 30 s")
	}
	recv := newEventReceiver(t)
	nodes, _ := connEventNodes(t, recv, 2)
	recv.down.Store(true)
	const users = 100
	var cs []*prototest.Client
	for i := 0; i < users; i++ {
		cs = append(cs, eventUser(t, nodes[i%2], fmt.Sprintf("d%03d", i), "room"))
	}
	time.Sleep(2 * time.Second)
	for _, c := range cs[:users/2] {
		c.Close()
	}
	// The others stay: they speak now and then, as live clients do, or
	// the node closes them as idle while the test waits.
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		tk := time.NewTicker(5 * time.Second)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
			}
			for _, c := range cs[users/2:] {
				_ = c.Send(`{"op":"ping"}`)
			}
		}
	}()
	time.Sleep(28 * time.Second)
	if n := recv.count(); n != 0 {
		t.Fatalf("%d events while down", n)
	}
	recv.down.Store(false)
	// The backoff's bound reaches a minute: the next try may be that far.
	recv.waitCount(t, 3*users, 90*time.Second)
	time.Sleep(1500 * time.Millisecond)
	if n := recv.count(); n != 3*users {
		t.Fatalf("%d events, want %d", n, 3*users)
	}
	for i := 0; i < users; i++ {
		if i < users/2 {
			wantEvents(t, recv, fmt.Sprintf("d%03d", i), "online", "joined:room", "left:room", "offline")
		} else {
			wantEvents(t, recv, fmt.Sprintf("d%03d", i), "online", "joined:room")
		}
	}
}

// Without PostgreSQL nor Redis: one node, the events in its memory (best
// effort), the same rules: a reload makes none, each user's come in order.
func TestConnEventsMemory(t *testing.T) {
	recv := newEventReceiver(t)
	f := filepath.Join(t.TempDir(), "apps.json")
	body := fmt.Sprintf(`{"apps":[{"id":%q,"secret":%q,"webhook":{"url":%q,"events":["presence","connection"]}}]}`, testApp, apiSecret, recv.srv.URL)
	if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	n := harness.Start(t, harness.Spec{Name: "memory", Args: []string{"--insecure", "--apps", f, "--api", "off", "--loops", "1", "--presence-grace", "500ms"}})
	c := eventUser(t, n, "bob", "r")
	c.Close()
	c = eventUser(t, n, "bob", "r") // a reload
	time.Sleep(time.Second)
	c.Close()
	recv.waitCount(t, 4, 10*time.Second)
	time.Sleep(time.Second)
	wantEvents(t, recv, "bob", "online", "joined:r", "left:r", "offline")
}
