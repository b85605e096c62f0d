package loop

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/bytedance/sonic"
	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"

	"github.com/roost-chat/roost/fanout"
	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto/prototest"
	"github.com/roost-chat/roost/pubsub"
)

// node is a server wired as main wires it, on embedded defaults.
type node struct {
	srv   *Server
	fan   *fanout.Node
	store persist.Store
	addr  string
}

// testConfig is an insecure two-loop node on a free loopback port with a
// short flush tick, so tests wait little for batched output.
func testConfig() Config {
	cfg := Defaults()
	cfg.Listen = "127.0.0.1:0"
	cfg.Insecure = true
	cfg.Loops = 2
	cfg.FlushInterval = time.Millisecond
	// As main does in insecure mode: publish rates off unless a test sets them.
	cfg.Limits.PubRate, cfg.Limits.AppPubRate = 0, 0
	return cfg
}

func startNode(t testing.TB, mutate func(*Config)) *node {
	t.Helper()
	cfg := testConfig()
	if mutate != nil {
		mutate(&cfg)
	}
	return startNodeWith(t, cfg, persist.NewMemory(1000), testLogger(), nil)
}

// testLogger drops the node's log unless the test runs verbose.
func testLogger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// startNodeWith wires a node as main does on store. newBroker builds the
// broker delivering to the publish path; nil means an in-process
// pubsub.Memory.
func startNodeWith(t testing.TB, cfg Config, store persist.Store, log *slog.Logger, newBroker func(pubsub.Handler) pubsub.Broker) *node {
	t.Helper()
	parts := fanout.Parts{Store: store, Log: log}
	if newBroker != nil {
		parts.NewBroker = func(h pubsub.Handler) (pubsub.Broker, error) { return newBroker(h), nil }
	}
	fan, err := fanout.New(cfg.Config, parts)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(cfg, fan, log)
	if err != nil {
		_ = fan.Close()
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		_ = fan.Close()
		t.Fatal(err)
	}
	n := &node{srv: srv, fan: fan, store: store, addr: srv.Addr()}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		fan.ClosePublishes()
		_ = srv.Stop(ctx)
		_ = fan.Close()
	})
	return n
}

// client is a real WebSocket client (gobwas/ws), speaking the protocol.
type client struct {
	t    testing.TB
	conn net.Conn
	rd   *bufio.Reader
}

func (n *node) dial(t testing.TB, user string) *client {
	t.Helper()
	return n.dialQuery(t, "user="+user+"&app=test")
}

func (n *node) dialQuery(t testing.TB, query string) *client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, br, _, err := ws.Dial(ctx, "ws://"+n.addr+"/ws?"+query)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	if br == nil {
		br = bufio.NewReader(conn)
	}
	c := &client{t: t, conn: conn, rd: br}
	t.Cleanup(func() { conn.Close() })
	return c
}

func (c *client) send(s string) {
	c.t.Helper()
	if err := wsutil.WriteClientText(c.conn, []byte(s)); err != nil {
		c.t.Fatalf("send %s: %v", s, err)
	}
}

// next reads the next frame (control frames included) within 5s. The
// client reads its socket itself, on the test's goroutine, so a test sees
// the node's pings and answers (or does not answer) them as it means to.
func (c *client) next() prototest.Frame {
	c.t.Helper()
	_ = c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	f, err := prototest.ReadFrame(c.rd)
	if err != nil {
		c.t.Fatalf("read frame: %v", err)
	}
	return f
}

// recv reads the next text frame as a generic JSON object.
func (c *client) recv() map[string]any {
	c.t.Helper()
	p := c.recvRaw()
	var m map[string]any
	if err := sonic.Unmarshal(p, &m); err != nil {
		c.t.Fatalf("server frame is not JSON: %q", p)
	}
	return m
}

func (c *client) recvRaw() []byte {
	c.t.Helper()
	f := c.next()
	if f.Op != ws.OpText {
		c.t.Fatalf("want text frame, got opcode %v payload %q", f.Op, f.Data)
	}
	return f.Data
}

func (c *client) expect(want map[string]any) map[string]any {
	c.t.Helper()
	got := c.recv()
	for k, v := range want {
		if num, ok := v.(int); ok {
			v = float64(num)
		}
		if got[k] != v {
			c.t.Fatalf("field %s: got %v, want %v (frame %v)", k, got[k], v, got)
		}
	}
	return got
}

// expectClose reads until a close frame and checks its code.
func (c *client) expectClose(code int) string {
	c.t.Helper()
	for {
		f := c.next()
		if f.Op != ws.OpClose {
			continue
		}
		if len(f.Data) < 2 {
			c.t.Fatalf("close frame without code")
		}
		if f.Code != code {
			c.t.Fatalf("close code %d (%q), want %d", f.Code, f.Reason, code)
		}
		return f.Reason
	}
}

// expectEOF checks the server closed the TCP connection.
func (c *client) expectEOF() {
	c.t.Helper()
	_ = c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.Copy(io.Discard, c.rd); err != nil && !strings.Contains(err.Error(), "reset") {
		c.t.Fatalf("want EOF, got %v", err)
	}
}

func num(v any) uint64 { f, _ := v.(float64); return uint64(f) }

// checkFor polls cond until it holds or the deadline passes (no sleeps
// standing in for synchronisation).
func checkFor(t testing.TB, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in time")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// raw opens a TCP connection and completes the upgrade by hand, for tests
// that must send what a well-behaved client library would not.
func (n *node) raw(t testing.TB, user string) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, rd, head := n.upgradeHead(t, user)
	if !strings.Contains(head[0], "101") {
		t.Fatalf("upgrade: %q", head)
	}
	return conn, rd
}

// upgradeHead sends a hand-written upgrade request for user and returns
// the connection, its reader past the response head, and the head's lines
// (status line first) without their line ends.
func (n *node) upgradeHead(t testing.TB, user string) (net.Conn, *bufio.Reader, []string) {
	t.Helper()
	conn, err := net.Dial("tcp", n.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	req := "GET /ws?user=" + user + "&app=test HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
	if _, err := conn.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(conn)
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	var head []string
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("upgrade: head %q: %v", head, err)
		}
		if line == "\r\n" {
			return conn, rd, head
		}
		head = append(head, strings.TrimSpace(line))
	}
}

func clientFrame(op ws.OpCode, fin bool, payload []byte) []byte {
	f := ws.NewFrame(op, fin, payload)
	f = ws.MaskFrameInPlace(f)
	b, err := ws.CompileFrame(f)
	if err != nil {
		panic(err)
	}
	return b
}

// An idle connection's own state must stay small (the density target: at most 2 KiB of
// RSS per idle joined connection, gnet's ~430 B included; later work adds an
// app id, a user id and a token expiry, which already fit). The struct is a
// budget, checked here so growth is a decision, not an accident.
func TestConnStateSmall(t *testing.T) {
	const budget = 208
	if got := unsafe.Sizeof(conn{}); got > budget {
		t.Fatalf("conn is %d bytes, budget %d: shrink it or raise the budget with a density measurement (docs/benchmarks.md)", got, budget)
	}
}
