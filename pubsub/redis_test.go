package pubsub

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/roost-chat/roost/pubsub/redistest"
)

func newTestRedis(t testing.TB, cfg RedisConfig, h Handler) *Redis {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := NewRedis(ctx, cfg, h, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func TestRedisContract(t *testing.T) {
	redistest.Require(t)
	testBrokerContract(t, func(t *testing.T, h Handler) Broker {
		return newTestRedis(t, RedisConfig{Addrs: []string{redistest.Addr}, Prefix: redistest.Prefix(t)}, h)
	})
}

// Two nodes on one Redis: each receives exactly the rooms it subscribed,
// in publish order, byte-identical, whichever node published.
func TestRedisTwoNodes(t *testing.T) {
	redistest.Require(t)
	cfg := RedisConfig{Addrs: []string{redistest.Addr}, Prefix: redistest.Prefix(t)}
	testTwoNodes(t, cfg)
}

func testTwoNodes(t *testing.T, cfg RedisConfig) {
	ra, rb := newRecorder(), newRecorder()
	a, b := newTestRedis(t, cfg, ra), newTestRedis(t, cfg, rb)
	for _, k := range []string{"r1", "r2"} {
		subscribeWait(t, a, k)
	}
	for _, k := range []string{"r2", "r3"} {
		subscribeWait(t, b, k)
	}
	const n = 300
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	// One publisher per room, as the Broker contract requires; rooms are
	// published from both nodes at once.
	for _, p := range []struct {
		b   Broker
		key string
	}{{a, "r1"}, {b, "r2"}, {a, "r3"}, {b, "r4"}} {
		wg.Go(func() {
			for seq := uint64(1); seq <= n; seq++ {
				if err := p.b.Publish(ctx, p.key, seq, testFrame(p.key, seq)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	checkFor(t, 5*time.Second, func() error {
		if ra.count("r1") < n || ra.count("r2") < n || rb.count("r2") < n || rb.count("r3") < n {
			return fmt.Errorf("a got %d/%d, b got %d/%d of %d",
				ra.count("r1"), ra.count("r2"), rb.count("r2"), rb.count("r3"), n)
		}
		return nil
	})
	expectSeqs(t, ra, "r1", 1, n)
	expectSeqs(t, ra, "r2", 1, n)
	expectSeqs(t, rb, "r2", 1, n)
	expectSeqs(t, rb, "r3", 1, n)
	for _, c := range []struct {
		r   *recorder
		key string
	}{{ra, "r3"}, {ra, "r4"}, {rb, "r1"}, {rb, "r4"}} {
		if got := c.r.count(c.key); got != 0 {
			t.Fatalf("room %q delivered %d messages to a node not subscribed", c.key, got)
		}
	}
	sa, sb := a.Stats(), b.Stats()
	if sa.Published != 2*n || sb.Published != 2*n {
		t.Fatalf("published %d and %d, want %d each", sa.Published, sb.Published, 2*n)
	}
	if sa.Received != 2*n || sb.Received != 2*n || sa.Subscribed != 2 || sb.Subscribed != 2 {
		t.Fatalf("stats a=%+v b=%+v", sa, sb)
	}
	if err := a.Ping(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestRedisSubscribeMany(t *testing.T) {
	redistest.Require(t)
	r := newRecorder()
	b := newTestRedis(t, RedisConfig{Addrs: []string{redistest.Addr}, Prefix: redistest.Prefix(t)}, r)
	// More than one SUBSCRIBE command's worth, queued before the worker
	// runs, so they go out as one pipelined batch.
	const rooms = 3*channelsPerCommand + 7
	var wg sync.WaitGroup
	wg.Add(rooms)
	for i := range rooms {
		b.Subscribe(fmt.Sprint("room", i), func(err error) {
			if err != nil {
				t.Error(err)
			}
			wg.Done()
		})
	}
	wg.Wait()
	if s := b.Stats(); s.Subscribed != rooms || s.Pending != 0 {
		t.Fatalf("stats %+v, want %d subscribed", s, rooms)
	}
	ctx := context.Background()
	for i := range rooms {
		key := fmt.Sprint("room", i)
		if err := b.Publish(ctx, key, 1, testFrame(key, 1)); err != nil {
			t.Fatal(err)
		}
	}
	checkFor(t, 5*time.Second, func() error {
		if got := b.Stats().Received; got != rooms {
			return fmt.Errorf("received %d of %d", got, rooms)
		}
		return nil
	})
	for i := range rooms / 2 {
		b.Unsubscribe(fmt.Sprint("room", i))
	}
	subscribeWait(t, b, "marker")
	if s := b.Stats(); s.Subscribed != rooms-rooms/2+1 {
		t.Fatalf("stats %+v after unsubscribing %d", s, rooms/2)
	}
}

func TestRedisPublishErrors(t *testing.T) {
	redistest.Require(t)
	b := newTestRedis(t, RedisConfig{Addrs: []string{redistest.Addr}, Prefix: redistest.Prefix(t)}, newRecorder())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := b.Publish(ctx, "a", 1, []byte("x"))
	if !errors.Is(err, context.Canceled) || !strings.HasPrefix(err.Error(), "cannot publish") {
		t.Fatalf("publish with canceled context: %v", err)
	}
	pubs := []Publication{{Key: "a", Seq: 1, Frame: []byte("x")}, {Key: "b", Seq: 1, Frame: []byte("y")}}
	errs := make([]error, 2)
	if n := b.PublishBatch(ctx, pubs, errs); n != 2 {
		t.Fatalf("batch with canceled context: %d failures, want 2", n)
	}
	for _, err := range errs {
		if !errors.Is(err, context.Canceled) || !strings.HasPrefix(err.Error(), "cannot publish") {
			t.Fatalf("batch with canceled context: %v", err)
		}
	}
	b.Close()
	err = b.Publish(context.Background(), "a", 2, []byte("x"))
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("publish after Close: %v, want ErrClosed", err)
	}
	if n := b.PublishBatch(context.Background(), pubs, errs); n != 2 || !errors.Is(errs[0], ErrClosed) || !errors.Is(errs[1], ErrClosed) {
		t.Fatalf("batch after Close: %d failures, %v", n, errs)
	}
	done := make(chan error, 1)
	b.Subscribe("a", func(err error) { done <- err })
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("subscribe after Close: %v, want ErrClosed", err)
	}
	if s := b.Stats(); s.PublishErrors != 6 {
		t.Fatalf("PublishErrors = %d, want 6", s.PublishErrors)
	}
}

func TestNewRedisErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := NewRedis(ctx, RedisConfig{}, newRecorder(), nil); err == nil {
		t.Fatal("NewRedis without address succeeded")
	}
	if _, err := NewRedis(ctx, RedisConfig{Addrs: []string{"127.0.0.1:1"}}, newRecorder(), nil); err == nil {
		t.Fatal("NewRedis to a closed port succeeded")
	}
	if err := redistest.Ping(redistest.Addr); err == nil {
		_, err := NewRedis(ctx, RedisConfig{Addrs: []string{redistest.Addr}, Cluster: true}, newRecorder(), nil)
		if err == nil || !strings.Contains(err.Error(), "not a Redis Cluster") {
			t.Fatalf("Cluster: true on a single Redis: %v", err)
		}
	}
}

func TestParseRedisURL(t *testing.T) {
	f := func(in string, want RedisConfig) {
		t.Helper()
		got, err := ParseRedisURL(in)
		if err != nil {
			t.Fatalf("ParseRedisURL(%q): %v", in, err)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("ParseRedisURL(%q) = %+v, want %+v", in, got, want)
		}
	}
	f("redis://127.0.0.1:6379", RedisConfig{Addrs: []string{"127.0.0.1:6379"}})
	f("redis://localhost", RedisConfig{Addrs: []string{"localhost:6379"}})
	f("redis://:secret@h:1/0", RedisConfig{Addrs: []string{"h:1"}, Password: "secret"})
	f("redis://u:p%40ss@h:1?prefix=prod", RedisConfig{Addrs: []string{"h:1"}, Username: "u", Password: "p@ss", Prefix: "prod"})
	f("redis://a:1,b:2,[::1]:3", RedisConfig{Addrs: []string{"a:1", "b:2", "[::1]:3"}, Cluster: true})

	bad := func(in, wantSub string) {
		t.Helper()
		_, err := ParseRedisURL(in)
		if err == nil || !strings.Contains(err.Error(), wantSub) {
			t.Fatalf("ParseRedisURL(%q) error %v, want it to mention %q", in, err, wantSub)
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Fatalf("error leaks the password: %v", err)
		}
	}
	bad("http://h:1", "scheme")
	bad("rediss://:hunter2@h:1", "scheme")
	bad("redis://", "no host")
	bad("redis://:hunter2@h:1/x", "database")
	bad("redis://h:1?db=2", "unknown parameter")
	bad("redis://h:1?prefix=a{b}", "prefix")
	bad("redis://h:1,:2", "bad address")
}

// A Redis restart: the broker resubscribes by itself, calls OnReset, and
// messages published after the restart are delivered.
func TestRedisReconnect(t *testing.T) {
	redistest.RequireBinaries(t)
	p := redistest.Start(t, redistest.FreePort(t, false))
	r := newRecorder()
	b := newTestRedis(t, RedisConfig{Addrs: []string{p.Addr()}, Prefix: redistest.Prefix(t)}, r)
	subscribeWait(t, b, "a")
	subscribeWait(t, b, "b")
	ctx := context.Background()
	if err := b.Publish(ctx, "a", 1, testFrame("a", 1)); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 5*time.Second, func() error {
		if r.count("a") != 1 {
			return errors.New("first message not delivered")
		}
		return nil
	})

	p.Kill()
	if err := b.Publish(ctx, "a", 2, testFrame("a", 2)); err == nil {
		t.Fatal("publish with Redis down succeeded")
	}
	// Subscribing while Redis is down fails fast, and the room is
	// subscribed anyway once Redis is back.
	done := make(chan error, 1)
	b.Subscribe("c", func(err error) { done <- err })
	if err := <-done; err == nil {
		t.Fatal("subscribe with Redis down succeeded")
	}
	if err := b.Ping(ctx); err == nil {
		t.Fatal("Ping with Redis down succeeded")
	}
	p.Restart(t)

	checkFor(t, 5*time.Second, func() error {
		if r.resetCount() < 1 {
			return errors.New("OnReset not called after Redis restart")
		}
		return nil
	})
	if s := b.Stats(); s.Resubscribes != 1 || s.Subscribed != 3 || s.Pending != 0 {
		t.Fatalf("stats after recovery: %+v", s)
	}
	// rueidis redials the publishing connection on demand.
	checkFor(t, 5*time.Second, func() error {
		return b.Publish(ctx, "a", 3, testFrame("a", 3))
	})
	for _, k := range []string{"b", "c"} {
		if err := b.Publish(ctx, k, 1, testFrame(k, 1)); err != nil {
			t.Fatal(err)
		}
	}
	checkFor(t, 5*time.Second, func() error {
		if r.count("a") != 2 || r.count("b") != 1 || r.count("c") != 1 {
			return fmt.Errorf("after restart got a=%d b=%d c=%d", r.count("a"), r.count("b"), r.count("c"))
		}
		return nil
	})
	if got := r.deliveries("a")[1].seq; got != 3 {
		t.Fatalf("second delivery of a has seq %d, want 3", got)
	}
	if err := b.Ping(ctx); err != nil {
		t.Fatal(err)
	}
}

// keysPerShard returns, for every shard, some keys whose slot it owns.
func keysPerShard(t *testing.T, b *Redis, perShard int) map[string][]string {
	t.Helper()
	done := make(chan struct{})
	got := make(map[string][]string)
	// owner reads worker-owned slots: ask from a ready callback, which
	// runs on the worker.
	b.Subscribe("probe", func(err error) {
		defer close(done)
		if err != nil {
			t.Error(err)
			return
		}
		for i := 0; i < 10000; i++ {
			key := fmt.Sprint("app\x00room-", i)
			addr, ok := b.owner(key)
			if ok && len(got[addr]) < perShard {
				got[addr] = append(got[addr], key)
			}
		}
	})
	<-done
	b.Unsubscribe("probe")
	return got
}

func TestRedisCluster(t *testing.T) {
	c := redistest.StartCluster(t)
	var addrs []string
	for _, n := range c {
		addrs = append(addrs, n.Addr())
	}
	cfg, err := ParseRedisURL("redis://" + strings.Join(addrs, ","))
	if err != nil {
		t.Fatal(err)
	}

	t.Run("Contract", func(t *testing.T) {
		testBrokerContract(t, func(t *testing.T, h Handler) Broker {
			cfg := cfg
			cfg.Prefix = redistest.Prefix(t)
			return newTestRedis(t, cfg, h)
		})
	})

	t.Run("TwoNodes", func(t *testing.T) {
		cfg := cfg
		cfg.Prefix = redistest.Prefix(t)
		testTwoNodes(t, cfg)
	})

	t.Run("SingleSeed", func(t *testing.T) {
		// One seed address of a cluster is detected as a cluster.
		b := newTestRedis(t, RedisConfig{Addrs: addrs[:1], Prefix: redistest.Prefix(t)}, newRecorder())
		if !b.Cluster() {
			t.Fatal("one cluster seed not detected as a cluster")
		}
	})

	t.Run("Shards", func(t *testing.T) {
		cfg := cfg
		cfg.Prefix = redistest.Prefix(t)
		ra, rb := newRecorder(), newRecorder()
		a, b := newTestRedis(t, cfg, ra), newTestRedis(t, cfg, rb)
		if !a.Cluster() {
			t.Fatal("broker did not detect the cluster")
		}
		shards := keysPerShard(t, a, 4)
		if len(shards) != 3 {
			t.Fatalf("rooms hashed to %d shards, want 3", len(shards))
		}
		var keys []string
		for _, ks := range shards {
			keys = append(keys, ks...)
		}
		for _, k := range keys {
			subscribeWait(t, b, k)
		}
		if s := b.Stats(); s.Subscribed != int64(len(keys)) {
			t.Fatalf("stats %+v, want %d subscribed", s, len(keys))
		}
		const n = 50
		ctx := context.Background()
		for seq := uint64(1); seq <= n; seq++ {
			for _, k := range keys {
				if err := a.Publish(ctx, k, seq, testFrame(k, seq)); err != nil {
					t.Fatal(err)
				}
			}
		}
		checkFor(t, 5*time.Second, func() error {
			for _, k := range keys {
				if rb.count(k) < n {
					return fmt.Errorf("room %q got %d of %d", k, rb.count(k), n)
				}
			}
			return nil
		})
		for _, k := range keys {
			expectSeqs(t, rb, k, 1, n)
			if ra.count(k) != 0 {
				t.Fatalf("unsubscribed node got room %q", k)
			}
		}
		if err := b.Ping(ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("ShardRestart", func(t *testing.T) {
		cfg := cfg
		cfg.Prefix = redistest.Prefix(t)
		r := newRecorder()
		b := newTestRedis(t, cfg, r)
		shards := keysPerShard(t, b, 1)
		var keys []string
		for _, ks := range shards {
			keys = append(keys, ks...)
		}
		for _, k := range keys {
			subscribeWait(t, b, k)
		}
		// Restart one shard's primary; it keeps its slots through its
		// nodes.conf, well within the cluster node timeout.
		c[1].Restart(t)
		redistest.WaitClusterOK(t, c)
		checkFor(t, 8*time.Second, func() error {
			if r.resetCount() < 1 {
				return errors.New("OnReset not called after a shard restart")
			}
			return nil
		})
		ctx := context.Background()
		for _, k := range keys {
			checkFor(t, 5*time.Second, func() error { return b.Publish(ctx, k, 1, testFrame(k, 1)) })
		}
		checkFor(t, 5*time.Second, func() error {
			for _, k := range keys {
				if r.count(k) != 1 {
					return fmt.Errorf("room %q got %d messages after the restart, want 1", k, r.count(k))
				}
			}
			return nil
		})
	})

	t.Run("SlotMigration", func(t *testing.T) {
		cfg := cfg
		cfg.Prefix = redistest.Prefix(t)
		r := newRecorder()
		b := newTestRedis(t, cfg, r)
		key := "app\x00moving"
		subscribeWait(t, b, key)
		from := ownerOf(t, b, key)
		slot := strconv.Itoa(int(b.slotOf(key)))
		var to string
		for _, a := range addrs {
			if a != from {
				to = a
				break
			}
		}
		cli := func(addr string, args ...string) string {
			t.Helper()
			_, port, _ := net.SplitHostPort(addr)
			p, _ := strconv.Atoi(port)
			return redistest.CLI(t, p, args...)
		}
		toID := strings.TrimSpace(cli(to, "cluster", "myid"))
		fromID := strings.TrimSpace(cli(from, "cluster", "myid"))
		// The manual resharding procedure for a slot without keys: Redis
		// drops the sharded subscriptions of the slot on its old owner.
		cli(to, "cluster", "setslot", slot, "importing", fromID)
		cli(from, "cluster", "setslot", slot, "migrating", toID)
		for _, a := range append([]string{to, from}, addrs...) {
			cli(a, "cluster", "setslot", slot, "node", toID)
		}
		redistest.WaitClusterOK(t, c)
		checkFor(t, 5*time.Second, func() error {
			if r.resetCount() < 1 {
				return errors.New("OnReset not called after the slot moved")
			}
			return nil
		})
		if got := ownerOf(t, b, key); got != to {
			t.Fatalf("room subscribed on %s after moving to %s", got, to)
		}
		ctx := context.Background()
		checkFor(t, 5*time.Second, func() error { return b.Publish(ctx, key, 1, testFrame(key, 1)) })
		checkFor(t, 5*time.Second, func() error {
			if r.count(key) != 1 {
				return errors.New("message not delivered after the slot moved")
			}
			return nil
		})
	})

	t.Run("SlotMigrationMoved", func(t *testing.T) {
		// While a slot moves, the shards disagree on its owner for a
		// moment: the old owner has dropped the room's subscription and
		// answers MOVED, the new one, not yet told, answers MOVED back.
		// The broker must keep the room wanted and subscribe it once the
		// move completes, not take MOVED for a refusal and forget it
		// (its members would then hear nothing more, with no gap to show).
		cfg := cfg
		cfg.Prefix = redistest.Prefix(t)
		r := newRecorder()
		b := newTestRedis(t, cfg, r)
		key := "app\x00moved"
		subscribeWait(t, b, key)
		from := ownerOf(t, b, key)
		slot := strconv.Itoa(int(b.slotOf(key)))
		var to string
		for _, a := range addrs {
			if a != from {
				to = a
				break
			}
		}
		cli := func(addr string, args ...string) string {
			t.Helper()
			_, port, _ := net.SplitHostPort(addr)
			p, _ := strconv.Atoi(port)
			return redistest.CLI(t, p, args...)
		}
		toID := strings.TrimSpace(cli(to, "cluster", "myid"))
		fromID := strings.TrimSpace(cli(from, "cluster", "myid"))
		errs0 := b.Stats().SubscribeErrors
		cli(to, "cluster", "setslot", slot, "importing", fromID)
		cli(from, "cluster", "setslot", slot, "migrating", toID)
		cli(from, "cluster", "setslot", slot, "node", toID)
		checkFor(t, 5*time.Second, func() error {
			if b.Stats().SubscribeErrors == errs0 {
				return errors.New("no SSUBSCRIBE answered MOVED while the shards disagree")
			}
			return nil
		})
		for _, a := range append([]string{to}, addrs...) {
			cli(a, "cluster", "setslot", slot, "node", toID)
		}
		redistest.WaitClusterOK(t, c)
		checkFor(t, 10*time.Second, func() error {
			if r.resetCount() < 1 {
				return errors.New("OnReset not called after the slot moved")
			}
			return nil
		})
		if got := ownerOf(t, b, key); got != to {
			t.Fatalf("room subscribed on %s after moving to %s", got, to)
		}
		ctx := context.Background()
		checkFor(t, 5*time.Second, func() error { return b.Publish(ctx, key, 1, testFrame(key, 1)) })
		checkFor(t, 5*time.Second, func() error {
			if r.count(key) != 1 {
				return errors.New("message not delivered after the slot moved")
			}
			return nil
		})
	})
}

// ownerOf returns the shard address the broker subscribes key on, read on
// the worker goroutine (from a ready callback) since the worker owns it.
func ownerOf(t testing.TB, b *Redis, key string) string {
	t.Helper()
	ch := make(chan string, 1)
	b.Subscribe("probe", func(error) {
		addr := ""
		if c := b.activeOn[key]; c != nil {
			addr = c.addr
		}
		ch <- addr
	})
	addr := <-ch
	b.Unsubscribe("probe")
	if addr == "" {
		t.Fatalf("room %q is not subscribed", key)
	}
	return addr
}

// The connections' buffers are smaller than a message may be: a frame
// several times the read and write buffer passes whole both ways, and the
// option that bounds the buffers is the one the client was made with.
func TestRedisFrameLargerThanConnBuffer(t *testing.T) {
	redistest.Require(t)
	cfg := RedisConfig{Addrs: []string{redistest.Addr}, Prefix: redistest.Prefix(t)}
	rec := newRecorder()
	r := newTestRedis(t, cfg, rec)
	if r.opt.ReadBufferEachConn != redisConnBuffer || r.opt.WriteBufferEachConn != redisConnBuffer {
		t.Fatalf("buffers %d/%d, want %d", r.opt.ReadBufferEachConn, r.opt.WriteBufferEachConn, redisConnBuffer)
	}
	subscribeWait(t, r, "big")
	frames := [][]byte{make([]byte, 3*redisConnBuffer+17), testFrame("big", 2), make([]byte, redisConnBuffer)}
	for i, f := range frames {
		for j := range f {
			f[j] = byte(i + j*7)
		}
		if err := r.Publish(context.Background(), "big", uint64(i+1), f); err != nil {
			t.Fatal(err)
		}
	}
	checkFor(t, 5*time.Second, func() error {
		if n := rec.count("big"); n < len(frames) {
			return fmt.Errorf("got %d of %d", n, len(frames))
		}
		return nil
	})
	for i, d := range rec.deliveries("big") {
		if d.seq != uint64(i+1) || !bytes.Equal(d.frame, frames[i]) {
			t.Fatalf("message %d: seq %d, %d bytes, want seq %d, %d bytes", i, d.seq, len(d.frame), i+1, len(frames[i]))
		}
	}
}
