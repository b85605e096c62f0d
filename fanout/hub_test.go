package fanout

import (
	"sync"
	"testing"
)

type recLoops struct {
	mu        sync.Mutex
	delivered map[int]int
	told      map[int]int
}

func (r *recLoops) deliver(l int, _ string, _ uint64, _, _ []byte) {
	r.mu.Lock()
	r.delivered[l]++
	r.mu.Unlock()
}
func (r *recLoops) subscribed(l int, _ string, err error) {
	r.mu.Lock()
	r.told[l]++
	r.mu.Unlock()
}
func (r *recLoops) reset(int) {}

type recSub struct {
	mu      sync.Mutex
	ops     []string
	pending []func(error)
}

func (s *recSub) Subscribe(key string, ready func(error)) {
	s.mu.Lock()
	s.ops = append(s.ops, "sub "+key)
	s.pending = append(s.pending, ready)
	s.mu.Unlock()
}
func (s *recSub) Unsubscribe(key string) {
	s.mu.Lock()
	s.ops = append(s.ops, "unsub "+key)
	s.mu.Unlock()
}

func TestHubSubscribesOnceAndRoutes(t *testing.T) {
	loops := &recLoops{delivered: map[int]int{}, told: map[int]int{}}
	sub := &recSub{}
	h := newHub(loops, 3)
	h.sub = sub
	h.join("a/r", 0)
	h.join("a/r", 2)
	if len(sub.ops) != 1 {
		t.Fatalf("want one subscribe, got %v", sub.ops)
	}
	if len(loops.told) != 0 {
		t.Fatal("loops told before the subscription is up")
	}
	sub.pending[0](nil)
	if loops.told[0] != 1 || loops.told[2] != 1 || loops.told[1] != 0 {
		t.Fatalf("subscribed: %v", loops.told)
	}
	h.join("a/r", 1) // already active: told at once
	if loops.told[1] != 1 {
		t.Fatal("late loop not told")
	}
	h.OnMessage("a/r", 1, []byte("x"))
	h.OnMessage("a/other", 1, []byte("x")) // not held: dropped
	if loops.delivered[0] != 1 || loops.delivered[1] != 1 || loops.delivered[2] != 1 || len(loops.delivered) != 3 {
		t.Fatalf("delivered: %v", loops.delivered)
	}
	h.leave("a/r", 0)
	h.leave("a/r", 1)
	if len(sub.ops) != 1 {
		t.Fatal("unsubscribed while a loop still holds the room")
	}
	h.leave("a/r", 2)
	if len(sub.ops) != 2 || sub.ops[1] != "unsub a/r" {
		t.Fatalf("ops: %v", sub.ops)
	}
	if h.rooms() != 0 {
		t.Fatal("room still held")
	}
}

func TestHubFailedSubscribeForgetsRoom(t *testing.T) {
	loops := &recLoops{delivered: map[int]int{}, told: map[int]int{}}
	sub := &recSub{}
	h := newHub(loops, 1)
	h.sub = sub
	h.join("a/r", 0)
	sub.pending[0](errTest{})
	if loops.told[0] != 1 || h.rooms() != 0 {
		t.Fatalf("failed subscribe: told=%d rooms=%d", loops.told[0], h.rooms())
	}
	h.join("a/r", 0) // a new join subscribes afresh
	if len(sub.ops) != 3 || sub.ops[2] != "sub a/r" {
		t.Fatalf("ops: %v", sub.ops)
	}
}

type errTest struct{}

func (errTest) Error() string { return "test" }
