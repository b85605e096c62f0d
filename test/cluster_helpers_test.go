package test

// The helpers the tests share: nodes of one test on one PostgreSQL
// database and one Redis (or a Redis Cluster of child redis-server
// processes), started through test/harness, which builds the binary once;
// and a roost protocol client on the shared wire client of
// proto/prototest. Everything listens on 127.0.0.1; every wait is bounded.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/roost-chat/roost/persist/pgtest"
	"github.com/roost-chat/roost/proto/prototest"
	"github.com/roost-chat/roost/pubsub/redistest"
	"github.com/roost-chat/roost/test/harness"
)

const (
	testApp = "ct"
)

// TestMain removes the binary the harness built, if a test built it.
func TestMain(m *testing.M) {
	code := m.Run()
	harness.Cleanup()
	os.Exit(code)
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// env is what the nodes of one test share.
type env struct {
	dbURL    string
	redisURL string
	prefix   string
}

// newEnv gives t its own database and, on redisAddrs (comma-separated),
// its own channel prefix.
func newEnv(t testing.TB, redisAddrs string) *env {
	t.Helper()
	e := &env{dbURL: pgtest.NewDB(t), prefix: redistest.Prefix(t)}
	e.redisURL = "redis://" + redisAddrs + "?prefix=" + e.prefix
	return e
}

// channel is the Redis channel of a room of testApp (pubsub: Prefix.{key}).
func (e *env) channel(room string) string { return e.prefix + ".{" + testApp + "/" + room + "}" }

// roostNode is one `roost serve` child process, started by the harness.
type roostNode = harness.Node

// startNodes starts n nodes in parallel and waits until each is ready.
func startNodes(t testing.TB, e *env, n int, extra ...string) []*roostNode {
	t.Helper()
	nodes := make([]*roostNode, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nodes[i], errs[i] = launchNode(t, e, fmt.Sprintf("node%d", i), extra)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return nodes
}

// launchNode starts one node of e on free ports (the harness retries
// when a port was taken between choosing it and binding it). The harness
// stops it when t ends and, on failure, dumps its log.
func launchNode(t testing.TB, e *env, name string, extra []string) (*roostNode, error) {
	args := append([]string{
		"--database-url", e.dbURL, "--redis-url", e.redisURL, "--migrate", "--insecure", "--api", "off",
		"--loops", "1", "--publish-workers", "2", "--drain", "200ms", "--flush", "1ms",
	}, extra...)
	return harness.Launch(t, harness.Spec{Name: name, Args: args, CPUQuota: true})
}

var httpClient = &http.Client{Timeout: 2 * time.Second}

// wsClient is a roost protocol client over the shared wire client
// (prototest): its reader records what arrives; the test inspects it under
// mu. After the connection dies the client can redial another node and
// keep its record, as a real client reconnecting with since does.
type wsClient struct {
	user string

	wmu  sync.Mutex
	cl   *prototest.Client
	done chan struct{} // closed when the current connection has ended and readErr is set

	mu        sync.Mutex
	node      *roostNode
	rooms     []string            // joined rooms, for rejoining
	msgs      map[string][]uint64 // msg seqs per room, in arrival order
	joined    map[string]uint64   // seq of the latest joined per room
	acks      map[string]uint64   // room + "\x00" + id -> seq
	errs      []wireFrame
	closeCode int   // of the last close frame received, 0 if none
	closes    []int // every close code received, in order
	readErr   error

	// Latency mode (benchmarks): msg frames of room fast are not decoded
	// as JSON; their seq is recorded and, for bodies {"t":UNIXNANO} sent
	// at or after latFrom, the delivery latency.
	fast    string
	latFrom int64
	lat     []time.Duration
}

// wireFrame is the part of a server frame the tests look at.
type wireFrame struct {
	Op      string `json:"op"`
	Room    string `json:"room"`
	Seq     uint64 `json:"seq"`
	ID      string `json:"id"`
	Ref     string `json:"ref"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

func dialClient(t testing.TB, n *roostNode, user string) *wsClient {
	t.Helper()
	c := &wsClient{user: user, msgs: map[string][]uint64{}, joined: map[string]uint64{}, acks: map[string]uint64{}}
	if err := c.dial(n); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.close)
	return c
}

func (c *wsClient) dial(n *roostNode) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cl, err := prototest.Dial(ctx, "ws://"+n.Addr+"/ws?user="+c.user+"&app="+testApp, prototest.Options{OnFrame: c.onFrame})
	if err != nil {
		return fmt.Errorf("%s cannot dial %s: %w", c.user, n.Name, err)
	}
	done := make(chan struct{})
	c.wmu.Lock()
	c.cl, c.done = cl, done
	c.wmu.Unlock()
	c.mu.Lock()
	c.node, c.closeCode, c.readErr = n, 0, nil
	c.mu.Unlock()
	go func() {
		<-cl.Done()
		c.mu.Lock()
		if c.readErr == nil {
			c.readErr = cl.Err()
		}
		c.mu.Unlock()
		close(done)
	}()
	return nil
}

// onFrame runs on the reader goroutine of the current connection.
func (c *wsClient) onFrame(fr prototest.Frame) {
	p := fr.Data
	switch fr.Op {
	case ws.OpClose:
		c.mu.Lock()
		c.closeCode = fr.Code
		c.closes = append(c.closes, fr.Code)
		c.mu.Unlock()
		return
	case ws.OpText:
	default:
		return
	}
	if c.fast != "" && bytes.HasPrefix(p, []byte(`{"op":"msg"`)) {
		now := time.Now().UnixNano()
		seq := uintAfter(p, `"seq":`)
		sent := int64(uintAfter(p, `"body":{"t":`))
		c.mu.Lock()
		c.msgs[c.fast] = append(c.msgs[c.fast], seq)
		if sent >= c.latFrom && sent > 0 {
			c.lat = append(c.lat, time.Duration(now-sent))
		}
		c.mu.Unlock()
		return
	}
	var f wireFrame
	if err := json.Unmarshal(p, &f); err != nil {
		c.mu.Lock()
		c.readErr = fmt.Errorf("server frame is not JSON: %q", p)
		c.mu.Unlock()
		return
	}
	c.mu.Lock()
	switch f.Op {
	case "msg":
		c.msgs[f.Room] = append(c.msgs[f.Room], f.Seq)
	case "joined":
		c.joined[f.Room] = f.Seq
	case "ack":
		c.acks[f.Room+"\x00"+f.ID] = f.Seq
	case "err":
		c.errs = append(c.errs, f)
	}
	c.mu.Unlock()
}

// uintAfter parses the decimal number following key in p (0 if absent).
func uintAfter(p []byte, key string) uint64 {
	i := bytes.Index(p, []byte(key))
	if i < 0 {
		return 0
	}
	var v uint64
	for _, ch := range p[i+len(key):] {
		if ch < '0' || ch > '9' {
			break
		}
		v = v*10 + uint64(ch-'0')
	}
	return v
}

func (c *wsClient) send(frame string) error {
	c.wmu.Lock()
	cl := c.cl
	c.wmu.Unlock()
	return cl.Send(frame)
}

// dead reports whether the current connection has ended.
func (c *wsClient) dead() bool {
	c.wmu.Lock()
	done := c.done
	c.wmu.Unlock()
	select {
	case <-done:
		return true
	default:
		return false
	}
}

func (c *wsClient) close() {
	c.wmu.Lock()
	cl, done := c.cl, c.done
	c.wmu.Unlock()
	cl.Close()
	<-done
}

// join joins room and waits for joined.
func (c *wsClient) join(t testing.TB, room string) {
	t.Helper()
	c.mu.Lock()
	delete(c.joined, room)
	c.rooms = append(c.rooms, room)
	c.mu.Unlock()
	if err := c.send(`{"op":"join","room":"` + room + `"}`); err != nil {
		t.Fatal(err)
	}
	c.waitJoined(t, room)
}

func (c *wsClient) waitJoined(t testing.TB, room string) {
	t.Helper()
	redistest.WaitFor(t, 10*time.Second, func() error {
		c.mu.Lock()
		defer c.mu.Unlock()
		if _, ok := c.joined[room]; ok {
			return nil
		}
		if c.readErr != nil {
			return fmt.Errorf("%s joining %s: %v", c.user, room, c.readErr)
		}
		return fmt.Errorf("%s: no joined for %s (errs %v)", c.user, room, c.errs)
	})
}

// cursor is where a rejoin resumes room: the newest seq seen.
func (c *wsClient) cursor(room string) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	cur := c.joined[room]
	if s := c.msgs[room]; len(s) > 0 && s[len(s)-1] > cur {
		cur = s[len(s)-1]
	}
	return cur
}

// rejoin redials n after the connection ended and joins every room again
// with since = the newest seq seen, as the protocol tells a client to.
func (c *wsClient) rejoin(t testing.TB, n *roostNode) {
	t.Helper()
	if err := c.rejoinErr(n); err != nil {
		t.Fatal(err)
	}
}

// rejoinErr is rejoin for goroutines other than the test's.
func (c *wsClient) rejoinErr(n *roostNode) error {
	c.close()
	if err := c.dial(n); err != nil {
		return err
	}
	c.mu.Lock()
	rooms := append([]string(nil), c.rooms...)
	c.mu.Unlock()
	for _, r := range rooms {
		since := c.cursor(r)
		c.mu.Lock()
		delete(c.joined, r)
		c.mu.Unlock()
		c.mu.Lock()
		errs0 := len(c.errs)
		c.mu.Unlock()
		if err := c.send(fmt.Sprintf(`{"op":"join","room":%q,"since":%d}`, r, since)); err != nil {
			return err
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			c.mu.Lock()
			_, ok := c.joined[r]
			rerr, errs := c.readErr, c.errs[errs0:]
			c.mu.Unlock()
			if ok {
				break
			}
			if rerr != nil || len(errs) > 0 || time.Now().After(deadline) {
				return fmt.Errorf("%s cannot rejoin %s on %s: read %v, errs %v", c.user, r, n.Name, rerr, errs)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return nil
}

// seqs returns a copy of the msg seqs received in room.
func (c *wsClient) seqs(room string) []uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]uint64(nil), c.msgs[room]...)
}

// checkSeqs reports whether s is exactly 1..n, describing the first fault.
func checkSeqs(s []uint64, n uint64) error {
	for i, q := range s {
		if q != uint64(i)+1 {
			kind := "gap"
			if q <= uint64(i) {
				kind = "duplicate or reorder"
			}
			return fmt.Errorf("%s at position %d: seq %d, want %d (received %d of %d)", kind, i, q, i+1, len(s), n)
		}
	}
	if uint64(len(s)) != n {
		return fmt.Errorf("received 1..%d of %d", len(s), n)
	}
	return nil
}

// pubJob is one publish.
type pubJob struct{ room, id string }

// publishAll publishes jobs with at most window unacknowledged, pacing
// sends by pace. An err answer (overloaded while the broker or a node is
// in trouble) is retried with the same id, as the protocol asks. When the
// connection dies, the publisher redials the first live node of failover
// and re-sends everything unacknowledged: the idempotency key makes that
// safe. It returns when every job is acknowledged or by deadline.
func (c *wsClient) publishAll(jobs []pubJob, window int, pace time.Duration, deadline time.Time, failover []*roostNode) error {
	frame := func(j pubJob) string {
		return fmt.Sprintf(`{"op":"pub","room":%q,"id":%q,"body":{"from":%q,"id":%q}}`, j.room, j.id, c.user, j.id)
	}
	acked := func(j pubJob) bool {
		_, ok := c.acks[j.room+"\x00"+j.id]
		return ok
	}
	var inflight []pubJob
	next, errSeen := 0, 0
	var lastSend time.Time
	for {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %d of %d publishes unacknowledged at the deadline", c.user, len(inflight)+len(jobs)-next, len(jobs))
		}
		if c.dead() {
			var to *roostNode
			for _, n := range failover {
				if n.Alive() {
					to = n
					break
				}
			}
			if to == nil {
				return fmt.Errorf("%s: connection lost and no node to fail over to", c.user)
			}
			c.close()
			if err := c.dial(to); err != nil {
				return err
			}
			c.mu.Lock()
			errSeen = len(c.errs)
			c.mu.Unlock()
			for _, j := range inflight {
				if err := c.send(frame(j)); err != nil {
					c.close() // the new node died too: fail over again
					break
				}
			}
		}
		c.mu.Lock()
		keep := inflight[:0]
		for _, j := range inflight {
			if !acked(j) {
				keep = append(keep, j)
			}
		}
		inflight = keep
		var retry []pubJob
		for _, e := range c.errs[errSeen:] {
			if e.Code != "overloaded" && e.Code != "internal" {
				c.mu.Unlock()
				return fmt.Errorf("%s: publish %s refused: %s %s", c.user, e.Ref, e.Code, e.Message)
			}
			for _, j := range inflight {
				if j.id == e.Ref {
					retry = append(retry, j)
				}
			}
		}
		errSeen = len(c.errs)
		c.mu.Unlock()
		if len(retry) > 0 {
			time.Sleep(20 * time.Millisecond)
		}
		for _, j := range retry {
			if err := c.send(frame(j)); err != nil {
				c.close() // a write error means the connection is gone
				break
			}
		}
		if next == len(jobs) && len(inflight) == 0 {
			return nil
		}
		if next < len(jobs) && len(inflight) < window && time.Since(lastSend) >= pace {
			j := jobs[next]
			if err := c.send(frame(j)); err != nil {
				// The write may fail before the reader sees the death:
				// end the connection, fail over above, then send it.
				c.close()
				continue
			}
			next++
			inflight = append(inflight, j)
			lastSend = time.Now()
			continue
		}
		time.Sleep(time.Millisecond)
	}
}

// maxAck is the highest acknowledged seq of room over publishers.
func maxAck(pubs []*wsClient, room string) uint64 {
	var m uint64
	for _, p := range pubs {
		p.mu.Lock()
		for k, s := range p.acks {
			if r, _, _ := strings.Cut(k, "\x00"); r == room && s > m {
				m = s
			}
		}
		p.mu.Unlock()
	}
	return m
}

// ackedSeqs checks that the acks of room over all publishers are exactly
// 1..n with no seq given to two ids.
func ackedSeqs(pubs []*wsClient, room string, n uint64) error {
	seen := make(map[uint64]string)
	for _, p := range pubs {
		p.mu.Lock()
		for k, s := range p.acks {
			r, id, _ := strings.Cut(k, "\x00")
			if r != room {
				continue
			}
			if prev, ok := seen[s]; ok && prev != id {
				p.mu.Unlock()
				return fmt.Errorf("room %s: seq %d acknowledged for %s and %s", room, s, prev, id)
			}
			seen[s] = id
		}
		p.mu.Unlock()
	}
	for s := uint64(1); s <= n; s++ {
		if _, ok := seen[s]; !ok {
			return fmt.Errorf("room %s: seq %d was never acknowledged (acks %d, want %d)", room, s, len(seen), n)
		}
	}
	return nil
}
