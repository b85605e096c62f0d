package test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/roost-chat/roost/proto/prototest"
)

// opsFrame is one frame a system test's client received, JSON decoded.
type opsFrame struct {
	op     ws.OpCode
	size   int // bytes on the wire: header + payload
	data   []byte
	code   int    // close frames: the code
	reason string // close frames: the reason
	json   map[string]any
}

// opsClient is the shared wire client (prototest) handing every frame,
// decoded, to frames; the channel closes when the connection ends.
type opsClient struct {
	*prototest.Client
	t      testing.TB
	conn   net.Conn
	frames chan opsFrame
}

// dialOpsWith dials addr through netDial (nil: the default dialer).
func dialOpsWith(t testing.TB, addr, query string, netDial func(ctx context.Context, network, addr string) (net.Conn, error)) (*opsClient, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := &opsClient{t: t, frames: make(chan opsFrame, 4096)}
	cl, err := prototest.Dial(ctx, "ws://"+addr+"/ws?"+query, prototest.Options{NetDial: netDial, OnFrame: func(f prototest.Frame) {
		c.frames <- opsFrame{op: f.Op, size: f.Size, data: f.Data, code: f.Code, reason: f.Reason, json: f.Map()}
	}})
	if err != nil {
		return nil, err
	}
	c.Client, c.conn = cl, cl.Conn()
	go func() {
		<-cl.Done()
		close(c.frames)
	}()
	t.Cleanup(cl.Close)
	return c, nil
}

// dialOps is dialOpsWith the default dialer; it fails t when it cannot.
func dialOps(t testing.TB, addr, query string) *opsClient {
	t.Helper()
	c, err := dialOpsWith(t, addr, query, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *opsClient) send(s string) error { return c.Send(s) }

// expect reads the next frame, within 5s, and checks that it is a text
// frame of op.
func (c *opsClient) expect(op string) opsFrame {
	c.t.Helper()
	select {
	case f, ok := <-c.frames:
		if !ok {
			c.t.Fatalf("connection ended while waiting for %s", op)
		}
		if f.op != ws.OpText || f.json["op"] != op {
			c.t.Fatalf("want %s, got opcode %v %s", op, f.op, f.data)
		}
		return f
	case <-time.After(5 * time.Second):
		c.t.Fatalf("no %s within 5s", op)
	}
	return opsFrame{}
}
