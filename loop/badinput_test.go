package loop

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"

	"github.com/roost-chat/roost/proto/prototest"
)

// healthy checks the node still serves a fresh client end to end.
func (n *node) healthy(t *testing.T) {
	t.Helper()
	c := n.dial(t, "healthy")
	c.send(`{"op":"ping"}`)
	c.expect(map[string]any{"op": "pong"})
}

func httpStatus(t *testing.T, conn net.Conn) string {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, _ := io.ReadAll(conn)
	line, _, _ := strings.Cut(string(b), "\r\n")
	return line + " | " + string(b)
}

func TestGarbageBeforeUpgrade(t *testing.T) {
	n := startNode(t, nil)
	for _, in := range []string{
		"\x00\x01\x02garbage\r\n\r\n",
		"HELLO WORLD\r\n\r\n",
		"POST /ws HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /ws HTTP/1.1\r\nHost: x\r\n\r\n", // no upgrade headers
		"GET /elsewhere HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /ws?app=test HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", // no user
	} {
		conn, err := net.Dial("tcp", n.addr)
		if err != nil {
			t.Fatal(err)
		}
		conn.Write([]byte(in))
		got := httpStatus(t, conn)
		conn.Close()
		if !strings.HasPrefix(got, "HTTP/1.1 4") {
			t.Fatalf("%q: want a 4xx answer, got %q", in, got)
		}
	}
	n.healthy(t)
}

func TestHalfSentUpgradeTimesOut(t *testing.T) {
	n := startNode(t, func(c *Config) { c.UpgradeTimeout = 1500 * time.Millisecond })
	half, _ := net.Dial("tcp", n.addr)
	defer half.Close()
	half.Write([]byte("GET /ws?user=a HTTP/1.1\r\nHost: x\r\nUpg"))
	silent, _ := net.Dial("tcp", n.addr)
	defer silent.Close()
	n.healthy(t) // others are served meanwhile
	if got := httpStatus(t, half); !strings.HasPrefix(got, "HTTP/1.1 400") {
		t.Fatalf("half-sent upgrade: got %q", got)
	}
	if got := httpStatus(t, silent); got != " | " {
		t.Fatalf("silent connection: want a plain close, got %q", got)
	}
}

func TestUpgradeInPieces(t *testing.T) {
	n := startNode(t, nil)
	conn, _ := net.Dial("tcp", n.addr)
	defer conn.Close()
	req := "GET /ws?user=slow&app=test HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: keep-alive, Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
	// The head arrives in pieces, and the first frame rides with its tail.
	frame := clientFrame(ws.OpText, true, []byte(`{"op":"ping"}`))
	all := append([]byte(req), frame...)
	for i := 0; i < len(all); i += 7 {
		conn.Write(all[i:min(i+7, len(all))])
		time.Sleep(time.Millisecond)
	}
	rd := bufio.NewReader(conn)
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	status, _ := rd.ReadString('\n')
	if !strings.Contains(status, "101") {
		t.Fatalf("status %q", status)
	}
	for {
		l, _ := rd.ReadString('\n')
		if l == "\r\n" || l == "" {
			break
		}
	}
	c := &client{t: t, conn: conn, rd: rd}
	c.expect(map[string]any{"op": "pong"})
}

func TestBadFramesClose(t *testing.T) {
	n := startNode(t, func(c *Config) { c.MaxFrame = 1024 })
	unmasked := ws.MustCompileFrame(ws.NewTextFrame([]byte(`{"op":"ping"}`)))
	for _, tc := range []struct {
		name  string
		frame []byte
		code  int
	}{
		{"non-JSON text", clientFrame(ws.OpText, true, []byte("hello there")), 1007},
		{"JSON that is not an object", clientFrame(ws.OpText, true, []byte(`[1,2,3]`)), 1007},
		{"JSON string", clientFrame(ws.OpText, true, []byte(`"op"`)), 1007},
		{"truncated JSON", clientFrame(ws.OpText, true, []byte(`{"op":"ping"`)), 1007},
		{"invalid UTF-8", clientFrame(ws.OpText, true, []byte("{\"op\":\"pub\",\"room\":\"a\",\"id\":\"x\",\"body\":\"\xff\xfe\"}")), 1007},
		{"frame over the limit", clientFrame(ws.OpText, true, []byte(`{"op":"ping","pad":"`+strings.Repeat("x", 2000)+`"}`)), 1009},
		{"unmasked client frame", unmasked, 1002},
		{"binary frame", clientFrame(ws.OpBinary, true, []byte{1, 2, 3}), 1003},
		{"continuation without start", clientFrame(ws.OpContinuation, true, []byte("x")), 1002},
		{"reserved opcode", clientFrame(ws.OpCode(0x3), true, []byte("x")), 1002},
	} {
		t.Run(tc.name, func(t *testing.T) {
			other := n.dial(t, "bystander")
			other.send(`{"op":"join","room":"calm"}`)
			other.expect(map[string]any{"op": "joined"})
			conn, rd := n.raw(t, "bad")
			conn.Write(tc.frame)
			c := &client{t: t, conn: conn, rd: rd}
			c.expectClose(tc.code)
			c.expectEOF()
			other.send(`{"op":"ping"}`)
			other.expect(map[string]any{"op": "pong"})
		})
	}
	// Oversized header alone is enough: 1009 before the payload arrives.
	conn, rd := n.raw(t, "big")
	hdr := []byte{0x81, 0xFF, 0, 0, 0, 0, 0, 1, 0, 0, 1, 2, 3, 4} // 64 KiB, masked
	conn.Write(hdr)
	(&client{t: t, conn: conn, rd: rd}).expectClose(1009)
	n.healthy(t)
}

// A client that never reads is closed once its queue passes the outbound
// limit; everyone else in the room keeps receiving every message.
func TestSlowConsumerClosed(t *testing.T) {
	n := startNode(t, func(c *Config) { c.OutboundLimit = 256 << 10 })
	lazy, _ := n.raw(t, "lazy")
	lazy.(*net.TCPConn).SetReadBuffer(4096)
	lazy.Write(clientFrame(ws.OpText, true, []byte(`{"op":"join","room":"firehose"}`)))
	good := n.dial(t, "good")
	good.send(`{"op":"join","room":"firehose"}`)
	good.expect(map[string]any{"op": "joined"})
	pub := n.dial(t, "pub")
	// How long the lazy connection outlives its slow-consumer close: its
	// close frame cannot leave (the kernel holds what it did not read), so
	// the linger ends it.
	lingered := make(chan time.Duration, 1)
	go func() {
		deadline := time.Now().Add(time.Minute)
		for n.fan.Stats.SlowCloses.Load() == 0 && time.Now().Before(deadline) {
			time.Sleep(2 * time.Millisecond)
		}
		closed := time.Now()
		for n.srv.Stats.Conns.Load() > 2 && time.Now().Before(deadline) {
			time.Sleep(2 * time.Millisecond)
		}
		lingered <- time.Since(closed)
	}()
	body := `"` + strings.Repeat("y", 900) + `"`
	const total, window = 8000, 100
	errc := make(chan error, 1)
	go func() {
		// A well-behaved publisher: at most window publishes unacknowledged.
		for i := 1; i <= total; i += window {
			for j := i; j < i+window; j++ {
				if err := wsutil.WriteClientText(pub.conn, []byte(fmt.Sprintf(`{"op":"pub","room":"firehose","id":"m%d","body":%s}`, j, body))); err != nil {
					errc <- err
					return
				}
			}
			for j := i; j < i+window; j++ {
				p, err := prototest.ReadText(pub.rd)
				if err != nil || !bytes.Contains(p, []byte(`"op":"ack"`)) {
					errc <- fmt.Errorf("ack %d: %q %v", j, p, err)
					return
				}
			}
		}
		errc <- nil
	}()
	for seq := 1; seq <= total; seq++ {
		p, err := prototest.ReadText(good.rd)
		if err != nil {
			t.Fatalf("good reader at seq %d: %v", seq, err)
		}
		if !bytes.Contains(p, []byte(fmt.Sprintf(`"seq":%d,`, seq))) {
			t.Fatalf("good reader: want seq %d, got %.80s", seq, p)
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if got := n.fan.Stats.SlowCloses.Load(); got != 1 {
		t.Fatalf("slow-consumer closes: %d, want 1 (the lazy client)", got)
	}
	// The node dropped the lazy connection (it sits in the kernel's send
	// queue behind data the client never read) and kept the two others.
	checkFor(t, 5*time.Second, func() bool { return n.srv.Stats.Conns.Load() == 2 })
	// At most the linger (1 s), plus a second of slack for a shared machine.
	if d := <-lingered; d > lingerMax+time.Second {
		t.Fatalf("the slow consumer's socket was closed %s after its close, linger is %s", d, lingerMax)
	} else {
		t.Logf("the slow consumer's socket was closed %s after its close", d)
	}
}

// The 101 response names the node, so a client can tell where it is.
func TestUpgradeNamesNode(t *testing.T) {
	n := startNode(t, func(c *Config) { c.NodeID = "node-7:8080" })
	conn, rd, head := n.upgradeHead(t, "a")
	if head[0] != "HTTP/1.1 101 Switching Protocols" || !slices.Contains(head, "X-Roost-Node: node-7:8080") || !slices.Contains(head, "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=") {
		t.Fatalf("head: %q", head)
	}
	(&client{t: t, conn: conn, rd: rd}).send(`{"op":"ping"}`)
}
