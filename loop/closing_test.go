package loop

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/roost-chat/roost/fanout"
	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
	"github.com/roost-chat/roost/proto/prototest"
)

// publisher dials user and publishes into room without pause until the
// connection ends; the frames it gets back are read and dropped.
func publisher(t *testing.T, n *node, user, room string) *prototest.Client {
	t.Helper()
	var last atomic.Value
	c := prototest.DialT(t, "ws://"+n.addr+"/ws?app=test&user="+user, prototest.Options{
		OnFrame: func(f prototest.Frame) {
			if f.Op == ws.OpClose {
				last.Store(f)
			}
		},
	})
	go func() {
		body := `{"op":"pub","room":"` + room + `","id":"%d","body":"` + strings.Repeat("x", 200) + `"}`
		for i := 0; ; i++ {
			if c.Send(fmt.Sprintf(body, i)) != nil {
				return
			}
		}
	}()
	return c
}

// closedWith waits for c to end and checks that it ended on the node's
// close frame with code and a reason starting with prefix, not on a reset.
func closedWith(t *testing.T, c *prototest.Client, code int, prefix string) {
	t.Helper()
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("connection not closed within 5s")
	}
	got := c.CloseCodes()
	if len(got) != 1 || got[0] != code {
		t.Fatalf("close codes %v, want [%d]; the connection ended with: %v", got, code, c.Err())
	}
	if want := fmt.Sprintf("closed by server with %d %q", code, prefix); !strings.HasPrefix(c.Err().Error(), want[:len(want)-1]) {
		t.Fatalf("ended with %v, want %s...", c.Err(), want[:len(want)-1])
	}
}

// startNodes starts k one-loop nodes at once (a node's start takes a
// while on a busy machine, and a drain ends a node).
func startNodes(t *testing.T, k int) []*node {
	t.Helper()
	ns := make([]*node, k)
	errs := make([]error, k)
	var wg sync.WaitGroup
	for i := range ns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := testConfig()
			cfg.Loops = 1
			store := persist.NewMemory(1000)
			fan, err := fanout.New(cfg.Config, fanout.Parts{Store: store, Log: testLogger()})
			if err != nil {
				errs[i] = err
				return
			}
			srv, err := New(cfg, fan, testLogger())
			if err == nil {
				err = srv.Start()
			}
			if err != nil {
				_ = fan.Close()
				errs[i] = err
				return
			}
			ns[i] = &node{srv: srv, fan: fan, store: store, addr: srv.Addr()}
		}()
	}
	wg.Wait()
	t.Cleanup(func() { // at once too: a stop takes a while as well
		var wg sync.WaitGroup
		for _, n := range ns {
			if n == nil {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				n.fan.ClosePublishes()
				_ = n.srv.Stop(ctx)
				_ = n.fan.Close()
			}()
		}
		wg.Wait()
	})
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return ns
}

// TestDrainWhilePublishing: a client whose publishes are still arriving
// when the node drains it gets the 1001 close frame and its retry hint,
// every time, not a reset (1006) that throws the frame away: 50 clients,
// five on each of ten nodes, all publishing without pause into the drain.
func TestDrainWhilePublishing(t *testing.T) {
	const nodes, each = 10, 5
	for _, n := range startNodes(t, nodes) {
		cs := make([]*prototest.Client, each)
		for i := range cs {
			cs[i] = publisher(t, n, fmt.Sprintf("u%d", i), fmt.Sprintf("r%d", i%2))
		}
		// the publishes are flowing before the drain
		prototest.WaitFor(t, 5*time.Second, func() error {
			if got := n.srv.Stats.Publishes.Load(); got < 100*each {
				return fmt.Errorf("%d publishes", got)
			}
			return nil
		})
		n.srv.Drain(proto.CloseGoingAway, 10*time.Millisecond)
		for _, c := range cs {
			closedWith(t, c, proto.CloseGoingAway, "retry=")
		}
	}
}

// TestDisconnectWhilePublishing: the same for a 1008 close of one user
// (three connections, all publishing), fifty times on one node; a
// bystander in the same room keeps publishing and getting acks.
func TestDisconnectWhilePublishing(t *testing.T) {
	const each = 3
	n := startNode(t, func(c *Config) { c.Loops = 1 })
	// bob is on the same loop, in a room of his own (in theirs he would be
	// a slow consumer of three unpaced publishers)
	acks := make(chan string, 64)
	var msgs atomic.Int64
	by := prototest.DialT(t, "ws://"+n.addr+"/ws?app=test&user=bob", prototest.Options{
		OnFrame: func(f prototest.Frame) {
			switch m := f.Map(); m["op"] {
			case "msg":
				msgs.Add(1)
			case "ack", "joined":
				acks <- fmt.Sprint(m["id"], m["room"])
			}
		},
	})
	if err := by.Send(`{"op":"join","room":"q"}`); err != nil {
		t.Fatal(err)
	}
	bobGets := func(want string) {
		t.Helper()
		select {
		case got := <-acks:
			if got != want {
				t.Fatalf("bob got %s, want %s", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("bob got no %s within 5s (%v)", want, by.Err())
		}
	}
	bobGets("<nil>q")
	for i := 0; i < 50; i++ {
		cs := make([]*prototest.Client, each)
		for j := range cs {
			cs[j] = publisher(t, n, "alice", "r0")
		}
		from := n.srv.Stats.Publishes.Load()
		prototest.WaitFor(t, 5*time.Second, func() error {
			if got := n.srv.Stats.Publishes.Load() - from; got < 100*each {
				return fmt.Errorf("%d publishes", got)
			}
			return nil
		})
		if got := n.srv.Disconnect("test", "alice", 5*time.Second); got != each {
			t.Fatalf("disconnected %d, want %d", got, each)
		}
		for _, c := range cs {
			closedWith(t, c, proto.ClosePolicy, "disconnected")
		}
		id := fmt.Sprintf("b%d", i)
		if err := by.Send(`{"op":"pub","room":"q","id":"` + id + `","body":1}`); err != nil {
			t.Fatal(err)
		}
		bobGets(id + "q")
	}
	prototest.WaitFor(t, 5*time.Second, func() error {
		if by.Dead() || msgs.Load() != 50 {
			return fmt.Errorf("bob: %d of his 50 messages, ended: %v", msgs.Load(), by.Err())
		}
		return nil
	})
}

// TestCloseAnsweredPromptly: a client that sends nothing but answers the
// close is gone as soon as its answer arrives, not after the linger.
func TestCloseAnsweredPromptly(t *testing.T) {
	n := startNode(t, func(c *Config) { c.Loops = 1 })
	c := prototest.DialT(t, "ws://"+n.addr+"/ws?app=test&user=alice", prototest.Options{})
	prototest.WaitFor(t, 5*time.Second, func() error {
		if n.srv.Stats.Conns.Load() != 1 {
			return fmt.Errorf("%d connections", n.srv.Stats.Conns.Load())
		}
		return nil
	})
	start := time.Now()
	n.srv.Disconnect("test", "alice", 5*time.Second)
	<-c.Done()
	prototest.WaitFor(t, 5*time.Second, func() error {
		if n.srv.Stats.Conns.Load() != 0 {
			return fmt.Errorf("%d connections", n.srv.Stats.Conns.Load())
		}
		return nil
	})
	if d := time.Since(start); d >= lingerMax {
		t.Fatalf("closed after %v: the node waited out its linger for a client that answered", d)
	}
	closedWithCodes(t, c, proto.ClosePolicy)
}

func closedWithCodes(t *testing.T, c *prototest.Client, code int) {
	t.Helper()
	if got := c.CloseCodes(); len(got) != 1 || got[0] != code {
		t.Fatalf("close codes %v, want [%d] (%v)", got, code, c.Err())
	}
}

// TestCloseSilentClient: a client that never reads nor answers is closed
// once the linger runs out, and its close frame was there to read.
func TestCloseSilentClient(t *testing.T) {
	n := startNode(t, func(c *Config) { c.Loops = 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, br, _, err := ws.Dial(ctx, "ws://"+n.addr+"/ws?app=test&user=alice")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	prototest.WaitFor(t, 5*time.Second, func() error {
		if n.srv.Stats.Conns.Load() != 1 {
			return fmt.Errorf("%d connections", n.srv.Stats.Conns.Load())
		}
		return nil
	})
	start := time.Now()
	n.srv.Disconnect("test", "alice", 5*time.Second)
	prototest.WaitFor(t, 5*time.Second, func() error {
		if n.srv.Stats.Conns.Load() != 0 {
			return fmt.Errorf("%d connections", n.srv.Stats.Conns.Load())
		}
		return nil
	})
	// the linger bounds it (and no idle timeout, tens of seconds away);
	// the second of slack is the shared machine's
	if d := time.Since(start); d > lingerMax+time.Second {
		t.Fatalf("closed after %v, linger is %v", d, lingerMax)
	}
	var rd io.Reader = conn
	if br != nil {
		rd = br
	}
	_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	f, err := prototest.ReadFrame(rd)
	if err != nil || f.Op != ws.OpClose {
		t.Fatalf("read %v %v, want the close frame", f.Op, err)
	}
}

// TestDiscardInput feeds a closing connection's input in reads of every
// size from 1 byte up: the frames before the client's close frame are
// skipped whatever the cuts (a header cut stays buffered, a payload cut is
// counted), the close frame is found as soon as its header is complete,
// and input that is not frames (or a frame past the limit) is dropped
// whole without a close ever being seen in it.
func TestDiscardInput(t *testing.T) {
	var stream []byte
	for _, n := range []int{0, 3, 125, 126, 300, 65535, 65536, 70000} {
		stream = append(stream, clientFrame(ws.OpText, true, []byte(strings.Repeat("x", n)))...)
	}
	stream = append(stream, clientFrame(ws.OpPing, true, []byte("p"))...)
	closeAt := len(stream)
	stream = append(stream, clientFrame(ws.OpClose, true, []byte{0x03, 0xe8})...)
	newConn := func() *conn {
		return &conn{l: &loopState{srv: &Server{cfg: Config{MaxFrame: 1 << 20}}}, state: stateClosing}
	}
	for _, step := range []int{1, 2, 7, 13, 100, 4096, 65536, len(stream)} {
		c := newConn()
		var held []byte // what gnet keeps of earlier reads
		fed, closed := 0, false
		for fed < len(stream) && !closed {
			k := min(step, len(stream)-fed)
			held = append(held, stream[fed:fed+k]...)
			fed += k
			used, pc := c.discardInput(held)
			if len(held)-used > 14 {
				t.Fatalf("step %d: %d bytes held, want at most a header", step, len(held)-used)
			}
			held = held[used:]
			closed = pc
		}
		if !closed {
			t.Fatalf("step %d: close frame not seen", step)
		}
		if fed < closeAt+6 { // a masked close frame's header is 6 bytes
			t.Fatalf("step %d: close seen after %d bytes, before its header (%d..%d)", step, fed, closeAt, closeAt+6)
		}
	}
	for _, junk := range [][]byte{
		[]byte("GET / HTTP/1.1\r\n\r\n" + string(clientFrame(ws.OpClose, true, nil))),
		append(clientFrame(ws.OpText, true, make([]byte, 2<<20)), clientFrame(ws.OpClose, true, nil)...),
	} {
		c := newConn()
		used, pc := c.discardInput(junk)
		if pc || used != len(junk) || c.skip != -1 {
			t.Fatalf("junk: used %d of %d, close %v, skip %d", used, len(junk), pc, c.skip)
		}
	}
}
