package pubsub

import (
	"context"
	"testing"
	"unsafe"
)

func TestMemoryShardSize(t *testing.T) {
	if got := unsafe.Sizeof(memoryShard{}); got != 64 {
		t.Fatalf("memoryShard is %d bytes, want 64 (one cache line)", got)
	}
}

func TestMemoryReadyIsImmediate(t *testing.T) {
	m := NewMemory(newRecorder())
	called := false
	m.Subscribe("a", func(err error) {
		if err != nil {
			t.Errorf("ready: %v", err)
		}
		called = true
	})
	if !called {
		t.Fatal("ready not called before Subscribe returned")
	}
	if n := m.Subscribed(); n != 1 {
		t.Fatalf("Subscribed() = %d, want 1", n)
	}
	m.Unsubscribe("a")
	if n := m.Subscribed(); n != 0 {
		t.Fatalf("Subscribed() = %d, want 0", n)
	}
}

// A handler may subscribe from inside OnMessage (a join triggered by a
// delivery); Publish must not hold its lock across the callback.
func TestMemoryReentrantHandler(t *testing.T) {
	var m *Memory
	h := handlerFunc(func(key string, seq uint64, frame []byte) {
		m.Subscribe("other", nil)
		m.Unsubscribe(key)
	})
	m = NewMemory(h)
	m.Subscribe("a", nil)
	if err := m.Publish(context.Background(), "a", 1, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if n := m.Subscribed(); n != 1 {
		t.Fatalf("Subscribed() = %d, want 1", n)
	}
}

func TestMemoryPublishAllocs(t *testing.T) {
	m := NewMemory(handlerFunc(func(string, uint64, []byte) {}))
	m.Subscribe("app\x00room", nil)
	frame := []byte("frame")
	ctx := context.Background()
	allocs := testing.AllocsPerRun(1000, func() {
		_ = m.Publish(ctx, "app\x00room", 1, frame)
		_ = m.Publish(ctx, "unsubscribed", 1, frame)
	})
	if allocs != 0 {
		t.Fatalf("Publish allocates %.1f times, want 0", allocs)
	}
	pubs := []Publication{{Key: "app\x00room", Seq: 2, Frame: frame}, {Key: "unsubscribed", Seq: 2, Frame: frame}}
	errs := make([]error, len(pubs))
	if allocs := testing.AllocsPerRun(1000, func() { _ = m.PublishBatch(ctx, pubs, errs) }); allocs != 0 {
		t.Fatalf("PublishBatch allocates %.1f times, want 0", allocs)
	}
}

func BenchmarkMemoryPublish(b *testing.B) {
	m := NewMemory(handlerFunc(func(string, uint64, []byte) {}))
	m.Subscribe("app\x00room", nil)
	frame := make([]byte, 128)
	ctx := context.Background()
	b.ReportAllocs()
	b.SetBytes(int64(len(frame)))
	b.RunParallel(func(pb *testing.PB) {
		var seq uint64
		for pb.Next() {
			seq++
			_ = m.Publish(ctx, "app\x00room", seq, frame)
		}
	})
}
