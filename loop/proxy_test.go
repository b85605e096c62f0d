package loop

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gobwas/ws/wsutil"

	"github.com/roost-chat/roost/proto"
)

// backend is an app's backend answering proxy calls, started by the test:
// answer decides from what it was sent.
type backend struct {
	srv  *httptest.Server
	mu   sync.Mutex
	seen []map[string]any
}

func newBackend(t *testing.T, answer func(req map[string]any) (status int, body string)) *backend {
	t.Helper()
	b := &backend{}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var req map[string]any
		if err := json.Unmarshal(raw, &req); err != nil || r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" {
			http.Error(w, "bad call", 400)
			return
		}
		b.mu.Lock()
		b.seen = append(b.seen, req)
		b.mu.Unlock()
		status, body := answer(req)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		io.WriteString(w, body)
	}))
	t.Cleanup(b.srv.Close)
	return b
}

func (b *backend) calls() []map[string]any {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.seen)
}

// hanging is a backend that answers nothing until the test ends.
func hanging(t *testing.T) *backend {
	release := make(chan struct{})
	b := newBackend(t, func(map[string]any) (int, string) {
		<-release
		return 200, `{"allow":true}`
	})
	t.Cleanup(func() { close(release) }) // runs before the server's Close
	return b
}

// deadURL is a URL where nothing listens.
func deadURL(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr + "/check"
}

var allow = func(map[string]any) (int, string) { return 200, `{"allow":true}` }

func proxied(id string, p proto.Proxy) proto.App {
	return proto.App{ID: id, Secret: map[string]string{"a": secretA, "b": secretB}[id], Proxy: &p}
}

func (n *node) dialApp(t *testing.T, app, user string) *client {
	t.Helper()
	sec := map[string]string{"a": secretA, "b": secretB}[app]
	return n.dialQuery(t, "token="+tok(sec, app, user, time.Now().Add(time.Hour)))
}

// expectAnswer reads until the ack or err of publish id.
func (c *client) expectAnswer(id string) map[string]any {
	c.t.Helper()
	for {
		m := c.recv()
		if m["op"] == "ack" && m["id"] == id || m["op"] == "err" && m["ref"] == id {
			return m
		}
	}
}

// The connect proxy: the backend gets the app, user and client address;
// an allowed client's first frames, sent before the answer, are held and
// answered after it; a refused one is closed with 1008 and the backend's
// message, after a completed upgrade.
func TestProxyConnectAllowDeny(t *testing.T) {
	b := newBackend(t, func(req map[string]any) (int, string) {
		time.Sleep(20 * time.Millisecond) // the client's frames arrive before the answer
		if req["user"] == "mallory" {
			return 200, `{"allow":false,"code":"forbidden","message":"banned until tomorrow"}`
		}
		return 200, `{"allow":true}`
	})
	n := secureNode(t, nil, proxied("a", proto.Proxy{Connect: b.srv.URL + "/connect"}))
	c := n.dialApp(t, "a", "alice")
	c.send(`{"op":"ping"}`)
	c.send(`{"op":"join","room":"r"}`)
	c.expect(map[string]any{"op": "pong"})
	c.expect(map[string]any{"op": "joined", "room": "r"})
	calls := b.calls()
	if len(calls) != 1 || calls[0]["type"] != "connect" || calls[0]["app"] != "a" || calls[0]["user"] != "alice" ||
		!strings.HasPrefix(calls[0]["client"].(string), "127.0.0.1:") {
		t.Fatalf("backend saw %v", calls)
	}
	m := n.dialApp(t, "a", "mallory")
	m.send(`{"op":"join","room":"r"}`) // held, then dropped with the connection
	if reason := m.expectClose(1008); reason != "banned until tomorrow" {
		t.Fatalf("close reason %q", reason)
	}
	if got := refusedOf(n.srv, "a", RefusedProxy); got != 1 {
		t.Fatalf("proxy refusals %d, want 1", got)
	}
	st := &n.srv.proxy.Stats
	if a, d := st.Calls[0][0].Load(), st.Calls[0][1].Load(); a != 1 || d != 1 {
		t.Fatalf("connect calls allowed %d denied %d, want 1 and 1", a, d)
	}
}

// The publish proxy: it sees the room, id and body; a refusal is an err
// with the backend's code and message and the publish's id, an allowed
// publish is acked and delivered.
func TestProxyPublishAllowDeny(t *testing.T) {
	b := newBackend(t, func(req map[string]any) (int, string) {
		switch body, _ := req["body"].(map[string]any); body["text"] {
		case "spam":
			return 200, `{"allow":false,"code":"too_large","message":"no spam here"}`
		case "odd":
			return 200, `{"allow":false,"code":"no-such-code"}`
		}
		return 200, `{"allow":true}`
	})
	n := secureNode(t, nil, proxied("a", proto.Proxy{Publish: b.srv.URL}))
	c := n.dialApp(t, "a", "alice")
	c.send(`{"op":"join","room":"r"}`)
	c.expect(map[string]any{"op": "joined"})
	c.send(`{"op":"pub","room":"r","id":"m1","body":{"text":"hello"}}`)
	if m := c.expectAnswer("m1"); m["op"] != "ack" {
		t.Fatalf("m1: %v", m)
	}
	c.send(`{"op":"pub","room":"r","id":"m2","body":{"text":"spam"}}`)
	if m := c.expectAnswer("m2"); m["op"] != "err" || m["code"] != "too_large" || m["message"] != "no spam here" {
		t.Fatalf("m2: %v", m)
	}
	c.send(`{"op":"pub","room":"r","id":"m3","body":{"text":"odd"}}`)
	if m := c.expectAnswer("m3"); m["op"] != "err" || m["code"] != "forbidden" || m["message"] != "refused by the app" {
		t.Fatalf("m3: %v", m)
	}
	calls := b.calls()
	if len(calls) != 3 || calls[0]["type"] != "publish" || calls[0]["room"] != "r" || calls[0]["id"] != "m1" ||
		calls[0]["user"] != "alice" || fmt.Sprint(calls[0]["body"]) != "map[text:hello]" {
		t.Fatalf("backend saw %v", calls)
	}
}

// A backend that does not answer in time, or is down, or answers
// garbage: closed (the default) refuses, open accepts.
func TestProxyFailures(t *testing.T) {
	slow := hanging(t)
	garbage := newBackend(t, func(map[string]any) (int, string) { return 200, `yes` })
	status := newBackend(t, func(map[string]any) (int, string) { return 500, `{"allow":true}` })
	for _, tc := range []struct {
		name, url string
	}{
		{"timeout", slow.srv.URL},
		{"down", deadURL(t)},
		{"garbage", garbage.srv.URL},
		{"status 500", status.srv.URL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			to := proto.Duration(150 * time.Millisecond)
			n := secureNode(t, nil, proxied("a", proto.Proxy{Publish: tc.url, Timeout: to}),
				proxied("b", proto.Proxy{Publish: tc.url, Timeout: to, FailOpen: true}))
			closed, open := n.dialApp(t, "a", "alice"), n.dialApp(t, "b", "bob")
			t0 := time.Now()
			closed.send(`{"op":"pub","room":"r","id":"m1","body":1}`)
			open.send(`{"op":"pub","room":"r","id":"m1","body":1}`)
			if m := closed.expectAnswer("m1"); m["op"] != "err" || m["code"] != "overloaded" {
				t.Fatalf("fail closed: %v", m)
			}
			if m := open.expectAnswer("m1"); m["op"] != "ack" {
				t.Fatalf("fail open: %v", m)
			}
			if d := time.Since(t0); d > 2*time.Second {
				t.Fatalf("answered after %v with a timeout of 150ms", d)
			}
		})
	}
	// A connect that fails closed is told to come back later.
	n := secureNode(t, nil, proxied("a", proto.Proxy{Connect: deadURL(t)}))
	if reason := n.dialApp(t, "a", "alice").expectClose(proto.CloseTryAgain); !strings.HasPrefix(reason, "retry=") {
		t.Fatalf("close reason %q", reason)
	}
	n = secureNode(t, nil, proxied("a", proto.Proxy{Connect: slow.srv.URL, Timeout: proto.Duration(100 * time.Millisecond), FailOpen: true}))
	c := n.dialApp(t, "a", "alice")
	c.send(`{"op":"ping"}`)
	c.expect(map[string]any{"op": "pong"})
}

// One connection's publishes keep their order whatever the backend's
// delay for each: acks in publish order, seqs ascending, and a member
// receives them in that order. A refused one is answered when its turn
// comes, like any refusal without waiting for the acks before it.
func TestProxyPublishOrder(t *testing.T) {
	b := newBackend(t, func(req map[string]any) (int, string) {
		time.Sleep(time.Duration(rand.IntN(15)) * time.Millisecond)
		if req["id"] == "m13" {
			return 200, `{"allow":false,"message":"not this one"}`
		}
		return 200, `{"allow":true}`
	})
	n := secureNode(t, nil, proxied("a", proto.Proxy{Publish: b.srv.URL}))
	pub, member := n.dialApp(t, "a", "alice"), n.dialApp(t, "a", "bob")
	member.send(`{"op":"join","room":"r"}`)
	member.expect(map[string]any{"op": "joined"})
	const count = 50 // under maxProxyQueue: all in flight at once
	for i := 0; i < count; i++ {
		pub.send(fmt.Sprintf(`{"op":"pub","room":"r","id":"m%d","body":%d}`, i, i))
	}
	var order []string
	lastSeq := uint64(0)
	for len(order) < count {
		m := pub.recv()
		switch m["op"] {
		case "ack":
			if s := num(m["seq"]); s <= lastSeq {
				t.Fatalf("ack seq %d after %d", s, lastSeq)
			} else {
				lastSeq = s
			}
			order = append(order, m["id"].(string))
		case "err":
			order = append(order, "err:"+m["ref"].(string))
		}
	}
	var want []string
	for i := 0; i < count; i++ {
		if i != 13 {
			want = append(want, fmt.Sprintf("m%d", i))
		}
	}
	i13 := slices.Index(order, "err:m13")
	if i13 < 0 || !slices.Equal(slices.Delete(slices.Clone(order), i13, i13+1), want) {
		t.Fatalf("answers %v, want the acks in order and err:m13", order)
	}
	for i := 0; i < count; i++ {
		if i == 13 {
			continue
		}
		m := member.expect(map[string]any{"op": "msg"})
		if num(m["body"]) != uint64(i) {
			t.Fatalf("member got body %v, want %d", m["body"], i)
		}
	}
}

// While app a's backend hangs, with its queue full of waiting publishes
// and connects, app b (with a proxy of its own, answering at once) is
// served as before: every publish answered well within a's timeout.
func TestProxyHungBackendCostsOnlyItsApp(t *testing.T) {
	slow := hanging(t)
	fast := newBackend(t, allow)
	n := secureNode(t, nil,
		proxied("a", proto.Proxy{Publish: slow.srv.URL, Timeout: proto.Duration(5 * time.Second)}),
		proxied("b", proto.Proxy{Connect: fast.srv.URL + "/c", Publish: fast.srv.URL}))
	c := n.dialApp(t, "b", "bob")
	// b's publishes before a's backend is loaded, then during.
	worstOf := func(from int) time.Duration {
		var worst time.Duration
		for i := from; i < from+100; i++ {
			t0 := time.Now()
			id := fmt.Sprint("m", i)
			c.send(`{"op":"pub","room":"r","id":"` + id + `","body":1}`)
			if m := c.expectAnswer(id); m["op"] != "ack" {
				t.Fatalf("b's %s: %v", id, m)
			}
			worst = max(worst, time.Since(t0))
		}
		return worst
	}
	before := worstOf(0)
	// a: 20 connections with 60 publishes each waiting on the hung
	// backend: more than its workers and its queue hold.
	var as []*client
	for i := 0; i < 20; i++ {
		c := n.dialApp(t, "a", fmt.Sprint("u", i))
		for j := 0; j < 60; j++ {
			c.send(fmt.Sprintf(`{"op":"pub","room":"r","id":"m%d","body":1}`, j))
		}
		as = append(as, c)
	}
	checkFor(t, 5*time.Second, func() bool { return n.srv.proxy.Stats.Calls[1][4].Load() > 0 }) // a's queue is full
	// b publishes steadily meanwhile.
	worst := worstOf(100)
	if worst > time.Second {
		t.Fatalf("b's slowest publish took %v while a's backend hung", worst)
	}
	t.Logf("b's slowest publish-to-ack of 100: %v before, %v while a's backend hung", before, worst)
	// a's publishes past its queue were refused at once, not held.
	if m := as[19].expectAnswer("m59"); m["op"] != "err" || m["code"] != "overloaded" {
		t.Fatalf("a's last publish: %v", m)
	}
}

// An SSE stream asks the connect proxy too, before its response: allowed,
// it opens; refused, it gets 403 with the backend's message.
func TestProxyConnectSSE(t *testing.T) {
	b := newBackend(t, func(req map[string]any) (int, string) {
		if req["user"] == "mallory" {
			return 200, `{"allow":false,"message":"banned"}`
		}
		return 200, `{"allow":true}`
	})
	n := secureNode(t, nil, proxied("a", proto.Proxy{Connect: b.srv.URL}))
	get := func(user string) (*http.Response, string) {
		cl := &http.Client{Timeout: 5 * time.Second}
		resp, err := cl.Get("http://" + n.addr + "/sse?room=r&token=" + tok(secretA, "a", user, time.Now().Add(time.Hour)))
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return resp, string(body)
		}
		buf := make([]byte, 64)
		k, _ := resp.Body.Read(buf) // the retry field
		resp.Body.Close()
		return resp, string(buf[:k])
	}
	if resp, body := get("alice"); resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" || !strings.HasPrefix(body, "retry:") {
		t.Fatalf("allowed: %d %q", resp.StatusCode, body)
	}
	if resp, body := get("mallory"); resp.StatusCode != 403 || !strings.Contains(body, "banned") {
		t.Fatalf("refused: %d %q", resp.StatusCode, body)
	}
	if calls := b.calls(); len(calls) != 2 || calls[0]["type"] != "connect" {
		t.Fatalf("backend saw %v", calls)
	}
}

// A client awaiting its connect answer may send only so much: past
// maxHeldInput it is closed with 1008, and the node reads nothing of it.
func TestProxyConnectHeldInputBounded(t *testing.T) {
	slow := hanging(t)
	n := secureNode(t, nil, proxied("a", proto.Proxy{Connect: slow.srv.URL, Timeout: proto.Duration(5 * time.Second)}))
	c := n.dialApp(t, "a", "alice")
	big := `{"op":"pub","room":"r","id":"x","body":"` + strings.Repeat("x", 8<<10) + `"}`
	go func() {
		for i := 0; i < 2*maxHeldInput/len(big)+2; i++ {
			if wsutil.WriteClientText(c.conn, []byte(big)) != nil {
				return
			}
		}
	}()
	if reason := c.expectClose(1008); reason != "too much input before the connection was accepted" {
		t.Fatalf("close reason %q", reason)
	}
}

// A registry change reaches live connections: a publish proxy set on a
// running app decides that app's next publishes, and removed, stops.
func TestProxySettingsChange(t *testing.T) {
	b := newBackend(t, func(map[string]any) (int, string) { return 200, `{"allow":false,"message":"closed for now"}` })
	n := secureNode(t, nil, proto.App{ID: "a", Secret: secretA})
	c := n.dialApp(t, "a", "alice")
	c.send(`{"op":"pub","room":"r","id":"m1","body":1}`)
	if m := c.expectAnswer("m1"); m["op"] != "ack" {
		t.Fatalf("m1: %v", m)
	}
	setApps(n.srv, []proto.App{proxied("a", proto.Proxy{Publish: b.srv.URL})})
	c.send(`{"op":"pub","room":"r","id":"m2","body":1}`)
	if m := c.expectAnswer("m2"); m["op"] != "err" || m["message"] != "closed for now" {
		t.Fatalf("m2: %v", m)
	}
	setApps(n.srv, []proto.App{{ID: "a", Secret: secretA}})
	c.send(`{"op":"pub","room":"r","id":"m3","body":1}`)
	if m := c.expectAnswer("m3"); m["op"] != "ack" {
		t.Fatalf("m3: %v", m)
	}
}

// The node signs its proxy calls with the app's secrets as the registry
// has them: a rotation set on a running node (SetApps) signs the next
// calls with both secrets, so a backend that already knows only the new
// one allows them; once the previous secret has expired, a backend that
// knows only that one rejects the calls (401), and the app failing closed
// refuses the publishes.
func TestProxyCallsSignedFollowRotation(t *testing.T) {
	const newSecret = "new-secret-of-app-a-0123456789"
	var mu sync.Mutex
	knows, sigs := []string{secretA}, []int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		ts := r.Header.Get("X-Roost-Timestamp")
		got := strings.Split(r.Header.Get("X-Roost-Signature"), ",")
		sec, err := strconv.ParseInt(ts, 10, 64)
		mu.Lock()
		defer mu.Unlock()
		sigs = append(sigs, len(got))
		ok := false
		for _, s := range knows {
			ok = ok || err == nil && time.Since(time.Unix(sec, 0)).Abs() < 5*time.Minute &&
				slices.Contains(got, proto.SignBody([]string{s}, sec, body))
		}
		if !ok {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		io.WriteString(w, `{"allow":true}`)
	}))
	t.Cleanup(srv.Close)
	a := proxied("a", proto.Proxy{Publish: srv.URL})
	n := secureNode(t, nil, a)
	c := n.dialApp(t, "a", "alice")
	pub := func(id string) map[string]any {
		c.send(`{"op":"pub","room":"r","id":"` + id + `","body":1}`)
		return c.expectAnswer(id)
	}
	lastSigs := func() int {
		mu.Lock()
		defer mu.Unlock()
		return sigs[len(sigs)-1]
	}
	if m := pub("m1"); m["op"] != "ack" || lastSigs() != 1 {
		t.Fatalf("m1 signed with the app's secret: %v, %d signatures", m, lastSigs())
	}
	a.Secret, a.PreviousSecret, a.PreviousUntil = newSecret, secretA, time.Now().Add(time.Hour)
	setApps(n.srv, []proto.App{a})
	mu.Lock()
	knows = []string{newSecret}
	mu.Unlock()
	if m := pub("m2"); m["op"] != "ack" || lastSigs() != 2 {
		t.Fatalf("m2 during the rotation: %v, %d signatures", m, lastSigs())
	}
	a.PreviousUntil = time.Now().Add(-time.Second)
	setApps(n.srv, []proto.App{a})
	if m := pub("m3"); m["op"] != "ack" || lastSigs() != 1 {
		t.Fatalf("m3 after the rotation: %v, %d signatures", m, lastSigs())
	}
	mu.Lock()
	knows = []string{secretA}
	mu.Unlock()
	if m := pub("m4"); m["op"] != "err" || m["code"] != "overloaded" {
		t.Fatalf("m4 to a backend knowing only the expired secret: %v", m)
	}
}
