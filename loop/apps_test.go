package loop

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/golang-jwt/jwt/v5"

	"github.com/roost-chat/roost/fanout/tenancy"
	"github.com/roost-chat/roost/proto"
)

// secureNode is a token-mode node whose registry holds apps.
func secureNode(t *testing.T, mutate func(*Config), apps ...proto.App) *node {
	t.Helper()
	n := startNode(t, func(c *Config) {
		c.Insecure = false
		c.Registry = true
		c.Leeway = 0
		if mutate != nil {
			mutate(c)
		}
	})
	setApps(n.srv, apps)
	return n
}

// setApps hands s a snapshot of reg, as the node hands it each reading of
// its registry.
func setApps(s *Server, reg []proto.App) {
	s.SetApps(tenancy.NewSnapshot(s.cfg.Limits, s.cfg.Apps, reg))
}

// hourly spends a bucket for the next hour in one take.
var hourly = tenancy.NewRate(1.0/3600, 1)

const secretA, secretB = "secret-of-app-a-0123456789", "secret-of-app-b-0123456789"

func tok(secret, app, sub string, exp time.Time, rooms ...string) string {
	return signToken([]byte(secret), app, sub, exp, rooms)
}

// signToken makes an HS256 token as the tests' signer.
func signToken(secret []byte, appID, sub string, exp time.Time, rooms []string) string {
	tok, err := proto.SignToken(secret, appID, sub, exp, rooms)
	if err != nil {
		panic("BUG: cannot sign a token: " + err.Error())
	}
	return tok
}

// rawToken signs any claims with any method (the cases signToken cannot make).
func rawToken(t *testing.T, m jwt.SigningMethod, key any, claims jwt.MapClaims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(m, claims).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// refusal dials with query (and an optional Authorization header) and
// returns the HTTP status line and body.
func refusal(t *testing.T, n *node, query, auth string) string {
	t.Helper()
	conn, err := net.Dial("tcp", n.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	h := ""
	if auth != "" {
		h = "Authorization: " + auth + "\r\n"
	}
	conn.Write([]byte("GET /ws?" + query + " HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n" + h + "\r\n"))
	return httpStatus(t, conn)
}

func TestTokenCases(t *testing.T) {
	n := secureNode(t, func(c *Config) { c.Leeway = 2 * time.Second },
		proto.App{ID: "a", Secret: secretA}, proto.App{ID: "b", Secret: secretB})
	hour := time.Now().Add(time.Hour)
	fracExp := float64(time.Now().Add(time.Hour).UnixMilli())/1000 + 0.25
	for _, tc := range []struct {
		name, query, auth, want string
	}{
		{"missing", "", "", "missing token"},
		{"malformed", "token=abc.def", "", "malformed token"},
		{"malformed bearer", "", "Basic abc", "must be Bearer"},
		{"wrong signature", "token=" + tok("not-the-secret-000000", "a", "u", hour), "", "signature"},
		{"another app's secret", "token=" + tok(secretB, "a", "u", hour), "", "signature"},
		{"alg none", "token=" + rawToken(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, jwt.MapClaims{"app": "a", "sub": "u", "exp": hour.Unix()}), "", "HS256"},
		{"HS512", "token=" + rawToken(t, jwt.SigningMethodHS512, []byte(secretA), jwt.MapClaims{"app": "a", "sub": "u", "exp": hour.Unix()}), "", "HS256"},
		{"expired", "token=" + tok(secretA, "a", "u", time.Now().Add(-time.Minute)), "", "expired"},
		{"expired fractional", "token=" + rawToken(t, jwt.SigningMethodHS256, []byte(secretA), jwt.MapClaims{"app": "a", "sub": "u", "exp": float64(time.Now().Add(-3*time.Second).UnixMilli()) / 1000}), "", "expired"},
		{"no exp", "token=" + rawToken(t, jwt.SigningMethodHS256, []byte(secretA), jwt.MapClaims{"app": "a", "sub": "u"}), "", "lacks app, sub or exp"},
		{"no sub", "token=" + rawToken(t, jwt.SigningMethodHS256, []byte(secretA), jwt.MapClaims{"app": "a", "exp": hour.Unix()}), "", "lacks app, sub or exp"},
		{"nbf ahead", "token=" + rawToken(t, jwt.SigningMethodHS256, []byte(secretA), jwt.MapClaims{"app": "a", "sub": "u", "exp": hour.Unix(), "nbf": time.Now().Add(time.Minute).Unix()}), "", "not valid yet"},
		{"iat ahead", "token=" + rawToken(t, jwt.SigningMethodHS256, []byte(secretA), jwt.MapClaims{"app": "a", "sub": "u", "exp": hour.Unix(), "iat": time.Now().Add(time.Minute).Unix()}), "", "issued in the future"},
		{"unknown app", "token=" + tok(secretA, "zz", "u", hour), "", "unknown app"},
		{"bad app claim", "token=" + rawToken(t, jwt.SigningMethodHS256, []byte(secretA), jwt.MapClaims{"app": "a/../b", "sub": "u", "exp": hour.Unix()}), "", "token app must match"},
		{"two tokens", "token=" + tok(secretA, "a", "u", hour), "Bearer " + tok(secretA, "a", "u", hour), "400 Bad Request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := refusal(t, n, tc.query, tc.auth); !strings.Contains(got, tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}

	// Accepted: a fractional exp, nbf and iat within the leeway, Bearer.
	for _, tc := range []struct{ name, query, auth string }{
		{"fractional exp", "token=" + rawToken(t, jwt.SigningMethodHS256, []byte(secretA), jwt.MapClaims{"app": "a", "sub": "u", "exp": fracExp}), ""},
		{"nbf and iat within leeway", "token=" + rawToken(t, jwt.SigningMethodHS256, []byte(secretA), jwt.MapClaims{"app": "a", "sub": "u", "exp": hour.Unix(), "nbf": time.Now().Add(time.Second).Unix(), "iat": time.Now().Add(time.Second).Unix()}), ""},
		{"bearer", "", "Bearer " + tok(secretA, "a", "u", hour)},
		{"bearer lower case", "", "bearer " + tok(secretB, "b", "u", hour)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			d := ws.Dialer{}
			if tc.auth != "" {
				d.Header = ws.HandshakeHeaderHTTP{"Authorization": []string{tc.auth}}
			}
			conn, _, _, err := d.Dial(ctx, "ws://"+n.addr+"/ws?"+tc.query)
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			conn.Close()
		})
	}
}

// Insecure mode checks the app of a token like any other, and makes no app
// for a token it cannot verify.
func TestInsecureTokenMakesNoApp(t *testing.T) {
	n := startNode(t, nil)
	before := appCount(n.srv)
	for i := 0; i < 20; i++ {
		body := fmt.Sprintf(`{"app":"forged-%d","sub":"u","exp":%d}`, i, time.Now().Add(time.Hour).Unix())
		forged := "eyJhbGciOiJub25lIn0." + base64.RawURLEncoding.EncodeToString([]byte(body)) + "."
		if got := refusal(t, n, "token="+forged, ""); !strings.Contains(got, "401") {
			t.Fatalf("unsigned token: %q", got)
		}
	}
	bad := rawToken(t, jwt.SigningMethodHS256, []byte("x"), jwt.MapClaims{"app": "bad app\x00", "sub": "u", "exp": time.Now().Add(time.Hour).Unix()})
	if got := refusal(t, n, "token="+bad, ""); !strings.Contains(got, "token app must match") {
		t.Fatalf("bad app id: %q", got)
	}
	if after := appCount(n.srv); after != before {
		t.Fatalf("apps %d -> %d: unverified tokens made apps", before, after)
	}
}

func appCount(s *Server) int {
	n := 0
	s.AppStats(func(string, *AppStat) { n++ })
	return n
}

// Apps made on first use stop at --insecure-max-apps, with a reason.
func TestInsecureAppCap(t *testing.T) {
	n := startNode(t, func(c *Config) { c.InsecureMaxApps = 3 })
	for _, app := range []string{"a1", "a2", "a3", "a1"} {
		n.dialQuery(t, "user=u&app="+app)
	}
	if got := refusal(t, n, "user=u&app=a4", ""); !strings.Contains(got, "403") || !strings.Contains(got, "insecure-max-apps") {
		t.Fatalf("fourth app: %q", got)
	}
	n.dialQuery(t, "user=u&app=a2") // known apps still connect
}

func TestRefresh(t *testing.T) {
	n := secureNode(t, nil, proto.App{ID: "a", Secret: secretA}, proto.App{ID: "b", Secret: secretB})
	soon := time.Now().Add(2 * time.Second)
	c := n.dialQuery(t, "token="+tok(secretA, "a", "alice", soon))
	for _, tc := range []struct{ name, token, want string }{
		{"wrong sub", tok(secretA, "a", "bob", time.Now().Add(time.Hour)), "another user"},
		{"wrong app", tok(secretB, "b", "alice", time.Now().Add(time.Hour)), "another app"},
		{"expired", tok(secretA, "a", "alice", time.Now().Add(-time.Minute)), "expired"},
		{"bad signature", tok(secretB, "a", "alice", time.Now().Add(time.Hour)), "signature"},
		{"not later", tok(secretA, "a", "alice", soon.Add(-time.Second)), "later"},
	} {
		c.send(`{"op":"auth","token":"` + tc.token + `"}`)
		got := c.expect(map[string]any{"op": "err", "code": "forbidden"})
		if !strings.Contains(got["message"].(string), tc.want) {
			t.Fatalf("%s: %v", tc.name, got)
		}
	}
	c.send(`{"op":"auth"}`)
	c.expect(map[string]any{"op": "err", "code": "bad_request"})

	// The old expiry stood through the refusals: this connection closes.
	if reason := c.expectClose(1008); reason != "token expired" {
		t.Fatalf("reason %q", reason)
	}

	// A good refresh moves the expiry.
	c2 := n.dialQuery(t, "token="+tok(secretA, "a", "alice", time.Now().Add(2*time.Second)))
	later := time.Now().Add(time.Hour).Truncate(time.Second)
	c2.send(`{"op":"auth","token":"` + tok(secretA, "a", "alice", later) + `"}`)
	c2.expect(map[string]any{"op": "authed", "exp": float64(later.Unix())})
	time.Sleep(3 * time.Second) // past the first token's expiry (the sweep runs each second)
	c2.send(`{"op":"ping"}`)
	c2.expect(map[string]any{"op": "pong"})
}

func TestRotation(t *testing.T) {
	const newSecret = "the-new-secret-of-a-000000"
	n := secureNode(t, nil, proto.App{ID: "a", Secret: secretA})
	hour := time.Now().Add(time.Hour)
	n.dialQuery(t, "token="+tok(secretA, "a", "u", hour))

	setApps(n.srv, []proto.App{{ID: "a", Secret: newSecret, PreviousSecret: secretA, PreviousUntil: time.Now().Add(time.Hour)}})
	n.dialQuery(t, "token="+tok(secretA, "a", "u", hour))
	n.dialQuery(t, "token="+tok(newSecret, "a", "u", hour))

	setApps(n.srv, []proto.App{{ID: "a", Secret: newSecret, PreviousSecret: secretA, PreviousUntil: time.Now().Add(-time.Second)}})
	if got := refusal(t, n, "token="+tok(secretA, "a", "u", hour), ""); !strings.Contains(got, "signature") {
		t.Fatalf("previous secret after its end: %q", got)
	}
	n.dialQuery(t, "token="+tok(newSecret, "a", "u", hour))
}

func TestDisable(t *testing.T) {
	n := secureNode(t, nil, proto.App{ID: "a", Secret: secretA}, proto.App{ID: "b", Secret: secretB})
	hour := time.Now().Add(time.Hour)
	ca := n.dialQuery(t, "token="+tok(secretA, "a", "u", hour))
	cb := n.dialQuery(t, "token="+tok(secretB, "b", "u", hour))
	setApps(n.srv, []proto.App{{ID: "a", Secret: secretA, Disabled: true}, {ID: "b", Secret: secretB}})
	if reason := ca.expectClose(1008); reason != "app disabled" {
		t.Fatalf("reason %q", reason)
	}
	if got := refusal(t, n, "token="+tok(secretA, "a", "u", hour), ""); !strings.Contains(got, "403") || !strings.Contains(got, "app disabled") {
		t.Fatalf("new connection of a disabled app: %q", got)
	}
	cb.send(`{"op":"ping"}`)
	cb.expect(map[string]any{"op": "pong"})

	setApps(n.srv, []proto.App{{ID: "a", Secret: secretA}, {ID: "b", Secret: secretB}})
	n.dialQuery(t, "token="+tok(secretA, "a", "u", hour))
}

// The same room name in two apps is two rooms.
func TestAppsAreSeparateRooms(t *testing.T) {
	n := secureNode(t, nil, proto.App{ID: "a", Secret: secretA}, proto.App{ID: "b", Secret: secretB})
	hour := time.Now().Add(time.Hour)
	ca := n.dialQuery(t, "token="+tok(secretA, "a", "u", hour))
	cb := n.dialQuery(t, "token="+tok(secretB, "b", "u", hour))
	for _, c := range []*client{ca, cb} {
		c.send(`{"op":"join","room":"lobby"}`)
		c.expect(map[string]any{"op": "joined", "seq": 0})
	}
	ca.send(`{"op":"pub","room":"lobby","id":"1","body":"for a"}`)
	ca.expect(map[string]any{"op": "msg", "body": "for a"})
	ca.expect(map[string]any{"op": "ack", "seq": 1})
	cb.send(`{"op":"pub","room":"lobby","id":"1","body":"for b"}`)
	cb.expect(map[string]any{"op": "msg", "body": "for b", "seq": 1}) // b's own seq 1, not a's message
	cb.expect(map[string]any{"op": "ack", "seq": 1})
}

func i64(v int64) *int64                  { return &v }
func f64(v float64) *float64              { return &v }
func limited(l proto.AppLimits) proto.App { return proto.App{ID: "a", Secret: secretA, Limits: l} }

// The (N+1)th connection of an app completes the upgrade and is closed at
// once with 1008 "connection limit"; a freed slot admits again.
func TestAppConnLimit(t *testing.T) {
	n := secureNode(t, nil, limited(proto.AppLimits{MaxConns: i64(3)}))
	hour := time.Now().Add(time.Hour)
	var cs []*client
	for i := 0; i < 3; i++ {
		cs = append(cs, n.dialQuery(t, "token="+tok(secretA, "a", fmt.Sprint("u", i), hour)))
	}
	over := n.dialQuery(t, "token="+tok(secretA, "a", "u9", hour))
	if reason := over.expectClose(1008); reason != "connection limit" {
		t.Fatalf("reason %q", reason)
	}
	cs[0].conn.Close()
	checkFor(t, 5*time.Second, func() bool { return appConns(n.srv, "a") == 2 })
	ok := n.dialQuery(t, "token="+tok(secretA, "a", "u9", hour))
	ok.send(`{"op":"ping"}`)
	ok.expect(map[string]any{"op": "pong"})
	if got := refusedOf(n.srv, "a", RefusedConnLimit); got != 1 {
		t.Fatalf("conn_limit refusals %d, want 1", got)
	}
}

func TestUserConnLimit(t *testing.T) {
	n := secureNode(t, nil, limited(proto.AppLimits{MaxUserConns: i64(2)}))
	hour := time.Now().Add(time.Hour)
	n.dialQuery(t, "token="+tok(secretA, "a", "alice", hour))
	n.dialQuery(t, "token="+tok(secretA, "a", "alice", hour))
	if reason := n.dialQuery(t, "token="+tok(secretA, "a", "alice", hour)).expectClose(1008); reason != "connection limit" {
		t.Fatalf("reason %q", reason)
	}
	bob := n.dialQuery(t, "token="+tok(secretA, "a", "bob", hour))
	bob.send(`{"op":"ping"}`)
	bob.expect(map[string]any{"op": "pong"})
	if got := refusedOf(n.srv, "a", RefusedUserConnLimit); got != 1 {
		t.Fatalf("user_conn_limit refusals %d, want 1", got)
	}
}

func appConns(s *Server, id string) int64 {
	var n int64
	s.AppStats(func(app string, st *AppStat) {
		if app == id {
			n = st.Conns
		}
	})
	return n
}

func refusedOf(s *Server, id string, reason int) uint64 {
	var n uint64
	s.AppStats(func(app string, st *AppStat) {
		if app == id {
			n = st.Refused[reason]
		}
	})
	return n
}

// pubs publishes count messages and returns their answers in publish
// order (a refusal is answered at once, an ack after the commit).
func pubs(c *client, from, count int) []map[string]any {
	for i := from; i < from+count; i++ {
		c.send(fmt.Sprintf(`{"op":"pub","room":"r","id":"m%d","body":1}`, i))
	}
	out := make([]map[string]any, count)
	for got := 0; got < count; {
		m := c.recv()
		ref, _ := m["id"].(string)
		if m["op"] == "err" {
			ref, _ = m["ref"].(string)
		} else if m["op"] != "ack" {
			continue
		}
		var i int
		fmt.Sscanf(ref, "m%d", &i)
		out[i-from] = m
		got++
	}
	return out
}

// A user's burst is exact: burst publishes at once are acked, the next is
// rate_limited with retry_after, and after that wait one more goes through.
func TestUserPublishBurst(t *testing.T) {
	n := secureNode(t, nil, limited(proto.AppLimits{PubRate: f64(2), PubBurst: i64(5), AppPubRate: f64(0)}))
	c := n.dialQuery(t, "token="+tok(secretA, "a", "alice", time.Now().Add(time.Hour)))
	got := pubs(c, 0, 6)
	for i, m := range got[:5] {
		if m["op"] != "ack" {
			t.Fatalf("publish %d of the burst: %v", i, m)
		}
	}
	last := got[5]
	if last["op"] != "err" || last["code"] != "rate_limited" || last["ref"] != "m5" {
		t.Fatalf("publish after the burst: %v", last)
	}
	ra, _ := last["retry_after"].(float64)
	if ra < 1 || ra > 500 {
		t.Fatalf("retry_after %v ms, want 1..500 at 2/s", last["retry_after"])
	}
	time.Sleep(time.Duration(ra) * time.Millisecond)
	if m := pubs(c, 6, 1)[0]; m["op"] != "ack" {
		t.Fatalf("after retry_after: %v", m)
	}
	// Another connection of the same user shares the bucket: spent.
	c2 := n.dialQuery(t, "token="+tok(secretA, "a", "alice", time.Now().Add(time.Hour)))
	if m := pubs(c2, 7, 1)[0]; m["code"] != "rate_limited" {
		t.Fatalf("same user, other connection: %v", m)
	}
	// Another user has their own.
	bob := n.dialQuery(t, "token="+tok(secretA, "a", "bob", time.Now().Add(time.Hour)))
	if m := pubs(bob, 8, 1)[0]; m["op"] != "ack" {
		t.Fatalf("other user: %v", m)
	}
	if got := refusedOf(n.srv, "a", RefusedUserRate); got != 2 {
		t.Fatalf("user_rate refusals %d, want 2", got)
	}
}

func TestAppPublishRate(t *testing.T) {
	n := secureNode(t, nil, limited(proto.AppLimits{PubRate: f64(0), AppPubRate: f64(4)}))
	hour := time.Now().Add(time.Hour)
	a := n.dialQuery(t, "token="+tok(secretA, "a", "alice", hour))
	b := n.dialQuery(t, "token="+tok(secretA, "a", "bob", hour))
	acked := 0
	for _, m := range append(pubs(a, 0, 2), pubs(b, 2, 2)...) {
		if m["op"] == "ack" {
			acked++
		}
	}
	if acked != 4 {
		t.Fatalf("%d of the app's burst of 4 acked", acked)
	}
	if m := pubs(b, 4, 1)[0]; m["code"] != "rate_limited" || m["retry_after"] == nil {
		t.Fatalf("fifth publish of the app: %v", m)
	}
	if got := refusedOf(n.srv, "a", RefusedAppRate); got != 1 {
		t.Fatalf("app_rate refusals %d", got)
	}
}

func TestMessageSizeAndRoomLimits(t *testing.T) {
	n := secureNode(t, nil, limited(proto.AppLimits{MaxMsg: i64(10), MaxRooms: i64(2)}))
	c := n.dialQuery(t, "token="+tok(secretA, "a", "alice", time.Now().Add(time.Hour)))
	c.send(`{"op":"pub","room":"r","id":"fits","body":"12345678"}`) // 10 bytes with quotes
	c.expect(map[string]any{"op": "ack", "id": "fits"})
	c.send(`{"op":"pub","room":"r","id":"big","body":"123456789"}`)
	c.expect(map[string]any{"op": "err", "code": "too_large", "ref": "big"})
	c.send(`{"op":"join","room":"r1"}`)
	c.expect(map[string]any{"op": "joined"})
	c.send(`{"op":"join","room":"r2"}`)
	c.expect(map[string]any{"op": "joined"})
	c.send(`{"op":"join","room":"r3"}`)
	c.expect(map[string]any{"op": "err", "code": "forbidden", "ref": "r3"})
	if refusedOf(n.srv, "a", RefusedTooLarge) != 1 || refusedOf(n.srv, "a", RefusedRoomLimit) != 1 {
		t.Fatal("refusals not counted")
	}
}

// An app's max_presence (roost app set --max-presence) bounds the
// presence subscribers of each of its rooms on the node; the refusal says
// why, the same join without presence is accepted, and it is counted.
func TestAppPresenceLimit(t *testing.T) {
	n := secureNode(t, nil, limited(proto.AppLimits{MaxPresence: i64(1)}), proto.App{ID: "b", Secret: secretB})
	a1 := n.dialQuery(t, "token="+tok(secretA, "a", "alice", time.Now().Add(time.Hour)))
	a1.send(`{"op":"join","room":"r","presence":true}`)
	a1.expect(map[string]any{"op": "joined", "room": "r"})
	a2 := n.dialQuery(t, "token="+tok(secretA, "a", "bob", time.Now().Add(time.Hour)))
	a2.send(`{"op":"join","room":"r","presence":true}`)
	a2.expect(map[string]any{"op": "err", "code": "forbidden", "ref": "r",
		"message": "presence subscriber limit of this room reached: join without presence"})
	a2.send(`{"op":"join","room":"r"}`)
	a2.expect(map[string]any{"op": "joined", "room": "r"})
	// Another app's room of the same name has the node's default.
	b := n.dialQuery(t, "token="+tok(secretB, "b", "carol", time.Now().Add(time.Hour)))
	b.send(`{"op":"join","room":"r","presence":true}`)
	b.expect(map[string]any{"op": "joined", "room": "r"})
	if got := refusedOf(n.srv, "a", RefusedPresenceLimit); got != 1 {
		t.Fatalf("presence_limit refusals %d", got)
	}
	// The subscriber's leave frees its place. Its diffs (alice, bob) may
	// come first: the steps above outlast a presence tick on a busy machine.
	a1.send(`{"op":"leave","room":"r"}`)
	for m := a1.recv(); m["op"] != "left"; m = a1.recv() {
		if m["op"] != "presence_diff" {
			t.Fatalf("want left, got %v", m)
		}
	}
	checkFor(t, 5*time.Second, func() bool {
		a2.send(`{"op":"leave","room":"r"}`)
		a2.expect(map[string]any{"op": "left"})
		a2.send(`{"op":"join","room":"r","presence":true}`)
		return a2.recv()["op"] == "joined"
	})
}

// The publish limit check is allocation-free: the allowed path, and the
// bucket of a refusal.
func TestAdmitPubAllocationFree(t *testing.T) {
	p := &app{id: "a", users: map[string]*appUser{}}
	p.cfg.Store(resolve(tenancy.DefaultLimits(), 256, &proto.App{ID: "a", Limits: proto.AppLimits{PubRate: f64(1e9), PubBurst: i64(1 << 40), AppPubRate: f64(1e9)}}))
	c := &conn{app: p, au: &appUser{}} // the allowed path touches no loop state
	cmd := &proto.Command{Op: proto.OpPub, Room: []byte("r"), ID: []byte("1"), Body: []byte("1")}
	if n := leastAllocs(1000, func() {
		if !c.admitPub(cmd) {
			t.Fatal("refused")
		}
	}); n != 0 {
		t.Fatalf("admitPub allocates %.1f", n)
	}
	spent := tenancy.NewRate(1, 1)
	p.pub.Take(0, spent)
	if n := leastAllocs(1000, func() { p.pub.Take(0, spent) }); n != 0 {
		t.Fatalf("a refused take allocates %.1f", n)
	}
}

// A client flooding past its limits costs the loop no allocation: reading
// a batch of publishes refused as rate_limited and too_large, and joins
// past the room limit, answering each and writing the answers, through the
// real OnTraffic path.
func TestRefusalsAllocationFree(t *testing.T) {
	s, el := fuzzNode(t)
	gc, _ := upgradedMemConn(t, s, el)
	c, _ := gc.ctx.(*conn)
	if c == nil || gc.closed {
		t.Fatalf("upgrade failed: %q", gc.out)
	}
	c.app.cfg.Store(resolve(tenancy.Limits{PubRate: 1, PubBurst: 1, MaxMsg: 8}, 1, &proto.App{ID: c.app.id}))
	// The user's bucket is spent for the next hour: every publish is refused.
	c.au.pub.Take(tenancy.Now(), hourly)
	var batch []byte
	for i := 0; i < 8; i++ {
		batch = append(batch, clientFrame(ws.OpText, true, []byte(`{"op":"pub","room":"r0","id":"m-1","body":1}`))...)
		batch = append(batch, clientFrame(ws.OpText, true, []byte(`{"op":"pub","room":"r0","id":"big","body":"0123456789"}`))...)
		batch = append(batch, clientFrame(ws.OpText, true, []byte(`{"op":"join","room":"r1"}`))...)
	}
	in := make([]byte, 0, len(batch))
	gc.out = make([]byte, 0, 1<<20)
	read := func() {
		gc.in = append(in[:0], batch...)
		gc.out = gc.out[:0]
		s.OnTraffic(gc)
	}
	// The connection's one room.
	gc.in = append(gc.in, clientFrame(ws.OpText, true, []byte(`{"op":"join","room":"r0"}`))...)
	s.OnTraffic(gc)
	read()
	for _, want := range []string{`"code":"rate_limited"`, `"code":"too_large"`, `"code":"forbidden"`} {
		if n := bytes.Count(gc.out, []byte(want)); n != 8 {
			t.Fatalf("%d answers with %s in one read, want 8:\n%s", n, want, gc.out)
		}
	}
	if n := leastAllocs(200, read); n != 0 {
		t.Fatalf("refusing a flood allocates %.1f per read of %d frames", n, 3*8)
	}
	if gc.closed {
		t.Fatal("the flooding client was closed")
	}
}

// An app's max_rooms only lowers the node's --max-rooms: 0 (off) or a
// higher value leaves the node's ceiling, and SSE, which names its rooms
// up front, is refused past it with the number like WebSocket joins.
func TestAppMaxRoomsBelowTheNodes(t *testing.T) {
	n := secureNode(t, func(c *Config) { c.MaxRooms = 2 },
		proto.App{ID: "a", Secret: secretA, Limits: proto.AppLimits{MaxRooms: i64(0)}},
		proto.App{ID: "b", Secret: secretB, Limits: proto.AppLimits{MaxRooms: i64(5)}})
	hour := time.Now().Add(time.Hour)
	for _, tc := range []struct{ app, secret string }{{"a", secretA}, {"b", secretB}} {
		token := tok(tc.secret, tc.app, "u", hour)
		c := n.dialQuery(t, "token="+token)
		c.send(`{"op":"join","room":"r1"}`)
		c.expect(map[string]any{"op": "joined", "room": "r1"})
		c.send(`{"op":"join","room":"r2"}`)
		c.expect(map[string]any{"op": "joined", "room": "r2"})
		c.send(`{"op":"join","room":"r3"}`)
		c.expect(map[string]any{"op": "err", "code": "forbidden", "ref": "r3"})
		s := n.sse(t, "room=r1&room=r2&room=r3&token="+token)
		if s.status != 400 || !strings.Contains(s.header.Get("X-Body"), "at most 2 per connection") {
			t.Fatalf("app %s: SSE with 3 rooms past the node's 2: %d %q", tc.app, s.status, s.header.Get("X-Body"))
		}
	}
}

// Disabling an app ends its SSE streams too, not only its WebSocket
// connections.
func TestDisableEndsSSE(t *testing.T) {
	n := secureNode(t, nil, proto.App{ID: "a", Secret: secretA}, proto.App{ID: "b", Secret: secretB})
	hour := time.Now().Add(time.Hour)
	sa := n.sse(t, "room=r&token="+tok(secretA, "a", "u", hour))
	sb := n.sse(t, "room=r&token="+tok(secretB, "b", "u", hour))
	if sa.status != 200 || sb.status != 200 {
		t.Fatalf("streams: %d %d", sa.status, sb.status)
	}
	sa.expect("joined")
	sb.expect("joined")
	setApps(n.srv, []proto.App{{ID: "a", Secret: secretA, Disabled: true}, {ID: "b", Secret: secretB}})
	sa.expectEnd()
	if got := refusedOf(n.srv, "a", RefusedDisabled); got != 1 {
		t.Fatalf("disabled refusals %d, want 1 (the closed stream)", got)
	}
	if _, err := sb.next(500 * time.Millisecond); err == io.EOF {
		t.Fatal("the other app's stream ended")
	}
}

// A user whose last connection ends with its bucket spent is remembered
// until the bucket refills, and the prune visits such users only: one
// with a connection, or back before the prune, is never dropped.
func TestPruneUsersSpentOnly(t *testing.T) {
	a := &apps{byID: map[string]*app{}}
	p := &app{id: "a", users: map[string]*appUser{}}
	a.byID["a"] = p
	cfg := resolve(tenancy.DefaultLimits(), 256, &proto.App{ID: "a"})
	admit := func(user string) *appUser {
		u, why := p.admit(cfg, user)
		if why != "" {
			t.Fatal(why)
		}
		return u
	}
	now := tenancy.Now()
	idle := admit("idle") // stays connected
	idle.pub.Take(now, hourly)
	full := admit("full")
	p.release("full", full) // bucket full: forgotten at once
	gone := admit("gone")
	gone.pub.Take(now, tenancy.NewRate(20, 1)) // full again in 50 ms
	p.release("gone", gone)
	back := admit("back")
	back.pub.Take(now, hourly)
	p.release("back", back)
	admit("back") // reconnected with its spent bucket
	if _, ok := p.users["full"]; ok || len(p.spent) != 2 {
		t.Fatalf("users %v, spent %v", p.users, p.spent)
	}
	a.pruneUsers()
	if len(p.users) != 3 || len(p.spent) != 1 || p.spent[0] != "gone" {
		t.Fatalf("before the refill: users %v, spent %v", p.users, p.spent)
	}
	time.Sleep(60 * time.Millisecond)
	a.pruneUsers()
	if _, ok := p.users["gone"]; ok || len(p.users) != 2 || len(p.spent) != 0 {
		t.Fatalf("after the refill: users %v, spent %v", p.users, p.spent)
	}
}
