package loop

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"

	"github.com/gobwas/ws"
	"github.com/panjf2000/gnet/v2"

	"github.com/roost-chat/roost/fanout"
	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
)

// memConn is a gnet.Conn over in-memory buffers, so the fuzzer drives the
// real OnTraffic path without sockets.
type memConn struct {
	gnet.Conn
	in, out []byte
	ctx     any
	el      *memLoop
	closed  bool
}

func (c *memConn) Peek(n int) ([]byte, error) {
	if n <= 0 || n > len(c.in) {
		return c.in, nil
	}
	return c.in[:n], nil
}
func (c *memConn) Discard(n int) (int, error) { c.in = c.in[n:]; return n, nil }
func (c *memConn) InboundBuffered() int       { return len(c.in) }
func (c *memConn) OutboundBuffered() int      { return 0 } // Fd -1: the loop hands everything to Write

func (c *memConn) Write(p []byte) (int, error) { c.out = append(c.out, p...); return len(p), nil }
func (c *memConn) Close() error                { c.closed = true; return nil }
func (c *memConn) Context() any                { return c.ctx }
func (c *memConn) SetContext(v any)            { c.ctx = v }
func (c *memConn) EventLoop() gnet.EventLoop   { return c.el }
func (c *memConn) Fd() int                     { return -1 }

// memLoop stands in for a gnet loop: Execute only records that the inbox
// wants draining; the harness drains on its own goroutine. Atomic: the
// loop's flush and sweep timers push from their own goroutines.
type memLoop struct {
	gnet.EventLoop
	pending atomic.Bool
}

func (l *memLoop) Execute(_ context.Context, _ gnet.Runnable) error {
	l.pending.Store(true)
	return nil
}

// fuzzNode is a server with one in-memory loop, driven by the harness, in
// front of a publish path on a memory store (whose acks and store reads
// come from fanout's goroutines).
func fuzzNode(tb testing.TB) (*Server, *memLoop) {
	return memNode(tb, func(cfg *Config) {
		cfg.MaxFrame = 4096
		cfg.OutboundLimit = 1 << 20
	})
}

// memNode is a server in insecure mode with one in-memory loop, on a
// memory store, with set's changes to the defaults.
func memNode(tb testing.TB, set func(*Config)) (*Server, *memLoop) {
	cfg := Defaults()
	cfg.Insecure = true
	set(&cfg)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	fan, err := fanout.New(cfg.Config, fanout.Parts{Store: persist.NewMemory(10), Log: log})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = fan.Close() })
	s, err := New(cfg, fan, log)
	if err != nil {
		tb.Fatal(err)
	}
	return s, &memLoop{}
}

const fuzzUpgrade = "GET /ws?user=f&app=a HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"

func FuzzClientInput(f *testing.F) {
	frame := func(op ws.OpCode, fin bool, p string) []byte {
		return clientFrame(op, fin, []byte(p))
	}
	cat := func(bs ...[]byte) []byte {
		var out []byte
		for _, b := range bs {
			out = append(out, b...)
		}
		return out
	}
	f.Add(frame(ws.OpText, true, `{"op":"ping"}`), uint8(3))
	f.Add(cat(frame(ws.OpText, true, `{"op":"join","room":"a"}`), frame(ws.OpText, true, `{"op":"pub","room":"a","id":"1","body":[1]}`)), uint8(7))
	f.Add(cat(frame(ws.OpText, false, `{"op":`), frame(ws.OpPing, true, "x"), frame(ws.OpContinuation, true, `"ping"}`)), uint8(1))
	f.Add(frame(ws.OpText, true, "\xff\xfe"), uint8(0))
	f.Add(frame(ws.OpBinary, true, "bin"), uint8(2))
	f.Add(frame(ws.OpClose, true, "\x03\xe8bye"), uint8(5))
	f.Add([]byte{0x81, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, uint8(4))
	f.Add(frame(ws.OpText, true, `{"op":"history","room":"a","before":3,"limit":2}`), uint8(9))
	// Messages that change: a message, its edit, a reaction twice, a bad
	// ref, a folded history.
	f.Add(cat(frame(ws.OpText, true, `{"op":"pub","room":"a","id":"1","body":"x"}`),
		frame(ws.OpText, true, `{"op":"pub","room":"a","id":"2","kind":"edit","ref":1,"body":"y"}`),
		frame(ws.OpText, true, `{"op":"pub","room":"a","id":"3","kind":"react","ref":1,"body":"\ud83d\udc4d"}`),
		frame(ws.OpText, true, `{"op":"pub","room":"a","id":"4","kind":"react","ref":1,"body":"+1"}`),
		frame(ws.OpText, true, `{"op":"pub","room":"a","id":"5","kind":"delete","ref":2}`),
		frame(ws.OpText, true, `{"op":"history","room":"a","fold":true,"after":0}`)), uint8(11))
	f.Add(frame(ws.OpText, true, `{"op":"pub","room":"a","id":"1","kind":"unreact","ref":0,"body":""}`), uint8(6))
	f.Fuzz(func(t *testing.T, data []byte, split uint8) {
		s, el := fuzzNode(t)
		gc := &memConn{el: el}
		s.OnOpen(gc)
		l := s.loops[0].Load()
		gc.in = append(gc.in, fuzzUpgrade...)
		s.OnTraffic(gc)
		if gc.closed || len(gc.out) == 0 {
			t.Fatalf("upgrade failed: %q", gc.out)
		}
		// Skip the 101 response.
		head := len(gc.out)
		step := int(split)%13 + 1
		for i := 0; i < len(data) && !gc.closed; i += step {
			gc.in = append(gc.in, data[i:min(i+step, len(data))]...)
			s.OnTraffic(gc)
			for el.pending.Swap(false) {
				_ = l.drain(context.Background())
			}
		}
		c := gc.ctx.(*conn)
		if !c.closed && c.m.Out.PendingBytes() > 0 {
			for _, f := range c.m.Out.Pending() {
				gc.out = append(gc.out, f...)
			}
		}
		checkServerStream(t, gc.out[head:], gc.closed)
		s.OnClose(gc, nil)
	})
}

// checkServerStream: what the node wrote is a sequence of well-formed,
// unmasked server frames: text frames holding a JSON object, pongs, pings,
// and at most one close frame, last, with a valid code.
func checkServerStream(t *testing.T, out []byte, closed bool) {
	sawClose := false
	for len(out) > 0 {
		h, n, err := proto.ParseFrameHeader(out)
		if err != nil || n == 0 || h.Masked || !h.Fin {
			t.Fatalf("bad server frame header %x: %v", out[:min(len(out), 14)], err)
		}
		if int64(len(out)-n) < h.Length {
			t.Fatalf("truncated server frame")
		}
		p := out[n : n+int(h.Length)]
		out = out[n+int(h.Length):]
		if sawClose {
			t.Fatalf("frame after close")
		}
		switch h.OpCode {
		case ws.OpText:
			var sf proto.ServerFrame
			if err := proto.DecodeServer(p, &sf); err != nil || len(sf.Op) == 0 {
				t.Fatalf("server text frame not a protocol object: %q (%v)", p, err)
			}
		case ws.OpPong, ws.OpPing:
		case ws.OpClose:
			sawClose = true
			if len(p) < 2 || !validCloseCode(int(binary.BigEndian.Uint16(p))) {
				t.Fatalf("bad close payload %q", p)
			}
		default:
			t.Fatalf("unexpected server opcode %v", h.OpCode)
		}
	}
	if closed && !sawClose {
		// A close without a close frame happens only on the upgrade path,
		// which this fuzzer does not reach after the 101.
		t.Fatalf("connection closed without a close frame")
	}
}

var _ net.Conn = (*memConn)(nil)
