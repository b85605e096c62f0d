package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// askOne asks one call of kind k and waits for its answer.
func askOne(t *testing.T, p *Pool, k Kind, tg Target) *Call {
	t.Helper()
	done := make(chan *Call, 1)
	c := &Call{Kind: k, App: "chat", User: "alice", Room: "r", ID: "m1", Body: []byte(`"hi"`), Done: func(c *Call) { done <- c }}
	if !p.Ask(c, tg) {
		t.Fatalf("not queued: %+v", c)
	}
	select {
	case c := <-done:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no answer")
		return nil
	}
}

// The direct client sends what a backend needs (method, path with its
// query, Host, headers, the body) and keeps one connection per worker:
// calls in turn reuse it.
func TestDirectRequestAndReuse(t *testing.T) {
	var conns atomic.Int32
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, fmt.Sprintf("%s %s host=%s ua=%s ct=%s app=%s signed=%t body=%s", r.Method, r.URL.RequestURI(), r.Host,
			r.Header.Get("User-Agent"), r.Header.Get("Content-Type"), r.Header.Get("X-Roost-App"), r.Header.Get("X-Roost-Signature") != "", b))
		mu.Unlock()
		io.WriteString(w, `{"allow":true}`)
	}))
	countConns(srv, &conns)
	srv.Start()
	defer srv.Close()
	p := directPool(t)
	tg := Target{URL: srv.URL + "/hook/publish?v=1", Timeout: 5 * time.Second, Secret: current}
	for i := 0; i < 5; i++ {
		if c := askOne(t, p, Publish, tg); c.Result != Allowed {
			t.Fatalf("call %d: %+v", i, c)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections for 5 calls in turn, want 1", n)
	}
	want := fmt.Sprintf(`POST /hook/publish?v=1 host=%s ua=roost-proxy ct=application/json app=chat signed=true body={"type":"publish","app":"chat","user":"alice","room":"r","id":"m1","body":"hi"}`,
		strings.TrimPrefix(srv.URL, "http://"))
	mu.Lock()
	defer mu.Unlock()
	if seen[0] != want {
		t.Fatalf("backend saw\n%s\nwant\n%s", seen[0], want)
	}
}

// A backend that closes kept connections (its idle timeout, or after each
// answer), answers chunked, or says Connection: close is still answered
// on every call, over a new connection where needed.
func TestDirectConnectionsClosedByBackend(t *testing.T) {
	// A hand-written backend: the first connection answers chunked, then
	// closes after its second answer without saying so; the second says
	// Connection: close; the rest answer once and close.
	addr, accepted := rawBackend(t, func(nc net.Conn, br *bufio.Reader, n int32) {
		for i := 0; ; i++ {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body)
			switch {
			case n == 1:
				io.WriteString(nc, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"all\r\n9\r\now\":true}\r\n0\r\n\r\n")
				if i == 1 {
					return
				}
			case n == 2:
				io.WriteString(nc, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 14\r\n\r\n{\"allow\":true}")
				return
			default:
				io.WriteString(nc, "HTTP/1.1 200 OK\r\nContent-Length: 14\r\n\r\n{\"allow\":true}")
				return
			}
		}
	})
	p := New(Config{Workers: 1})
	defer p.Close()
	tg := Target{URL: "http://" + addr + "/", Timeout: 5 * time.Second}
	for i := 0; i < 6; i++ {
		if c := askOne(t, p, Connect, tg); c.Result != Allowed {
			t.Fatalf("call %d: %s %+v", i, ResultNames[c.Result], c)
		}
		time.Sleep(10 * time.Millisecond) // the backend's close lands first
	}
	if n := accepted.Load(); n < 4 {
		t.Fatalf("%d connections, want a new one after each close", n)
	}
}

// A status but 2xx, an answer past 4 KiB, and a backend that does not
// answer in time fail as through net/http.
func TestDirectFailures(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/500":
			http.Error(w, "boom", 500)
		case "/big":
			io.WriteString(w, `{"allow":true,"message":"`+strings.Repeat("x", 5000)+`"}`)
		case "/slow":
			time.Sleep(300 * time.Millisecond)
			io.WriteString(w, `{"allow":true}`)
		case "/deny":
			io.WriteString(w, `{"allow":false,"code":"rate_limited","message":"slow down"}`)
		}
	}))
	defer srv.Close()
	p := New(Config{Workers: 1})
	defer p.Close()
	for path, want := range map[string]Result{"/500": Failed, "/big": Failed, "/slow": Timeout, "/deny": Denied} {
		c := askOne(t, p, Publish, Target{URL: srv.URL + path, Timeout: 100 * time.Millisecond})
		if c.Result != want {
			t.Errorf("%s: %s, want %s", path, ResultNames[c.Result], ResultNames[want])
		}
		if path == "/deny" && (c.Message != "slow down" || c.Code.String() != "rate_limited") {
			t.Errorf("deny answered %+v", c)
		}
	}
	// After a timeout the connection is not reused half-read: the next
	// call is answered.
	if c := askOne(t, p, Publish, Target{URL: srv.URL + "/deny", Timeout: time.Second}); c.Result != Denied {
		t.Errorf("after a timeout: %s", ResultNames[c.Result])
	}
	// Nothing listening.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	if c := askOne(t, p, Publish, Target{URL: "http://" + addr + "/", Timeout: time.Second}); c.Result != Failed {
		t.Errorf("backend down: %s", ResultNames[c.Result])
	}
}

func TestParseEndpoint(t *testing.T) {
	for raw, want := range map[string]endpoint{
		"http://h:81/a/b?c=d": {addr: "h:81", host: "h:81", path: "/a/b?c=d", ok: true},
		"http://h":            {addr: "h:80", host: "h", path: "/", ok: true},
		"http://[::1]/x":      {addr: "[::1]:80", host: "[::1]", path: "/x", ok: true},
		"https://h/x":         {},
		"http://u:p@h/x":      {},
		"::":                  {},
	} {
		want.raw = raw
		if got := parseEndpoint(raw); got != want {
			t.Errorf("%s: %+v, want %+v", raw, got, want)
		}
	}
}

// rawBackend serves each connection it accepts with serve (conn: 1 for the
// first), for backends net/http would not be.
func rawBackend(t *testing.T, serve func(nc net.Conn, br *bufio.Reader, conn int32)) (addr string, accepted *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted = new(atomic.Int32)
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go func(nc net.Conn, n int32) {
				defer nc.Close()
				serve(nc, bufio.NewReader(nc), n)
			}(nc, accepted.Add(1))
		}
	}()
	return ln.Addr().String(), accepted
}

// A POST the backend read in full on a kept connection and then closed
// without answering may have been acted on: it fails, and is not made
// again on a new connection (net/http retries a POST only when nothing
// of it was written).
func TestDirectPostReadNotRepeated(t *testing.T) {
	var requests atomic.Int32
	addr, _ := rawBackend(t, func(nc net.Conn, br *bufio.Reader, n int32) {
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body)
			if requests.Add(1) > 1 {
				return // read, maybe acted on, never answered
			}
			io.WriteString(nc, "HTTP/1.1 200 OK\r\nContent-Length: 14\r\n\r\n{\"allow\":true}")
		}
	})
	p := directPool(t)
	tg := Target{URL: "http://" + addr + "/", Timeout: 5 * time.Second}
	if c := askOne(t, p, Publish, tg); c.Result != Allowed {
		t.Fatalf("first call: %s", ResultNames[c.Result])
	}
	if c := askOne(t, p, Publish, tg); c.Result != Failed {
		t.Fatalf("second call: %s, want failed", ResultNames[c.Result])
	}
	time.Sleep(50 * time.Millisecond) // a repeat would have landed
	if n := requests.Load(); n != 2 {
		t.Fatalf("backend read %d requests for 2 calls", n)
	}
}

// An answer's head is bounded as net/http bounds it: a backend that sends
// megabytes of headers fails the call at once instead of being read into
// memory until the timeout.
func TestDirectAnswerHeadBounded(t *testing.T) {
	addr, _ := rawBackend(t, func(nc net.Conn, br *bufio.Reader, n int32) {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		io.WriteString(nc, "HTTP/1.1 200 OK\r\nX-Big: ")
		line := strings.Repeat("a", 64<<10)
		for i := 0; i < 64; i++ { // 4 MiB, then nothing more
			if _, err := io.WriteString(nc, line); err != nil {
				return
			}
		}
		time.Sleep(5 * time.Second)
	})
	p := directPool(t)
	c := askOne(t, p, Publish, Target{URL: "http://" + addr + "/", Timeout: 2 * time.Second})
	if c.Result != Failed {
		t.Fatalf("%s, want failed", ResultNames[c.Result])
	}
}

// A kept connection is reused by a call that comes after the previous
// call's deadline has passed (its deadline is still set on the
// connection).
func TestDirectReuseAfterDeadline(t *testing.T) {
	addr, accepted := rawBackend(t, func(nc net.Conn, br *bufio.Reader, n int32) {
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body)
			io.WriteString(nc, "HTTP/1.1 200 OK\r\nContent-Length: 14\r\n\r\n{\"allow\":true}")
		}
	})
	p := directPool(t)
	tg := Target{URL: "http://" + addr + "/", Timeout: 50 * time.Millisecond}
	for i := 0; i < 3; i++ {
		if c := askOne(t, p, Publish, tg); c.Result != Allowed {
			t.Fatalf("call %d: %s", i, ResultNames[c.Result])
		}
		time.Sleep(80 * time.Millisecond)
	}
	if n := accepted.Load(); n != 1 {
		t.Fatalf("%d connections for 3 calls in turn, want 1", n)
	}
}

// A redirect is an answer but 2xx on both paths: the net/http one (https
// targets, an HTTP proxy) does not follow it, which would turn the POST
// into a GET of another URL.
func TestRedirectFailsOnBothPaths(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hook" {
			http.Redirect(w, r, "/elsewhere", http.StatusFound)
			return
		}
		io.WriteString(w, `{"allow":true}`)
	}))
	defer srv.Close()
	for _, direct := range []bool{true, false} {
		p := New(Config{Workers: 1})
		p.direct = p.direct && direct
		c := askOne(t, p, Publish, Target{URL: srv.URL + "/hook", Timeout: time.Second})
		p.Close()
		if c.Result != Failed {
			t.Errorf("direct %v: a 302 answered %s, want failed", p.direct, ResultNames[c.Result])
		}
	}
}

// directPool is a one-worker pool whose plain-HTTP calls take the direct
// client, closed with the test; an HTTP_PROXY in the environment sends
// calls through net/http instead, so the test has nothing to check.
func directPool(t *testing.T) *Pool {
	t.Helper()
	p := New(Config{Workers: 1})
	t.Cleanup(p.Close)
	if !p.direct {
		t.Skip("HTTP_PROXY is set: calls go through net/http")
	}
	return p
}

// countConns counts the connections srv accepts in n: how many a pool
// opened, to tell a kept connection from a new one.
func countConns(srv *httptest.Server, n *atomic.Int32) {
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			n.Add(1)
		}
	}
}
