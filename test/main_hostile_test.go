package test

// Tests of the real binary under hostile input and bad luck: descriptor
// exhaustion, a second instance on the port, bad identities, a memory
// store filled by one connection. Each checks that bystanders keep their
// connection and their latency, that no acked message is lost, and that
// the node stays ready or exits non-zero: never a green zombie.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/roost-chat/roost/persist/pgtest"
	"github.com/roost-chat/roost/proto"
	"github.com/roost-chat/roost/pubsub/redistest"
	"github.com/roost-chat/roost/test/harness"
)

func pgtestDB(t *testing.T) string { return pgtest.NewDB(t) }

func signToken(secret, app, sub string) string {
	tok, err := proto.SignToken([]byte(secret), app, sub, time.Now().Add(time.Hour), nil)
	if err != nil {
		panic("BUG: cannot sign a token: " + err.Error())
	}
	return tok
}

// plainNode starts `roost serve` on the memory store and the in-process
// broker, with the open-file limit set to nofile (0: inherited) by the
// shell that execs it. It waits until /readyz answers unless noWait.
func plainNode(t testing.TB, nofile int, noWait bool, extra ...string) *roostNode {
	t.Helper()
	return startPlain(t, harness.Spec{NoFile: nofile, NoWait: noWait, Args: extra}, false)
}

// startPlain starts the node s on the memory store and the in-process
// broker, in insecure mode unless token; s.Args come after the plain
// flags, so they win.
func startPlain(t testing.TB, s harness.Spec, token bool) *roostNode {
	t.Helper()
	args := []string{"--api", "off", "--loops", "1", "--drain", "200ms", "--flush", "1ms"}
	if !token {
		args = append([]string{"--insecure"}, args...)
	}
	s.Args = append(args, s.Args...)
	return harness.Start(t, s)
}

// dialFrom is dialOps from a chosen source address.
func dialFrom(t testing.TB, src, addr, query string) (*opsClient, error) {
	return dialOpsWith(t, addr, query, func(ctx context.Context, network, a string) (net.Conn, error) {
		nd := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		return nd.DialContext(ctx, network, a)
	})
}

// bystanders is a publisher and two members of one room, who must keep
// their connections and their latency whatever else happens.
type bystanders struct {
	t        *testing.T
	pub      *opsClient
	members  []*opsClient
	room     string
	next     int
	acked    []uint64
	baseline time.Duration
}

func newBystanders(t *testing.T, src, addr string) *bystanders {
	t.Helper()
	b := &bystanders{t: t, room: "bystanders"}
	for i := 0; i < 3; i++ {
		c, err := dialFrom(t, src, addr, fmt.Sprintf("user=by%d&app=demo", i))
		if err != nil {
			t.Fatalf("bystander %d: %v", i, err)
		}
		if i == 0 {
			b.pub = c
			continue
		}
		if err := c.send(`{"op":"join","room":"` + b.room + `"}`); err != nil {
			t.Fatal(err)
		}
		c.expect("joined")
		b.members = append(b.members, c)
	}
	var worst time.Duration
	for i := 0; i < 5; i++ {
		worst = max(worst, b.roundTrip())
	}
	b.baseline = worst
	return b
}

// roundTrip publishes one message and waits for its ack and for its msg
// at every member; it returns the slowest of those.
func (b *bystanders) roundTrip() time.Duration {
	b.t.Helper()
	b.next++
	id := "m-" + strconv.Itoa(b.next)
	t0 := time.Now()
	if err := b.pub.send(`{"op":"pub","room":"` + b.room + `","id":"` + id + `","body":{"n":` + strconv.Itoa(b.next) + `}}`); err != nil {
		b.t.Fatalf("bystander publish: %v", err)
	}
	ack := b.pub.expect("ack")
	if ack.json["id"] != id {
		b.t.Fatalf("ack for %v, want %s", ack.json["id"], id)
	}
	seq := uint64(ack.json["seq"].(float64))
	b.acked = append(b.acked, seq)
	for _, m := range b.members {
		f := m.expect("msg")
		if uint64(f.json["seq"].(float64)) != seq {
			b.t.Fatalf("member got seq %v, want %d", f.json["seq"], seq)
		}
	}
	return time.Since(t0)
}

// check: still connected, every acked message in history, latency within
// bound of the baseline.
func (b *bystanders) check(what string, bound time.Duration) {
	b.t.Helper()
	var worst time.Duration
	for i := 0; i < 5; i++ {
		worst = max(worst, b.roundTrip())
	}
	if worst > bound {
		b.t.Errorf("%s: bystander round trip %s, baseline %s (bound %s)", what, worst, b.baseline, bound)
	}
	if err := b.pub.send(`{"op":"history","room":"` + b.room + `","limit":1000}`); err != nil {
		b.t.Fatal(err)
	}
	h := b.pub.expect("history")
	var got []uint64
	for _, m := range h.json["messages"].([]any) {
		got = append(got, uint64(m.(map[string]any)["seq"].(float64)))
	}
	if fmt.Sprint(got) != fmt.Sprint(b.acked) {
		b.t.Errorf("%s: history holds %v, acked %v", what, got, b.acked)
	}
}

// idleConns opens n TCP connections to addr from src that send nothing
// and returns them with how many the node closed at once.
func idleConns(t *testing.T, src, addr string, n int) (conns []net.Conn, refused int) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	for i := 0; i < n; i++ {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("attacker connection %d: %v", i, err)
		}
		conns = append(conns, c)
	}
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	// A refused connection is closed by the node right after accept: its
	// read ends at once. An admitted one stays silent.
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
			var b [1]byte
			_, err := c.Read(b[:])
			var ne net.Error
			if !(errors.As(err, &ne) && ne.Timeout()) {
				mu.Lock()
				refused++
				mu.Unlock()
			}
			_ = c.SetReadDeadline(time.Time{})
		}()
	}
	wg.Wait()
	return conns, refused
}

// Case 1: with the open-file limit at 1,100, 1,150 idle connections no
// longer take the listener down: past the budget they are closed at once
// and counted, bystanders keep their connection and latency, the node
// stays ready, new clients get in once the attacker leaves, and SIGTERM
// drains and exits 0.
func TestDescriptorExhaustionUnderUlimit(t *testing.T) {
	n := plainNode(t, 1100, false, "--upgrade-timeout", "60s")
	by := newBystanders(t, "127.0.0.2", n.Addr)
	budget := int(n.Metrics(t)["roost_connection_budget"])
	if budget <= 0 || budget >= 1100 {
		t.Fatalf("connection budget %d, want between 0 and the limit 1100", budget)
	}
	conns, refused := idleConns(t, "127.0.0.1", n.Addr, 1150)
	if want := 1150 + 3 - budget; refused < want-2 || refused > want+2 {
		t.Errorf("%d of 1150 idle connections refused, want about %d (budget %d, 3 bystanders)", refused, want, budget)
	}
	if code := n.Readyz(); code != http.StatusOK {
		t.Fatalf("/readyz %d under the attack, want 200\n%s", code, n.LogTail(20))
	}
	by.check("under 1150 idle connections", max(10*by.baseline, 250*time.Millisecond))
	m := n.Metrics(t)
	if got := m[`roost_connections_refused_total{reason="budget"}`]; int(got) < refused {
		t.Errorf("roost_connections_refused_total{reason=\"budget\"} = %v, want at least %d", got, refused)
	}
	// A newcomer while the budget is full is closed at once, not queued.
	if _, err := dialFrom(t, "127.0.0.3", n.Addr, "user=late&app=demo"); err == nil {
		t.Errorf("a client got in past a full budget")
	}
	for _, c := range conns {
		c.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := dialFrom(t, "127.0.0.3", n.Addr, "user=late&app=demo")
		if err == nil {
			c.conn.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new client admitted after the attacker left: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	by.check("after the attack", max(10*by.baseline, 250*time.Millisecond))
	_ = n.Cmd.Process.Signal(syscall.SIGTERM)
	if code := n.ExitCode(t, 10*time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM, want 0\n%s", code, n.LogTail(20))
	}
}

// The per-address cap: one address cannot take the budget, others connect.
func TestPerAddressConnectionCap(t *testing.T) {
	n := plainNode(t, 0, false, "--upgrade-timeout", "60s", "--max-conns-per-ip", "40")
	by := newBystanders(t, "127.0.0.2", n.Addr)
	_, refused := idleConns(t, "127.0.0.1", n.Addr, 100)
	if refused != 60 {
		t.Errorf("%d of 100 connections of one address refused, want 60 (cap 40)", refused)
	}
	if got := n.Metrics(t)[`roost_connections_refused_total{reason="per_ip"}`]; got != 60 {
		t.Errorf("roost_connections_refused_total{reason=\"per_ip\"} = %v, want 60", got)
	}
	c, err := dialFrom(t, "127.0.0.3", n.Addr, "user=other&app=demo")
	if err != nil {
		t.Fatalf("a client of another address was refused: %v", err)
	}
	c.conn.Close()
	by.check("with one address at its cap", max(10*by.baseline, 250*time.Millisecond))
}

// When the listener dies anyway (here: a --max-conns above what the
// open-file limit allows), the node says why and exits non-zero instead of
// answering /healthz with its loops gone.
func TestListenerDeathExitsNonZero(t *testing.T) {
	n := plainNode(t, 256, false, "--upgrade-timeout", "60s", "--max-conns", "5000")
	conns := make([]net.Conn, 0, 300)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	d := net.Dialer{Timeout: time.Second}
	for i := 0; i < 300; i++ {
		c, err := d.Dial("tcp", n.Addr)
		if err != nil {
			break // the listener is gone
		}
		conns = append(conns, c)
	}
	code := n.ExitCode(t, 15*time.Second)
	if code == 0 {
		t.Fatalf("node exited 0 after its listener died")
	}
	log := n.LogTail(40)
	if !strings.Contains(log, "client listener stopped") || !strings.Contains(log, "too many open files") {
		t.Errorf("log does not say why the node exits:\n%s", log)
	}
}

// Case 5: a second node on the same port fails with "address already in
// use"; with --reuse-port on both, sharing is the operator's choice.
func TestSecondInstanceOnPortRefused(t *testing.T) {
	a := plainNode(t, 0, false)
	b := startPlain(t, harness.Spec{Name: "second", Addr: a.Addr, NoWait: true}, false)
	if code := b.ExitCode(t, 15*time.Second); code == 0 {
		t.Fatalf("second node on %s exited 0", a.Addr)
	}
	if log := b.LogTail(10); !strings.Contains(log, "address already in use") {
		t.Errorf("second node's log does not say the address is in use:\n%s", log)
	}
	if code := a.Readyz(); code != http.StatusOK {
		t.Errorf("first node /readyz %d after the second one failed", code)
	}

	// Two nodes started at the same instant: never both serving.
	for round := 0; round < 3; round++ {
		p := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t, false))
		pair := make([]*roostNode, 2)
		var wg sync.WaitGroup
		for i := range pair {
			wg.Add(1)
			go func() {
				defer wg.Done()
				pair[i] = startPlain(t, harness.Spec{Name: fmt.Sprintf("race%d-%d", round, i), Addr: p, NoWait: true}, false)
			}()
		}
		wg.Wait()
		time.Sleep(1500 * time.Millisecond)
		serving := 0
		for _, n := range pair {
			if n.Alive() && n.Readyz() == http.StatusOK {
				serving++
			} else if n.Alive() {
				t.Errorf("%s neither serving nor exited", n.Name)
			} else if l := n.LogTail(10); !strings.Contains(l, "address already in use") {
				t.Errorf("%s exited without saying the address is in use:\n%s", n.Name, l)
			} else if strings.Contains(l, "listens on port") {
				t.Logf("%s found the other's listener after binding", n.Name)
			}
		}
		if serving > 1 {
			t.Fatalf("round %d: two nodes serve port %s", round, p)
		}
		for _, n := range pair {
			n.Stop()
		}
	}

	// The same port on another address is another listener: both serve.
	// An address no test dials from: the bystanders and the bench's
	// clients dial from 127.0.0.2 in tests running beside this one, and
	// a client socket's ephemeral port there once was a's port, so that
	// this listener's bind failed (CI, 2026-12-07).
	startPlain(t, harness.Spec{Name: "other-address", Addr: strings.Replace(a.Addr, "127.0.0.1", "127.0.44.2", 1)}, false)

	// Sharing on purpose: both with --reuse-port start.
	p := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t, false))
	for i := 0; i < 2; i++ {
		startPlain(t, harness.Spec{Name: fmt.Sprintf("shared%d", i), Addr: p, Args: []string{"--reuse-port"}}, false)
	}
}

// upgradeStatus sends a WebSocket upgrade for path and returns the HTTP
// status and body of the answer.
func upgradeStatus(t *testing.T, addr, path string, header http.Header) (int, string) {
	t.Helper()
	req, err := http.NewRequest("GET", "http://"+addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Case 2: a user id the database cannot store (a NUL, invalid UTF-8, a
// control character) is refused where it enters, with the reason, and the
// publishes of everybody else, committed in the same group commits, are
// all acknowledged and stored. With PostgreSQL, as in the report (283 of
// 300 lost to one `?user=ev%00il`).
func TestBadUserIDsRefusedAtTheDoor(t *testing.T) {
	db := pgtestDB(t)
	secret := "s3cret"
	n := plainNode(t, 0, false, "--database-url", db, "--migrate", "--app-secret", "ct="+secret, "--batch-window", "5ms")
	tok := func(sub string) string { return signToken(secret, "ct", sub) }
	by := make([]*opsClient, 3)
	for i := range by {
		c, err := dialFrom(t, "127.0.0.1", n.Addr, "token="+tok(fmt.Sprint("by", i)))
		if err != nil {
			t.Fatal(err)
		}
		by[i] = c
	}
	var wg sync.WaitGroup
	acked := make([]int, len(by))
	for i, c := range by {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < 100; k++ {
				if err := c.send(fmt.Sprintf(`{"op":"pub","room":"r%d","id":"m%d","body":{"k":%d}}`, k%3, k, k)); err != nil {
					return
				}
			}
			deadline := time.After(15 * time.Second)
			for acked[i] < 100 {
				select {
				case f, ok := <-c.frames:
					if !ok {
						return
					}
					if f.json["op"] == "ack" {
						acked[i]++
					} else {
						t.Errorf("bystander %d: %s", i, f.data)
					}
				case <-deadline:
					return
				}
			}
		}()
	}
	for _, sub := range []string{"ev\x00il", "bad\x01ctl", "del\x7f", strings.Repeat("x", 129)} {
		code, body := upgradeStatus(t, n.Addr, "/ws?token="+tok(sub), nil)
		if code != http.StatusUnauthorized || !strings.Contains(body, "token sub must be 1 to 128 characters") {
			t.Errorf("token sub %q: %d %q, want 401 with the reason", sub, code, body)
		}
	}
	wg.Wait()
	for i, a := range acked {
		if a != 100 {
			t.Errorf("bystander %d: %d of 100 publishes acknowledged", i, a)
		}
	}
	if m := n.Metrics(t); m["roost_store_errors_total"] != 0 {
		t.Errorf("roost_store_errors_total = %v, want 0: nothing bad reached the store", m["roost_store_errors_total"])
	}

	// Insecure mode: ?user= with a NUL, a percent-encoded invalid byte, a
	// control character.
	dev := plainNode(t, 0, false)
	for _, q := range []string{"user=ev%00il", "user=%ff%fe", "user=tab%09", "user=" + strings.Repeat("%C3%A9", 129)} {
		code, body := upgradeStatus(t, dev.Addr, "/ws?"+q, nil)
		if code != http.StatusBadRequest || !strings.Contains(body, "1 to 128 characters") {
			t.Errorf("?%s: %d %q, want 400 with the reason", q, code, body)
		}
	}
	// 128 characters of two bytes each is a valid user.
	c, err := dialFrom(t, "127.0.0.1", dev.Addr, "user="+strings.Repeat("%C3%A9", 128))
	if err != nil {
		t.Fatalf("128 two-byte characters refused: %v", err)
	}
	c.conn.Close()
}

// From the smaller items: a pub id is 1 to 64 characters (not bytes), and
// history with before 0 or 1 is an empty answer (before is exclusive),
// not "no bound".
func TestPubIDCharactersAndHistoryBeforeZero(t *testing.T) {
	n := plainNode(t, 0, false)
	c, err := dialFrom(t, "127.0.0.1", n.Addr, "user=alice")
	if err != nil {
		t.Fatal(err)
	}
	id64 := strings.Repeat("é", 64)
	if err := c.send(`{"op":"pub","room":"r","id":"` + id64 + `","body":1}`); err != nil {
		t.Fatal(err)
	}
	if f := c.expect("ack"); f.json["id"] != id64 {
		t.Fatalf("ack id %q", f.json["id"])
	}
	if err := c.send(`{"op":"pub","room":"r","id":"` + id64 + `x","body":2}`); err != nil {
		t.Fatal(err)
	}
	if f := c.expect("err"); f.json["code"] != "bad_request" || !strings.Contains(f.json["message"].(string), "64 characters") {
		t.Fatalf("65-character id: %s", f.data)
	}
	for _, before := range []string{"0", "1"} {
		if err := c.send(`{"op":"history","room":"r","before":` + before + `}`); err != nil {
			t.Fatal(err)
		}
		if f := c.expect("history"); len(f.json["messages"].([]any)) != 0 {
			t.Fatalf("history before %s: %s, want no messages", before, f.data)
		}
	}
	if err := c.send(`{"op":"history","room":"r","before":2}`); err != nil {
		t.Fatal(err)
	}
	if f := c.expect("history"); len(f.json["messages"].([]any)) != 1 {
		t.Fatalf("history before 2: %s, want seq 1", f.data)
	}
}

// From the smaller items: app secrets come from a file or the
// environment (the docs say never to put them on the command line), and
// a secret given there anyway is masked in the admin listener's
// /debug/pprof/cmdline. On the real binary, in token mode.
func TestSecretsFromFileEnvAndCmdline(t *testing.T) {
	file := filepath.Join(t.TempDir(), "secrets")
	if err := os.WriteFile(file, []byte("# app secrets\nchat=file-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a := startPlain(t, harness.Spec{Name: "file-env", Env: []string{"ROOST_APP_SECRET=web=env-secret"}, Args: []string{"--app-secret-file", file}}, true)
	for app, secret := range map[string]string{"chat": "file-secret", "web": "env-secret"} {
		c, err := dialFrom(t, "127.0.0.1", a.Addr, "token="+signToken(secret, app, "u"))
		if err != nil {
			t.Fatalf("app %s with its secret from the %s: %v", app, map[string]string{"chat": "file", "web": "environment"}[app], err)
		}
		c.conn.Close()
		if code, body := upgradeStatus(t, a.Addr, "/ws?token="+signToken("wrong", app, "u"), nil); code != http.StatusUnauthorized {
			t.Errorf("app %s, wrong secret: %d %q, want 401", app, code, body)
		}
	}
	if code, _ := upgradeStatus(t, a.Addr, "/ws?user=u&app=chat", nil); code == http.StatusSwitchingProtocols {
		t.Errorf("a node with secrets let a client in without a token")
	}

	b := startPlain(t, harness.Spec{Name: "cmdline", Args: []string{"--app-secret", "cli=topsecret-one,two=topsecret-two"}}, true)
	resp, err := httpClient.Get("http://" + b.Admin + "/debug/pprof/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.Contains(string(body), "topsecret") || !strings.Contains(string(body), "cli=*****,two=*****") {
		t.Errorf("/debug/pprof/cmdline shows %q", body)
	}
	c, err := dialFrom(t, "127.0.0.1", b.Addr, "token="+signToken("topsecret-one", "cli", "u"))
	if err != nil {
		t.Fatalf("the secret given on the command line does not verify: %v", err)
	}
	c.conn.Close()
}

// Case 4: one connection storing 2,000 new rooms × 60 KB (120 MB) in the
// memory store. With a 16 MiB budget the store stays within it (the
// rooms written least recently lose their messages), the app's rooms stop
// at --max-rooms-per-app with err forbidden, the node's RSS stays within
// its baseline plus a few budgets, and bystanders of another app keep
// their connection, their latency and every acked message.
func TestMemoryStoreFloodStaysInBudget(t *testing.T) {
	const budget = 16 << 20
	n := plainNode(t, 0, false, "--memory-store-max", "16MiB", "--max-rooms-per-app", "1500", "--keep", "1000")
	by := newBystanders(t, "127.0.0.2", n.Addr)
	base := n.RSS(t)
	c, err := dialFrom(t, "127.0.0.1", n.Addr, "user=mallory&app=flood")
	if err != nil {
		t.Fatal(err)
	}
	body := `"` + strings.Repeat("z", 60<<10) + `"`
	const rooms, window = 2000, 32
	sent, acked, forbidden := 0, 0, 0
	var peak int64
	for acked+forbidden < rooms {
		for sent < rooms && sent-(acked+forbidden) < window {
			if err := c.send(fmt.Sprintf(`{"op":"pub","room":"f%d","id":"m","body":%s}`, sent, body)); err != nil {
				t.Fatal(err)
			}
			sent++
		}
		select {
		case f, ok := <-c.frames:
			if !ok {
				t.Fatalf("flooding connection closed after %d answers", acked+forbidden)
			}
			switch {
			case f.json["op"] == "ack":
				acked++
			case f.json["op"] == "err" && f.json["code"] == "forbidden":
				forbidden++
			default:
				t.Fatalf("flood: %s", f.data)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("flood stalled at %d answers", acked+forbidden)
		}
		if (acked+forbidden)%200 == 0 {
			peak = max(peak, n.RSS(t))
		}
	}
	if acked != 1500 || forbidden != 500 {
		t.Errorf("flood: %d acked, %d forbidden; want 1500 and 500 (--max-rooms-per-app 1500)", acked, forbidden)
	}
	m := n.Metrics(t)
	if b := m["roost_memory_store_bytes"]; b > budget || b < budget/2 {
		t.Errorf("roost_memory_store_bytes = %v after the flood, want just under the budget %d", b, budget)
	}
	if m["roost_memory_store_evicted_total"] == 0 || m["roost_rooms_refused_total"] != 500 {
		t.Errorf("evicted %v, rooms refused %v; want some and 500", m["roost_memory_store_evicted_total"], m["roost_rooms_refused_total"])
	}
	by.check("after a 120 MB flood of new rooms", max(10*by.baseline, 250*time.Millisecond))
	// The heap may hold up to about twice what is live between
	// collections; 120 MB went in. The bound is the baseline plus four
	// budgets, and the RSS must come back under it.
	bound := base + 4*budget
	deadline := time.Now().Add(20 * time.Second)
	for n.RSS(t) > bound {
		if time.Now().After(deadline) {
			t.Fatalf("RSS %d MiB 20 s after the flood, bound %d MiB (baseline %d MiB, peak %d MiB)", n.RSS(t)>>20, bound>>20, base>>20, peak>>20)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("RSS baseline %d MiB, peak %d MiB, after %d MiB; 120 MB written, budget 16 MiB", base>>20, peak>>20, n.RSS(t)>>20)
	if code := n.Readyz(); code != http.StatusOK {
		t.Errorf("/readyz %d after the flood", code)
	}

	// The same flood without a budget (and without a room bound): what the
	// budget saves, and proof that the bound above means something.
	free := plainNode(t, 0, false, "--memory-store-max", "0", "--max-rooms-per-app", "0")
	fbase := free.RSS(t)
	fc, err := dialFrom(t, "127.0.0.1", free.Addr, "user=mallory&app=flood")
	if err != nil {
		t.Fatal(err)
	}
	for sent, got := 0, 0; got < rooms; got++ {
		for ; sent < rooms && sent-got < window; sent++ {
			if err := fc.send(fmt.Sprintf(`{"op":"pub","room":"f%d","id":"m","body":%s}`, sent, body)); err != nil {
				t.Fatal(err)
			}
		}
		if f := fc.expect("ack"); f.json["op"] != "ack" {
			t.Fatal(f.data)
		}
	}
	if r := free.RSS(t); r <= fbase+4*budget {
		t.Errorf("without a budget the flood left RSS at %d MiB (baseline %d MiB): the budgeted bound proves nothing", r>>20, fbase>>20)
	} else {
		t.Logf("without a budget: RSS baseline %d MiB, after the flood %d MiB", fbase>>20, r>>20)
	}
}
