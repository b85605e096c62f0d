package httpedge

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// serve starts an http.Server on a Listener of cfg; handler blocks while
// block is open for paths under /block.
func serve(t *testing.T, cfg Config, block chan struct{}) (*Listener, string) {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(inner, cfg)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasPrefix(r.URL.Path, "/block") {
				<-block
			}
			_, _ = io.WriteString(w, "ok")
		}),
		ConnState: l.ConnState,
	}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return l, inner.Addr().String()
}

func dial(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 2 * time.Second}
	if src != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(src)}
	}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// get sends one request on c and returns the status line ("" on error).
func get(c net.Conn, path string) string {
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		return ""
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return ""
	}
	return strings.TrimSpace(line)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A full pool of idle connections gives way to a new one, oldest first:
// the newcomer is answered at once instead of waiting in the backlog.
func TestIdleGiveWay(t *testing.T) {
	l, addr := serve(t, Config{Max: 4}, nil)
	var idle []net.Conn
	for range 4 {
		idle = append(idle, dial(t, "", addr))
	}
	waitFor(t, "4 counted", func() bool { return l.Stats.Counted.Load() == 4 })
	c := dial(t, "", addr)
	if got := get(c, "/"); got != "HTTP/1.1 200 OK" {
		t.Fatalf("newcomer: %q, want 200", got)
	}
	if l.Stats.Evicted.Load() != 1 {
		t.Fatalf("evicted %d, want 1", l.Stats.Evicted.Load())
	}
	// The oldest was closed: its read ends.
	_ = idle[0].SetReadDeadline(time.Now().Add(time.Second))
	if _, err := idle[0].Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("oldest idle connection not closed: %v", err)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// Connections running a handler are kept; when all are, a new one gets
// the Busy answer and the pool stays within its cap.
func TestBusyRefused(t *testing.T) {
	block := make(chan struct{})
	defer close(block)
	busy := "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
	l, addr := serve(t, Config{Max: 2, Busy: []byte(busy)}, block)
	for range 2 {
		c := dial(t, "", addr)
		_, _ = io.WriteString(c, "GET /block HTTP/1.1\r\nHost: x\r\n\r\n")
	}
	waitFor(t, "2 active", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.n == 2 && l.idle.head == nil
	})
	c := dial(t, "", addr)
	if got := get(c, "/"); got != "HTTP/1.1 503 Service Unavailable" {
		t.Fatalf("with every connection busy: %q, want the Busy answer", got)
	}
	if l.Stats.Refused.Load() != 1 || l.Stats.Counted.Load() != 2 {
		t.Fatalf("refused %d counted %d, want 1 and 2", l.Stats.Refused.Load(), l.Stats.Counted.Load())
	}
}

// One address past its own cap pushes out only its own idle connections;
// another address's stay.
func TestPerAddress(t *testing.T) {
	l, addr := serve(t, Config{Max: 10, PerAddr: 2}, nil)
	other := dial(t, "127.0.0.2", addr)
	waitFor(t, "1 counted", func() bool { return l.Stats.Counted.Load() == 1 })
	for range 6 {
		dial(t, "127.0.0.3", addr)
	}
	waitFor(t, "4 evicted", func() bool { return l.Stats.Evicted.Load() == 4 })
	if got := get(other, "/"); got != "HTTP/1.1 200 OK" {
		t.Fatalf("the other address's connection: %q, want 200", got)
	}
	if n := l.Stats.Counted.Load(); n != 3 {
		t.Fatalf("counted %d, want 3", n)
	}
}

// A Released connection leaves the pool, is never evicted, and calls its
// onClose once when it ends.
func TestRelease(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(inner, Config{Max: 1})
	defer l.Close()
	go func() {
		for {
			if _, err := l.Accept(); err != nil {
				return
			}
		}
	}()
	_ = dial(t, "", inner.Addr().String())
	waitFor(t, "1 counted", func() bool { return l.Stats.Counted.Load() == 1 })
	l.mu.Lock()
	c := l.idle.head
	l.mu.Unlock()
	closed := 0
	if !c.Release(func() { closed++ }) || c.Counted() {
		t.Fatal("release failed")
	}
	_ = dial(t, "", inner.Addr().String())
	waitFor(t, "the next counted", func() bool { return l.Stats.Counted.Load() == 1 && l.Stats.Accepted.Load() == 2 })
	if l.Stats.Evicted.Load() != 0 {
		t.Fatal("a released connection was evicted")
	}
	_ = c.Close()
	_ = c.Close()
	if closed != 1 {
		t.Fatalf("onClose called %d times, want 1", closed)
	}
	if c.Release(nil) {
		t.Fatal("Release of a closed connection reported true")
	}
}

// A handler that makes its client wait marks its connection waiting: a
// newcomer pushes it out (its context ends) instead of being turned away.
func TestWaitingGivesWay(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(inner, Config{Max: 1})
	waiting, ended := make(chan struct{}), make(chan struct{})
	type key struct{}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/wait" {
				c := r.Context().Value(key{}).(*Conn)
				c.Wait(true)
				close(waiting)
				select {
				case <-c.PushedOut():
					close(ended)
				case <-time.After(5 * time.Second):
				}
				return
			}
			_, _ = io.WriteString(w, "ok")
		}),
		ConnState:   l.ConnState,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context { return context.WithValue(ctx, key{}, c) },
	}
	go func() { _ = srv.Serve(l) }()
	defer srv.Close()
	addr := inner.Addr().String()
	w := dial(t, "", addr)
	// A POST whose body the handler never reads: net/http does not read
	// the connection again, so only PushedOut tells the handler.
	_, _ = io.WriteString(w, "POST /wait HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
	<-waiting
	if got := get(dial(t, "", addr), "/"); got != "HTTP/1.1 200 OK" {
		t.Fatalf("newcomer: %q, want 200", got)
	}
	select {
	case <-ended:
	case <-time.After(2 * time.Second):
		t.Fatal("the waiting handler was not told it was pushed out")
	}
}
