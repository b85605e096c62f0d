package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// parkedCount is how many of app's workers are parked.
func parkedCount(p *Pool, app string) int {
	q := p.queue(app)
	if q == nil {
		return 0
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.parked)
}

// waitParked waits until n of app's workers are parked.
func waitParked(t *testing.T, p *Pool, app string, n int) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); parkedCount(p, app) != n; {
		if time.Now().After(end) {
			t.Fatalf("%d workers parked, want %d", parkedCount(p, app), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// After its first call a worker parks on its connection, and the calls
// after it are written by Ask itself onto that connection: one
// connection, each call answered, the worker parked again after each.
func TestHandOffWritesOnParkedConnection(t *testing.T) {
	var conns, calls atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, `{"allow":false,"code":"forbidden","message":"no"}`)
	}))
	countConns(srv, &conns)
	srv.Start()
	defer srv.Close()
	p := directPool(t)
	tg := Target{URL: srv.URL + "/publish", Timeout: 5 * time.Second, Secret: current}
	askOne(t, p, Publish, tg)
	for i := 0; i < 10; i++ {
		waitParked(t, p, "chat", 1)
		done := make(chan *Call, 1)
		c := &Call{Kind: Publish, App: "chat", User: "alice", Room: "r", ID: "m", Body: []byte(`"hi"`), Done: func(c *Call) { done <- c }}
		if !p.Ask(c, tg) {
			t.Fatal("not asked")
		}
		if n := len(p.queue("chat").ch); n != 0 {
			t.Fatalf("call %d went to the queue (%d there), not to the parked worker", i, n)
		}
		select {
		case c := <-done:
			if c.Result != Denied || c.Message != "no" || c.Allow {
				t.Fatalf("call %d: %+v", i, c)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("call %d: no answer", i)
		}
	}
	if conns.Load() != 1 || calls.Load() != 11 {
		t.Fatalf("%d connections, %d calls; want 1, 11", conns.Load(), calls.Load())
	}
}

// A parked worker whose backend closes the idle connection drops it and
// leaves the parked list: the next call dials anew and is answered.
func TestHandOffBackendClosesIdle(t *testing.T) {
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"allow":true}`)
	}))
	countConns(srv, &conns)
	srv.Config.IdleTimeout = 50 * time.Millisecond
	srv.Start()
	defer srv.Close()
	p := directPool(t)
	tg := Target{URL: srv.URL, Timeout: 5 * time.Second}
	askOne(t, p, Connect, tg)
	waitParked(t, p, "chat", 1)
	waitParked(t, p, "chat", 0) // the backend's idle timeout
	if c := askOne(t, p, Connect, tg); c.Result != Allowed {
		t.Fatalf("after the backend closed: %+v", c)
	}
	if conns.Load() != 2 {
		t.Fatalf("%d connections, want 2", conns.Load())
	}
}

// A call handed off to a backend that does not answer times out within
// its timeout and fails as the app says (closed here); the worker is
// free again after it.
func TestHandOffTimeout(t *testing.T) {
	var stall atomic.Bool
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if stall.Load() {
			<-release
		}
		io.WriteString(w, `{"allow":true}`)
	}))
	defer srv.Close()
	defer close(release)
	p := directPool(t)
	tg := Target{URL: srv.URL, Timeout: 100 * time.Millisecond}
	askOne(t, p, Publish, tg)
	waitParked(t, p, "chat", 1)
	stall.Store(true)
	t0 := time.Now()
	c := askOne(t, p, Publish, tg)
	if c.Result != Timeout || c.Allow || time.Since(t0) > 2*time.Second {
		t.Fatalf("stalled backend: %+v after %s", c, time.Since(t0))
	}
	tg.FailOpen = true
	if c := askOne(t, p, Publish, tg); c.Result != Timeout || !c.Allow {
		t.Fatalf("stalled backend, fail open: %+v", c)
	}
}

// With its one worker parked on one backend, a call to another host is
// not stuck behind it: the worker is sent back to the queue and takes it.
func TestHandOffOtherHost(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{"allow":true}`) })
	a, b := httptest.NewServer(h), httptest.NewServer(h)
	defer a.Close()
	defer b.Close()
	p := directPool(t)
	askOne(t, p, Connect, Target{URL: a.URL, Timeout: 5 * time.Second})
	waitParked(t, p, "chat", 1)
	t0 := time.Now()
	if c := askOne(t, p, Publish, Target{URL: b.URL, Timeout: 5 * time.Second}); c.Result != Allowed || time.Since(t0) > 2*time.Second {
		t.Fatalf("other host: %+v after %s", c, time.Since(t0))
	}
	if c := askOne(t, p, Connect, Target{URL: a.URL, Timeout: 5 * time.Second}); c.Result != Allowed {
		t.Fatalf("first host again: %+v", c)
	}
}

// Closing the pool ends its parked workers.
func TestHandOffClose(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{"allow":true}`) }))
	defer srv.Close()
	p := New(Config{Workers: 4})
	if !p.direct {
		t.Skip("HTTP_PROXY is set")
	}
	askOne(t, p, Connect, Target{URL: srv.URL, Timeout: 5 * time.Second})
	waitParked(t, p, "chat", 1)
	q := p.queue("chat")
	p.Close()
	for end := time.Now().Add(5 * time.Second); q.running.Load() != 0; {
		if time.Now().After(end) {
			t.Fatalf("%d workers still running after Close", q.running.Load())
		}
		time.Sleep(time.Millisecond)
	}
}

// An answer that comes before Ask has given the call to the worker (a
// backend answering while the loop is still in its write) leaves the
// worker waiting without the CPU: on a node of one P, a worker spinning
// for the call kept the loop from the P it needed to give it.
func TestHandOffAnswerBeforeGiveWaitsIdle(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	answered := make(chan struct{}, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, `{"allow":true}`)
		w.(http.Flusher).Flush()
		answered <- struct{}{}
	}))
	defer srv.Close()
	p := directPool(t)
	tg := Target{URL: srv.URL + "/publish", Timeout: 5 * time.Second, Secret: current}
	askOne(t, p, Publish, tg)
	<-answered
	waitParked(t, p, "chat", 1)

	const window = 200 * time.Millisecond
	var cpu time.Duration
	beforeGive = func() {
		<-answered // the answer is on its way to the worker's read
		before := processCPU(t)
		time.Sleep(window)
		cpu = processCPU(t) - before
	}
	done := make(chan *Call, 1)
	c := &Call{Kind: Publish, App: "chat", User: "alice", Room: "r", ID: "m2", Body: []byte(`"hi"`), Done: func(c *Call) { done <- c }}
	if !p.Ask(c, tg) {
		t.Fatal("not asked")
	}
	beforeGive = nil
	select {
	case c := <-done:
		if c.Result != Allowed {
			t.Fatalf("%+v", c)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no answer")
	}
	t.Logf("the process's CPU while the answered worker waited %v for its call: %v", window, cpu)
	if cpu > window/4 {
		t.Fatalf("the process spent %v of CPU in %v while a worker waited for its call: it spins", cpu, window)
	}
}

// processCPU is the user and system time of this process so far.
func processCPU(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
