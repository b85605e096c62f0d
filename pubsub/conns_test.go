package pubsub

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/roost-chat/roost/pubsub/redistest"
)

// TestShareConns: each node reads the others' figures, by node, with what
// they closed over the limit; a node that stops sharing drops out after
// the TTL, and the nodes set expires with the last share.
func TestShareConns(t *testing.T) {
	redistest.Require(t)
	cfg := RedisConfig{Addrs: []string{redistest.Addr}, Prefix: redistest.Prefix(t)}
	r := newTestRedis(t, cfg, newRecorder())
	ctx := context.Background()
	const ttl = 400 * time.Millisecond
	a := map[string]ConnCount{"x": {Conns: 50, Shed: 30}, "y": {Conns: 1}}
	if _, err := r.ShareConns(ctx, "a", a, ttl); err != nil {
		t.Fatal(err)
	}
	others, err := r.ShareConns(ctx, "b", map[string]ConnCount{"x": {Conns: 80}}, ttl)
	if err != nil {
		t.Fatal(err)
	}
	if len(others) != 1 || !maps.Equal(others["a"], a) {
		t.Fatalf("b reads %v, want a's %v", others, a)
	}
	others, err = r.ShareConns(ctx, "a", a, ttl)
	if err != nil || !maps.Equal(others["b"], map[string]ConnCount{"x": {Conns: 80}}) {
		t.Fatalf("a reads %v %v", others, err)
	}
	time.Sleep(ttl + 100*time.Millisecond)
	others, err = r.ShareConns(ctx, "b", nil, ttl)
	if err != nil || len(others) != 0 {
		t.Fatalf("a stopped sharing %v ago, b still reads %v %v", ttl, others, err)
	}
	redistest.WaitFor(t, 2*ttl, func() error {
		n, err := r.client.Do(ctx, r.client.B().Exists().Key(r.connsKey("nodes"), r.connsKey("node.a"), r.connsKey("node.b")).Build()).AsInt64()
		if err != nil || n != 0 {
			return fmt.Errorf("%d keys left (%v)", n, err)
		}
		return nil
	})
}

func TestConnCountFormat(t *testing.T) {
	for _, n := range []ConnCount{{}, {Conns: 7}, {Conns: 3, Shed: 9}} {
		if got, ok := parseConnCount(formatConnCount(n)); !ok || got != n {
			t.Errorf("%+v -> %q -> %+v %v", n, formatConnCount(n), got, ok)
		}
	}
	for _, bad := range []string{"", "x", "1/", "1/x", "/2"} {
		if _, ok := parseConnCount(bad); ok {
			t.Errorf("%q parsed", bad)
		}
	}
}
