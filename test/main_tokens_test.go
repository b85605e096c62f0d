package test

// Tests of token lifetimes on the real binary: a rotation's previous
// secret ends the connections it signed, and --max-token-ttl bounds how
// far ahead a token's exp may lie.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/roost-chat/roost/proto"
	"github.com/roost-chat/roost/test/harness"
)

func cli(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(harness.Binary(t), args...).Output()
	if err != nil {
		t.Fatalf("roost %s: %v", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out))
}

func tokenFor(t *testing.T, secret, app, sub string, ttl time.Duration) string {
	t.Helper()
	tok, err := proto.SignToken([]byte(secret), app, sub, time.Now().Add(ttl), nil)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// Issue 25, item 5: after `roost app rotate --keep-previous 5s`, the
// WebSocket and SSE connections whose token the previous secret signed are
// closed 1008 "token expired" within 10 s, spread over a few seconds; one
// that refreshed with a current token (op auth) stays. A token whose exp
// lies ten years ahead is refused with 401 and why.
func TestRetiredSecretEndsConnections(t *testing.T) {
	apps := filepath.Join(t.TempDir(), "apps.json")
	var created struct{ Secret string }
	if err := json.Unmarshal([]byte(cli(t, "app", "create", "rot", "--apps", apps)), &created); err != nil {
		t.Fatal(err)
	}
	n := startPlain(t, harness.Spec{Name: "rot", Args: []string{"--apps", apps}}, true)

	dial := func(query string) *opsClient {
		t.Helper()
		c, err := dialOpsWith(t, n.Addr, query, nil)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	old := func(u string) string { return tokenFor(t, created.Secret, "rot", u, time.Hour) }
	var olds []*opsClient
	for i := range 8 {
		c := dial("token=" + old(fmt.Sprintf("u%d", i)))
		c.send(`{"op":"ping"}`)
		c.expect("pong")
		olds = append(olds, c)
	}
	kept := dial("token=" + old("kept"))
	kept.send(`{"op":"ping"}`)
	kept.expect("pong")
	sse, err := http.Get("http://" + n.Addr + "/sse?room=r&token=" + old("sse"))
	if err != nil || sse.StatusCode != 200 {
		t.Fatalf("sse: %v %v", sse, err)
	}
	defer sse.Body.Close()
	sseEnded := make(chan time.Time, 1)
	go func() {
		sc := bufio.NewScanner(sse.Body)
		for sc.Scan() {
		}
		sseEnded <- time.Now()
	}()

	rotated := time.Now()
	secret := cli(t, "app", "rotate", "rot", "--keep-previous", "5s", "--apps", apps)
	// The kept connection refreshes as soon as the node knows the new
	// secret (the registry reaches it within 2 s).
	for {
		kept.send(`{"op":"auth","token":"` + tokenFor(t, secret, "rot", "kept", time.Hour) + `"}`)
		var f opsFrame
		select {
		case f = <-kept.frames:
		case <-time.After(5 * time.Second):
			t.Fatal("no answer to auth within 5 s")
		}
		if f.json["op"] == "authed" {
			break
		}
		if time.Since(rotated) > 3*time.Second {
			t.Fatalf("refresh with the new secret refused 3 s after the rotation: %s", f.data)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("refreshed %v after the rotation", time.Since(rotated))
	// A token of the new secret is accepted; one ten years ahead is not.
	if code, body := upgradeStatus(t, n.Addr, "/ws?token="+tokenFor(t, secret, "rot", "x", 10*365*24*time.Hour), nil); code != 401 || !strings.Contains(body, "max token ttl") {
		t.Fatalf("10-year token: %d %q, want 401 naming the max token ttl", code, body)
	}

	t.Logf("10-year token refused %v after the rotation", time.Since(rotated))
	// Each close is timed as it arrives, not as the test reads it.
	type closed struct {
		i    int
		f    opsFrame
		ok   bool
		when time.Duration
	}
	closes := make(chan closed, len(olds))
	for i, c := range olds {
		go func() {
			select {
			case f, ok := <-c.frames:
				closes <- closed{i, f, ok, time.Since(rotated)}
			case <-time.After(10*time.Second - time.Since(rotated)):
				closes <- closed{i: i, when: -1}
			}
		}()
	}
	var first, last time.Duration
	for range olds {
		c := <-closes
		switch {
		case c.when < 0:
			t.Fatalf("old-secret connection %d still open 10 s after the rotation", c.i)
		case !c.ok || c.f.op != ws.OpClose || c.f.code != 1008 || c.f.reason != "token expired":
			t.Fatalf("old-secret connection %d: want close 1008 token expired, got %v %d %q (open %v)", c.i, c.f.op, c.f.code, c.f.reason, c.ok)
		case c.when < 4900*time.Millisecond:
			t.Fatalf("old-secret connection %d closed %v after the rotation, before its secret expired", c.i, c.when)
		}
		if first == 0 || c.when < first {
			first = c.when
		}
		last = max(last, c.when)
	}
	select {
	case at := <-sseEnded:
		if d := at.Sub(rotated); d < 4900*time.Millisecond {
			t.Fatalf("old-secret SSE stream ended %v after the rotation", d)
		}
	case <-time.After(10*time.Second - time.Since(rotated)):
		t.Fatal("old-secret SSE stream still open 10 s after the rotation")
	}
	t.Logf("old-secret connections closed between %v and %v after the rotation", first, last)
	if last-first < 100*time.Millisecond {
		t.Fatalf("8 closes within %v: not spread", last-first)
	}
	time.Sleep(time.Until(rotated.Add(9 * time.Second)))
	kept.send(`{"op":"ping"}`)
	kept.expect("pong")
}
