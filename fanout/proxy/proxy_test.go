package proxy

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/roost-chat/roost/proto"
)

func TestCodeOfAndClip(t *testing.T) {
	for name, want := range map[string]proto.Code{"forbidden": proto.CodeForbidden, "rate_limited": proto.CodeRateLimited, "": proto.CodeForbidden, "nope": proto.CodeForbidden} {
		if got := codeOf(name); got != want {
			t.Errorf("codeOf(%q) = %v, want %v", name, got, want)
		}
	}
	long := strings.Repeat("é", 80) // 160 bytes
	if got := clip(long); len(got) > MaxMessage || !strings.HasPrefix(long, got) || len(got) < MaxMessage-1 {
		t.Errorf("clip cut to %d bytes: %q", len(got), got)
	}
	if got := clip("a\xffb"); got != "a?b" {
		t.Errorf("clip(invalid UTF-8) = %q", got)
	}
}

// A full queue answers at once with the fail mode, and the timeout counts
// from the ask: calls that waited behind a hung backend past it are
// answered Timeout without being made.
func TestQueueFullAndTimeoutFromAsk(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	made := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		made++
		mu.Unlock()
		<-release
	}))
	defer srv.Close()
	defer close(release)
	p := New(Config{Workers: 1, Queue: 2})
	defer p.Close()
	done := make(chan *Call, 10)
	tg := Target{URL: srv.URL, Timeout: 200 * time.Millisecond}
	var calls [4]Call
	queued := 0
	for i := range calls {
		calls[i] = Call{Kind: Publish, App: "a", Done: func(c *Call) { done <- c }}
		if p.Ask(&calls[i], tg) {
			queued++
		} else if calls[i].Result != Full || calls[i].Allow || calls[i].Code != proto.CodeOverloaded {
			t.Fatalf("refused call: %+v", calls[i])
		}
	}
	if queued != 3 { // one taken by the worker (or about to be), two queued
		t.Logf("queued %d of 4", queued)
	}
	t0 := time.Now()
	for i := 0; i < queued; i++ {
		c := <-done
		if c.Result != Timeout || c.Allow {
			t.Fatalf("hung call answered %+v", c)
		}
	}
	if d := time.Since(t0); d > time.Second {
		t.Fatalf("%d calls of a 200ms timeout answered after %v: the timeout did not count from the ask", queued, d)
	}
	mu.Lock()
	defer mu.Unlock()
	if made != 1 {
		t.Fatalf("%d calls made, want 1 (the others waited past their timeout)", made)
	}
	if p.Stats.Calls[Publish][Full].Load() == 0 {
		t.Fatal("no call counted queue_full")
	}
}

// Workers caps the calls of one app in flight, or the app's own InFlight
// in its place: a backend that holds every call sees exactly that many at
// once, however many are asked, and the rest are made as those are
// answered.
func TestInFlightCap(t *testing.T) {
	t.Run("node", func(t *testing.T) { testInFlightCap(t, 3, 0, 3) })
	t.Run("app lower", func(t *testing.T) { testInFlightCap(t, 8, 2, 2) })
	t.Run("app higher", func(t *testing.T) { testInFlightCap(t, 2, 5, 5) })
}

func testInFlightCap(t *testing.T, workers, appInFlight, cap int) {
	const asked = 12
	var mu sync.Mutex
	now, most := 0, 0
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		now++
		most = max(most, now)
		mu.Unlock()
		<-release
		mu.Lock()
		now--
		mu.Unlock()
		_, _ = w.Write([]byte(`{"allow":true}`))
	}))
	defer srv.Close()
	p := New(Config{Workers: workers, Queue: asked})
	defer p.Close()
	done := make(chan *Call, asked)
	tg := Target{URL: srv.URL, Timeout: 5 * time.Second, InFlight: appInFlight}
	calls := make([]Call, asked)
	for i := range calls {
		calls[i] = Call{Kind: Publish, App: "a", Done: func(c *Call) { done <- c }}
		if !p.Ask(&calls[i], tg) {
			t.Fatalf("call %d not queued: %+v", i, calls[i])
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := now
		mu.Unlock()
		if n == cap || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // time for a worker past the cap to show
	close(release)
	for range asked {
		if c := <-done; c.Result != Allowed {
			t.Fatalf("answer %+v", c)
		}
	}
	if most != cap {
		t.Fatalf("the backend saw %d calls at once, want %d", most, cap)
	}
}

// Zero sizes take the defaults.
func TestConfigDefaults(t *testing.T) {
	p := New(Config{})
	defer p.Close()
	if p.cfg.Workers != DefaultInFlight || p.cfg.Queue != DefaultQueue {
		t.Fatalf("workers %d, queue %d", p.cfg.Workers, p.cfg.Queue)
	}
}
