package loop

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/roost-chat/roost/persist/pgtest"
	"github.com/roost-chat/roost/pubsub"
	"github.com/roost-chat/roost/pubsub/redistest"
)

// heldProxy is a TCP proxy to Redis whose server-to-client direction can
// be held: what Redis sends meanwhile (the messages published to the
// node's subscriptions) is on its way, as over a slow link.
type heldProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cond   *sync.Cond
	held   bool
}

func newHeldProxy(t *testing.T, target string) *heldProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &heldProxy{ln: ln, target: target}
	p.cond = sync.NewCond(&p.mu)
	t.Cleanup(func() { ln.Close(); p.release() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			go func() { _, _ = io.Copy(s, c); s.Close() }()
			go func() {
				defer c.Close()
				buf := make([]byte, 32<<10)
				for {
					n, err := s.Read(buf)
					p.mu.Lock()
					for p.held {
						p.cond.Wait()
					}
					p.mu.Unlock()
					if n > 0 {
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return p
}

func (p *heldProxy) hold()    { p.mu.Lock(); p.held = true; p.mu.Unlock() }
func (p *heldProxy) release() { p.mu.Lock(); p.held = false; p.cond.Broadcast(); p.mu.Unlock() }

func redisBroker(t *testing.T, addr, prefix string) func(pubsub.Handler) pubsub.Broker {
	return func(h pubsub.Handler) pubsub.Broker {
		cfg, err := pubsub.ParseRedisURL("redis://" + addr + "?prefix=" + prefix)
		if err != nil {
			t.Fatal(err)
		}
		b, err := pubsub.NewRedis(context.Background(), cfg, h, testLogger())
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
}

// Two nodes on one PostgreSQL and one Redis; node B reaches Redis through
// a link that is held while seqs 6 and 7 are published on node A, so they
// are committed but still on their way to B. A client that saw them on A
// rejoins on B with since 7: not past the store's newest seq, so it waits
// (recovered:true), and once the link delivers, it gets exactly 8 on.
func TestRejoinOtherNodeSinceInFlightRedis(t *testing.T) {
	redistest.Require(t)
	url := pgtest.NewDB(t)
	prefix := redistest.Prefix(t)
	proxy := newHeldProxy(t, redistest.Addr)
	one := testConfig()
	one.Loops = 1
	pgA, pgB := openPG(t, url), openPG(t, url)
	t.Cleanup(pgA.Close)
	t.Cleanup(pgB.Close)
	a := startNodeWith(t, testConfig(), pgA, testLogger(), redisBroker(t, redistest.Addr, prefix))
	b := startNodeWith(t, one, pgB, testLogger(), redisBroker(t, proxy.ln.Addr().String(), prefix))
	pa := a.dial(t, "pub")
	wb := b.dial(t, "watcher")
	wb.send(`{"op":"join","room":"r"}`)
	wb.expect(map[string]any{"op": "joined", "seq": 0})
	xa := a.dial(t, "x")
	xa.send(`{"op":"join","room":"r"}`)
	xa.expect(map[string]any{"op": "joined", "seq": 0})
	publish(t, pa, "r", "m", 5)
	wb.expectSeqs("r", 1, 5)
	xa.expectSeqs("r", 1, 5)
	proxy.hold()
	for i := 6; i <= 7; i++ {
		pa.send(fmt.Sprintf(`{"op":"pub","room":"r","id":"h%d","body":%d}`, i, i))
		pa.expect(map[string]any{"op": "ack", "seq": i})
	}
	xa.expectSeqs("r", 6, 7) // the client saw 6 and 7 on A

	x := b.dial(t, "x")
	x.send(`{"op":"join","room":"r","since":7}`)
	x.expect(map[string]any{"op": "joined", "room": "r", "seq": 5, "recovered": true})
	proxy.release()
	wb.expectSeqs("r", 6, 7)
	pa.send(`{"op":"pub","room":"r","id":"after","body":8}`)
	pa.expect(map[string]any{"op": "ack", "seq": 8})
	x.expect(map[string]any{"op": "msg", "seq": 8}) // 6 and 7 it has: 8 first, once
	wb.expect(map[string]any{"op": "msg", "seq": 8})
	pa.send(`{"op":"pub","room":"r","id":"after2","body":9}`)
	pa.expect(map[string]any{"op": "ack", "seq": 9})
	x.expect(map[string]any{"op": "msg", "seq": 9})
}
