package loop

import (
	"bytes"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// head sends one HEAD and returns the status, the head's header lines and
// what followed the head until the node closed the connection.
func head(t *testing.T, addr, target string) (status int, hdr, rest string) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte("HEAD " + target + " HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	all, err := io.ReadAll(conn)
	if err != nil {
		t.Fatalf("HEAD %s: %v", target, err)
	}
	h, b, ok := bytes.Cut(all, []byte("\r\n\r\n"))
	if !ok || len(h) < 12 {
		t.Fatalf("HEAD %s: no head in %q", target, all)
	}
	status, _ = strconv.Atoi(string(h[9:12]))
	return status, string(h), string(b)
}

// HEAD answers wherever GET does, with GET's status and headers
// (Content-Length included) and no body.
func TestHead(t *testing.T) {
	script := []byte(strings.Repeat("export const x = 1;\n", 100))
	n := startNode(t, func(c *Config) { c.ClientScript, c.DemoPage = script, []byte("<!doctype html>") })
	for _, tc := range []struct {
		target string
		status int
		want   string
	}{
		{"/roost.js", 200, "Content-Length: " + strconv.Itoa(len(script))},
		{"/", 200, "Content-Length: 15"},
		{"/ws?user=u&app=a", 426, "Sec-WebSocket-Version: 13"},
		{"/sse?user=u&app=a&room=r", 200, "Content-Type: text/event-stream"},
		{"/sse?user=u&app=a", 400, "Content-Length: "},
		{"/nope", 404, "Content-Length: "},
	} {
		status, hdr, rest := head(t, n.addr, tc.target)
		if status != tc.status || !strings.Contains(hdr, tc.want) || rest != "" {
			t.Errorf("HEAD %s: %d, head %q, body %q; want %d with %q and no body", tc.target, status, hdr, rest, tc.status, tc.want)
		}
	}
	n.counted(t)

	tok := startNode(t, func(c *Config) {
		c.Insecure = false
		c.Apps = map[string][]byte{"acme": []byte("k")}
	})
	for _, target := range []string{"/ws", "/sse?room=r"} {
		if status, hdr, rest := head(t, tok.addr, target); status != 401 || rest != "" {
			t.Errorf("HEAD %s without a token: %d %q body %q, want 401 without a body", target, status, hdr, rest)
		}
	}
	tok.counted(t)
}
