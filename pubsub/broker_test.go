package pubsub

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// handlerFunc adapts a function to Handler with a no-op OnReset.
type handlerFunc func(key string, seq uint64, frame []byte)

func (f handlerFunc) OnMessage(key string, seq uint64, frame []byte) { f(key, seq, frame) }
func (f handlerFunc) OnReset()                                       {}

type delivery struct {
	seq   uint64
	frame []byte
}

// recorder is a Handler that keeps every delivery per key. It copies the
// frame because the broker's frame may be a read-only view it reuses.
type recorder struct {
	mu     sync.Mutex
	got    map[string][]delivery
	resets int
}

func newRecorder() *recorder { return &recorder{got: make(map[string][]delivery)} }

func (r *recorder) OnMessage(key string, seq uint64, frame []byte) {
	r.mu.Lock()
	r.got[key] = append(r.got[key], delivery{seq, bytes.Clone(frame)})
	r.mu.Unlock()
}

func (r *recorder) OnReset() {
	r.mu.Lock()
	r.resets++
	r.mu.Unlock()
}

func (r *recorder) count(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.got[key])
}

func (r *recorder) resetCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.resets
}

func (r *recorder) deliveries(key string) []delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]delivery(nil), r.got[key]...)
}

// checkFor polls f until it returns nil or the timeout passes.
func checkFor(t testing.TB, timeout time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// subscribeWait subscribes and waits for ready.
func subscribeWait(t testing.TB, b Broker, key string) {
	t.Helper()
	done := make(chan error, 1)
	b.Subscribe(key, func(err error) { done <- err })
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("subscribe %q: %v", key, err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("subscribe %q: ready not called within 5s", key)
	}
}

// testFrame is a distinct payload per (key, seq) with bytes of every value,
// so that any re-encoding or truncation shows up.
func testFrame(key string, seq uint64) []byte {
	f := fmt.Appendf(nil, "%s/%d/", key, seq)
	for i := range int(seq % 300) {
		f = append(f, byte(i))
	}
	return f
}

// expectSeqs checks that key got exactly seqs from..to, in order, with the
// frames testFrame built.
func expectSeqs(t testing.TB, r *recorder, key string, from, to uint64) {
	t.Helper()
	got := r.deliveries(key)
	if want := int(to - from + 1); len(got) != want {
		t.Fatalf("%q: got %d messages, want %d", key, len(got), want)
	}
	for i, d := range got {
		seq := from + uint64(i)
		if d.seq != seq {
			t.Fatalf("%q: message %d has seq %d, want %d", key, i, d.seq, seq)
		}
		if want := testFrame(key, seq); !bytes.Equal(d.frame, want) {
			t.Fatalf("%q seq %d: frame %q, want %q", key, seq, d.frame, want)
		}
	}
}

// brokerFactory builds a broker delivering to h; the broker is closed by the
// test's cleanup.
type brokerFactory func(t *testing.T, h Handler) Broker

// testBrokerContract runs the behaviour every Broker promises on one node.
func testBrokerContract(t *testing.T, newBroker brokerFactory) {
	ctx := context.Background()
	t.Run("SubscribedOnly", func(t *testing.T) {
		r := newRecorder()
		b := newBroker(t, r)
		subscribeWait(t, b, "app\x00a")
		subscribeWait(t, b, "app\x00b")
		const n = 200
		for seq := uint64(1); seq <= n; seq++ {
			for _, key := range []string{"app\x00a", "app\x00b", "app\x00c"} {
				if err := b.Publish(ctx, key, seq, testFrame(key, seq)); err != nil {
					t.Fatal(err)
				}
			}
		}
		checkFor(t, 5*time.Second, func() error {
			if a, b := r.count("app\x00a"), r.count("app\x00b"); a < n || b < n {
				return fmt.Errorf("got %d and %d messages, want %d each", a, b, n)
			}
			return nil
		})
		expectSeqs(t, r, "app\x00a", 1, n)
		expectSeqs(t, r, "app\x00b", 1, n)
		if c := r.count("app\x00c"); c != 0 {
			t.Fatalf("unsubscribed room delivered %d messages", c)
		}
	})
	t.Run("Batch", func(t *testing.T) {
		r := newRecorder()
		b := newBroker(t, r)
		keys := []string{"app/a", "app/b", "app/c"} // c is not subscribed
		subscribeWait(t, b, keys[0])
		subscribeWait(t, b, keys[1])
		// Batches of every size up to 40, rooms interleaved, frames of
		// different lengths: each room must see its seqs in order, whole.
		const n = 300
		next := map[string]uint64{}
		var pubs []Publication
		for size := 1; next[keys[0]] < n; size = size%40 + 1 {
			pubs = pubs[:0]
			for i := 0; i < size; i++ {
				k := keys[(i*7+size)%len(keys)]
				if next[k] == n {
					continue
				}
				next[k]++
				pubs = append(pubs, Publication{Key: k, Seq: next[k], Frame: testFrame(k, next[k])})
			}
			errs := make([]error, len(pubs)+1)
			errs[len(pubs)] = errors.New("past the batch")
			if failed := b.PublishBatch(ctx, pubs, errs); failed != 0 {
				t.Fatalf("%d of %d failed: %v", failed, len(pubs), errors.Join(errs...))
			}
			for i, err := range errs[:len(pubs)] {
				if err != nil {
					t.Fatalf("pubs[%d]: %v", i, err)
				}
			}
			if errs[len(pubs)] == nil {
				t.Fatal("PublishBatch wrote past len(pubs)")
			}
		}
		if b.PublishBatch(ctx, nil, nil) != 0 {
			t.Fatal("empty batch failed")
		}
		checkFor(t, 5*time.Second, func() error {
			if a, c := r.count(keys[0]), r.count(keys[1]); a < int(next[keys[0]]) || c < int(next[keys[1]]) {
				return fmt.Errorf("got %d and %d messages, want %d and %d", a, c, next[keys[0]], next[keys[1]])
			}
			return nil
		})
		expectSeqs(t, r, keys[0], 1, next[keys[0]])
		expectSeqs(t, r, keys[1], 1, next[keys[1]])
		// A single Publish after batches continues the same order.
		if err := b.Publish(ctx, keys[0], n+1, testFrame(keys[0], n+1)); err != nil {
			t.Fatal(err)
		}
		checkFor(t, 5*time.Second, func() error {
			if r.count(keys[0]) != n+1 {
				return fmt.Errorf("got %d messages, want %d", r.count(keys[0]), n+1)
			}
			return nil
		})
		expectSeqs(t, r, keys[0], 1, n+1)
		if c := r.count(keys[2]); c != 0 {
			t.Fatalf("unsubscribed room delivered %d messages", c)
		}
	})
	t.Run("Unsubscribe", func(t *testing.T) {
		r := newRecorder()
		b := newBroker(t, r)
		subscribeWait(t, b, "a")
		if err := b.Publish(ctx, "a", 1, testFrame("a", 1)); err != nil {
			t.Fatal(err)
		}
		checkFor(t, 5*time.Second, func() error {
			if r.count("a") != 1 {
				return fmt.Errorf("first message not delivered")
			}
			return nil
		})
		b.Unsubscribe("a")
		// Subscribe and Unsubscribe apply in order, so once "marker" is ready
		// "a" is gone; a stray "a" message would arrive before the marker's.
		subscribeWait(t, b, "marker")
		if err := b.Publish(ctx, "a", 2, testFrame("a", 2)); err != nil {
			t.Fatal(err)
		}
		if err := b.Publish(ctx, "marker", 1, testFrame("marker", 1)); err != nil {
			t.Fatal(err)
		}
		checkFor(t, 5*time.Second, func() error {
			if r.count("marker") != 1 {
				return fmt.Errorf("marker not delivered")
			}
			return nil
		})
		expectSeqs(t, r, "a", 1, 1)
	})
	t.Run("Resubscribe", func(t *testing.T) {
		r := newRecorder()
		b := newBroker(t, r)
		// Rapid flips must end in the last requested state.
		for range 5 {
			b.Subscribe("a", nil)
			b.Unsubscribe("a")
		}
		subscribeWait(t, b, "a")
		if err := b.Publish(ctx, "a", 1, testFrame("a", 1)); err != nil {
			t.Fatal(err)
		}
		checkFor(t, 5*time.Second, func() error {
			if r.count("a") != 1 {
				return fmt.Errorf("got %d messages, want 1", r.count("a"))
			}
			return nil
		})
		expectSeqs(t, r, "a", 1, 1)
	})
}

func TestMemoryContract(t *testing.T) {
	testBrokerContract(t, func(t *testing.T, h Handler) Broker {
		m := NewMemory(h)
		t.Cleanup(func() { m.Close() })
		return m
	})
}
