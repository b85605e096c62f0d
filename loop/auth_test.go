package loop

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/gobwas/ws"
)

func TestTokenAuth(t *testing.T) {
	secret := []byte("s3cret")
	n := startNode(t, func(c *Config) {
		c.Insecure = false
		c.Apps = map[string][]byte{"acme": secret}
	})
	exp := time.Now().Add(time.Hour)

	good := n.dialQuery(t, "token="+signToken(secret, "acme", "alice", exp, nil))
	good.send(`{"op":"join","room":"lobby"}`)
	good.expect(map[string]any{"op": "joined", "room": "lobby"})
	good.send(`{"op":"pub","room":"lobby","id":"1","body":true}`)
	got := good.recv()
	if got["op"] == "msg" {
		if got["from"] != "alice" {
			t.Fatalf("from: %v", got)
		}
		got = good.recv()
	}
	if got["op"] != "ack" {
		t.Fatalf("want ack, got %v", got)
	}

	limited := n.dialQuery(t, "token="+signToken(secret, "acme", "bob", exp, []string{"team-*", "help"}))
	limited.send(`{"op":"join","room":"team-red"}`)
	limited.expect(map[string]any{"op": "joined"})
	limited.send(`{"op":"join","room":"help"}`)
	limited.expect(map[string]any{"op": "joined"})
	limited.send(`{"op":"join","room":"lobby"}`)
	limited.expect(map[string]any{"op": "err", "code": "forbidden", "ref": "lobby"})
	limited.send(`{"op":"pub","room":"lobby","id":"x","body":1}`)
	limited.expect(map[string]any{"op": "err", "code": "forbidden", "ref": "x"})

	for _, tc := range []struct{ name, query, why string }{
		{"no token", "", "missing token"},
		{"insecure params refused", "user=a&app=acme", "missing token"},
		{"garbage", "token=abc", "malformed"},
		{"wrong secret", "token=" + signToken([]byte("nope"), "acme", "a", exp, nil), "signature"},
		{"expired", "token=" + signToken(secret, "acme", "a", time.Now().Add(-time.Minute), nil), "expired"},
		{"unknown app", "token=" + signToken(secret, "other", "a", exp, nil), "unknown app"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, _, _, err := ws.Dial(ctx, "ws://"+n.addr+"/ws?"+tc.query)
			se, ok := err.(ws.StatusError)
			if !ok || int(se) != 401 {
				t.Fatalf("want HTTP 401, got %v", err)
			}
			// The body says why.
			conn, _ := net.Dial("tcp", n.addr)
			defer conn.Close()
			conn.Write([]byte("GET /ws?" + tc.query + " HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"))
			if body := httpStatus(t, conn); !strings.Contains(body, tc.why) {
				t.Fatalf("body %q does not say %q", body, tc.why)
			}
		})
	}
}

// A connection whose token expires is closed with 1008.
func TestTokenExpiryCloses(t *testing.T) {
	secret := []byte("k")
	n := startNode(t, func(c *Config) {
		c.Insecure = false
		c.Apps = map[string][]byte{"acme": secret}
		c.Leeway = 0
	})
	c := n.dialQuery(t, "token="+signToken(secret, "acme", "a", time.Now().Add(1500*time.Millisecond), nil))
	c.send(`{"op":"ping"}`)
	c.expect(map[string]any{"op": "pong"})
	if reason := c.expectClose(1008); reason != "token expired" {
		t.Fatalf("reason %q", reason)
	}
}

// Idle connections get a server ping, and are closed after twice the idle
// interval of silence.
func TestIdlePingThenClose(t *testing.T) {
	n := startNode(t, func(c *Config) { c.IdleInterval = 1500 * time.Millisecond })
	conn, rd := n.raw(t, "quiet")
	c := &client{t: t, conn: conn, rd: rd}
	if f := c.next(); f.Op != ws.OpPing {
		t.Fatalf("want server ping, got %v", f.Op)
	}
	c.expectClose(1000)
}

func TestInsecureNeedsLoopback(t *testing.T) {
	cfg := Defaults()
	cfg.Insecure = true
	cfg.Listen = "0.0.0.0:8080"
	if _, err := New(cfg, nil, nil); err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Fatalf("want loopback refusal, got %v", err)
	}
	cfg.Insecure = false
	if _, err := New(cfg, nil, nil); err == nil || !strings.Contains(err.Error(), "--app-secret") {
		t.Fatalf("want app-secret hint, got %v", err)
	}
}
