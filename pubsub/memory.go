package pubsub

import (
	"context"
	"hash/maphash"
	"sync"
)

// memoryShards spreads the subscribed set over independent locks so that
// publishes of different rooms from different goroutines rarely contend.
// 64 is a power of two (mask instead of modulo) and far above the core count.
const memoryShards = 64

// Memory is the in-process broker of a single node: Publish delivers
// synchronously to the node's own Handler when the room is subscribed.
// All methods may be called from any goroutine.
type Memory struct {
	h      Handler
	seed   maphash.Seed
	shards [memoryShards]memoryShard
}

type memoryShard struct {
	mu   sync.RWMutex
	keys map[string]struct{}
	// Padding to 64 bytes keeps neighbouring shard locks off one cache line.
	_ [32]byte
}

var _ Broker = (*Memory)(nil)

// NewMemory returns an in-process broker delivering to h.
func NewMemory(h Handler) *Memory {
	m := &Memory{h: h, seed: maphash.MakeSeed()}
	for i := range m.shards {
		m.shards[i].keys = make(map[string]struct{})
	}
	return m
}

func (m *Memory) shard(key string) *memoryShard {
	return &m.shards[maphash.String(m.seed, key)&(memoryShards-1)]
}

// Publish calls OnMessage synchronously if key is subscribed and drops the
// message otherwise: with one node nobody else can want it. The read lock is
// released before OnMessage so that a handler calling Subscribe or
// Unsubscribe cannot deadlock. Callers publish one room from one goroutine
// at a time (Broker contract), which keeps OnMessage per room ordered.
func (m *Memory) Publish(_ context.Context, key string, seq uint64, frame []byte) error {
	s := m.shard(key)
	s.mu.RLock()
	_, ok := s.keys[key]
	s.mu.RUnlock()
	if ok {
		m.h.OnMessage(key, seq, frame)
	}
	return nil
}

// PublishBatch calls Publish for each message in order; it cannot fail.
func (m *Memory) PublishBatch(ctx context.Context, pubs []Publication, errs []error) int {
	for i := range pubs {
		errs[i] = m.Publish(ctx, pubs[i].Key, pubs[i].Seq, pubs[i].Frame)
	}
	return 0
}

// Subscribe records key and reports it active at once.
func (m *Memory) Subscribe(key string, ready func(error)) {
	s := m.shard(key)
	s.mu.Lock()
	s.keys[key] = struct{}{}
	s.mu.Unlock()
	if ready != nil {
		ready(nil)
	}
}

// Unsubscribe forgets key; later publishes of it are dropped.
func (m *Memory) Unsubscribe(key string) {
	s := m.shard(key)
	s.mu.Lock()
	delete(s.keys, key)
	s.mu.Unlock()
}

// Subscribed reports the number of subscribed rooms.
func (m *Memory) Subscribed() int {
	n := 0
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.RLock()
		n += len(s.keys)
		s.mu.RUnlock()
	}
	return n
}

// Close is a no-op: the in-process broker holds no resources.
func (m *Memory) Close() error { return nil }
