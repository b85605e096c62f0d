package loop

import (
	"bufio"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// get sends one GET with extra header lines and reads the answer.
func get(t *testing.T, addr, target, headers string) (*http.Response, string) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte("GET " + target + " HTTP/1.1\r\nHost: x\r\n" + headers + "\r\n")); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("GET %s: %v", target, err)
	}
	var body strings.Builder
	_, _ = bufio.NewReader(resp.Body).WriteTo(&body)
	resp.Body.Close()
	return resp, body.String()
}

// /roost.js is served in every mode, with a validator the browser
// revalidates by (304), and readable from any origin; / is the demo page in
// insecure mode only.
func TestClientScriptAndDemoPage(t *testing.T) {
	script := []byte(strings.Repeat("export const x = 1;\n", 5000)) // ~100 KB: more than a socket takes at once by default
	demo := []byte("<!doctype html><title>demo</title>")
	for _, insecure := range []bool{true, false} {
		n := startNode(t, func(c *Config) {
			c.ClientScript, c.DemoPage = script, demo
			if !insecure {
				c.Insecure = false
				c.Apps = map[string][]byte{"acme": []byte("k")}
			}
		})
		resp, body := get(t, n.addr, "/roost.js", "")
		if resp.StatusCode != 200 || body != string(script) {
			t.Fatalf("insecure=%v: /roost.js status %d, %d bytes of %d", insecure, resp.StatusCode, len(body), len(script))
		}
		h := resp.Header
		etag := h.Get("ETag")
		if !strings.HasPrefix(etag, `"`) || h.Get("Cache-Control") != "public, max-age=300" ||
			h.Get("Content-Type") != "text/javascript; charset=utf-8" || h.Get("Access-Control-Allow-Origin") != "*" {
			t.Fatalf("insecure=%v: headers %v", insecure, h)
		}
		for _, inm := range []string{etag, "W/" + etag, `"other", ` + etag, "*"} {
			resp, body = get(t, n.addr, "/roost.js", "If-None-Match: "+inm+"\r\n")
			if resp.StatusCode != 304 || body != "" || resp.Header.Get("ETag") != etag {
				t.Fatalf("If-None-Match %s: status %d, body %d bytes", inm, resp.StatusCode, len(body))
			}
		}
		resp, _ = get(t, n.addr, "/roost.js", "If-None-Match: \"stale\"\r\n")
		if resp.StatusCode != 200 {
			t.Fatalf("a stale ETag: status %d", resp.StatusCode)
		}
		resp, body = get(t, n.addr, "/", "")
		if insecure && (resp.StatusCode != 200 || body != string(demo) || resp.Header.Get("Cache-Control") != "no-cache") {
			t.Fatalf("demo page: %d %q %v", resp.StatusCode, body, resp.Header)
		}
		if !insecure && resp.StatusCode != 404 {
			t.Fatalf("token mode serves / with %d", resp.StatusCode)
		}
		n.counted(t)
	}
}

// A plain GET of /ws answers what the upgrade would have been refused
// with, readable from any origin: a browser cannot see why its WebSocket
// failed and asks this way.
func TestPlainGetOfWSSaysWhy(t *testing.T) {
	secret := []byte("k")
	n := startNode(t, func(c *Config) {
		c.Insecure = false
		c.Apps = map[string][]byte{"acme": secret}
	})
	resp, body := get(t, n.addr, "/ws?token="+signToken([]byte("wrong"), "acme", "a", time.Now().Add(time.Hour), nil), "Origin: http://app.example\r\n")
	if resp.StatusCode != 401 || !strings.Contains(body, "signature") || resp.Header.Get("Access-Control-Allow-Origin") != "*" {
		t.Fatalf("bad token: %d %q %v", resp.StatusCode, body, resp.Header)
	}
	resp, body = get(t, n.addr, "/ws?token="+signToken(secret, "acme", "a", time.Now().Add(time.Hour), nil), "")
	if resp.StatusCode != 426 || !strings.Contains(body, "upgrade required") {
		t.Fatalf("good token: %d %q", resp.StatusCode, body)
	}
	n.counted(t)
}

// counted checks that the plain requests left no connection counted as
// open or upgrading.
func (n *node) counted(t *testing.T) {
	t.Helper()
	checkFor(t, 5*time.Second, func() bool {
		return n.srv.Stats.Conns.Load() == 0 && n.srv.Stats.Upgrading.Load() == 0
	})
}
