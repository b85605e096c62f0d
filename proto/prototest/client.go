// Package prototest is the WebSocket client of the tests that talk to a
// node over its real wire: one connection, a reader goroutine that answers
// pings and close frames as a browser does, and every wait bounded by a
// deadline. Like persist/pgtest and pubsub/redistest it is imported by
// tests only.
package prototest

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"
)

// Frame is one data or close frame the client received. Pings are
// answered by the reader and not reported.
type Frame struct {
	Op   ws.OpCode
	Size int    // bytes on the wire: header + payload
	Data []byte // the payload, owned by the receiver
	// Close frames: the status code (0 if the frame had none) and reason.
	Code   int
	Reason string
}

// Map decodes a text frame's JSON object (nil if it is not one).
func (f Frame) Map() map[string]any {
	if f.Op != ws.OpText {
		return nil
	}
	var m map[string]any
	if json.Unmarshal(f.Data, &m) != nil {
		return nil
	}
	return m
}

// Options tune a Client. The zero value is fine.
type Options struct {
	// OnFrame, when set, is called on the reader goroutine for every frame
	// instead of queueing it on Frames (which then stays empty).
	OnFrame func(Frame)
	// ReadTimeout ends a connection on which nothing arrives for this
	// long, so a hung test still ends; default 60s.
	ReadTimeout time.Duration
	// Buffer is the capacity of Frames; default 4096. A full buffer stalls
	// the reader, as a slow client would.
	Buffer int
	// NetDial, when set, opens the TCP connection (a chosen source
	// address, say).
	NetDial func(ctx context.Context, network, addr string) (net.Conn, error)
	// TLSConfig is the TLS client configuration of wss:// URLs (a proxy
	// in front of the node, with the test's own certificate authority).
	TLSConfig *tls.Config
}

// Client is one WebSocket connection to a node. Send, Close and the
// accessors may be called from any goroutine.
type Client struct {
	conn   net.Conn
	opt    Options
	frames chan Frame
	done   chan struct{}

	wmu sync.Mutex // serializes writes: Send, and the reader's pongs and close replies

	mu     sync.Mutex
	err    error // why the reader ended
	closes []int // close codes received, in order
}

// Dial connects to url (ws://host:port/path?query) within ctx and starts
// the reader.
func Dial(ctx context.Context, url string, opt Options) (*Client, error) {
	if opt.ReadTimeout <= 0 {
		opt.ReadTimeout = 60 * time.Second
	}
	if opt.Buffer <= 0 {
		opt.Buffer = 4096
	}
	conn, br, _, err := ws.Dialer{NetDial: opt.NetDial, TLSConfig: opt.TLSConfig}.Dial(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("cannot dial %s: %w", url, err)
	}
	if br == nil {
		br = bufio.NewReader(conn)
	}
	c := &Client{conn: conn, opt: opt, frames: make(chan Frame, opt.Buffer), done: make(chan struct{})}
	go c.read(br)
	return c, nil
}

// DialT is Dial for the test's own goroutine: it fails t on error, gives
// the dial 5s, and closes the client when t ends.
func DialT(t testing.TB, url string, opt Options) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, url, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// ReadFrame reads one server frame from rd, control frames included, for
// tests that read a connection themselves (no reader goroutine): a close
// frame comes with its code and reason; a masked frame is an error (a
// server never masks).
func ReadFrame(rd io.Reader) (Frame, error) {
	h, err := ws.ReadHeader(rd)
	if err != nil {
		return Frame{}, err
	}
	p := make([]byte, h.Length)
	if _, err := io.ReadFull(rd, p); err != nil {
		return Frame{}, err
	}
	if h.Masked {
		return Frame{}, errors.New("server frame is masked")
	}
	f := Frame{Op: h.OpCode, Size: ws.HeaderSize(h) + len(p), Data: p}
	if h.OpCode == ws.OpClose && len(p) >= 2 {
		f.Code = int(binary.BigEndian.Uint16(p))
		f.Reason = string(p[2:])
	}
	return f, nil
}

// ReadText reads from rd up to the next text frame and returns its
// payload, skipping other data and control frames; a close frame ends it
// with an error naming the close. Safe off the test's goroutine.
func ReadText(rd io.Reader) ([]byte, error) {
	for {
		f, err := ReadFrame(rd)
		if err != nil {
			return nil, err
		}
		switch f.Op {
		case ws.OpText:
			return f.Data, nil
		case ws.OpClose:
			return f.Data, fmt.Errorf("closed: %q", f.Data)
		}
	}
}

func (c *Client) read(rd *bufio.Reader) {
	defer close(c.done)
	defer close(c.frames)
	defer c.conn.Close()
	for {
		_ = c.conn.SetReadDeadline(time.Now().Add(c.opt.ReadTimeout))
		f, err := ReadFrame(rd)
		if err != nil {
			c.fail(err)
			return
		}
		p := f.Data
		switch f.Op {
		case ws.OpPing:
			c.wmu.Lock()
			_ = wsutil.WriteClientMessage(c.conn, ws.OpPong, p)
			c.wmu.Unlock()
			continue
		case ws.OpPong:
			continue
		case ws.OpClose:
			c.mu.Lock()
			c.closes = append(c.closes, f.Code)
			c.mu.Unlock()
			c.wmu.Lock()
			_ = wsutil.WriteClientMessage(c.conn, ws.OpClose, p[:min(len(p), 2)])
			c.wmu.Unlock()
			c.deliver(f)
			c.fail(fmt.Errorf("closed by server with %d %q", f.Code, f.Reason))
			return
		}
		c.deliver(f)
	}
}

func (c *Client) deliver(f Frame) {
	if c.opt.OnFrame != nil {
		c.opt.OnFrame(f)
		return
	}
	c.frames <- f
}

func (c *Client) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.mu.Unlock()
}

// Send writes one text frame, within 5s.
func (c *Client) Send(text string) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	return wsutil.WriteClientText(c.conn, []byte(text))
}

// Conn is the underlying connection, for tests that misbehave on purpose
// (half a frame, an abrupt close).
func (c *Client) Conn() net.Conn { return c.conn }

// Frames yields what arrived (without Options.OnFrame), in order; it is
// closed when the connection has ended.
func (c *Client) Frames() <-chan Frame { return c.frames }

// Done is closed when the connection has ended.
func (c *Client) Done() <-chan struct{} { return c.done }

// Dead reports whether the connection has ended.
func (c *Client) Dead() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// Err is why the connection ended (nil while it is up).
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// CloseCodes are the codes of the close frames received.
func (c *Client) CloseCodes() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int(nil), c.closes...)
}

// Close ends the connection and waits for the reader.
func (c *Client) Close() {
	_ = c.conn.Close()
	<-c.done
}

// Next returns the next frame, or an error when the connection ends or
// nothing arrives within d.
func (c *Client) Next(d time.Duration) (Frame, error) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case f, ok := <-c.frames:
		if !ok {
			return Frame{}, fmt.Errorf("connection ended: %v", c.Err())
		}
		return f, nil
	case <-timer.C:
		return Frame{}, fmt.Errorf("no frame within %s", d)
	}
}

// Expect returns the next frame, which must be a text frame whose JSON op
// is op, and its decoded object.
func (c *Client) Expect(op string, d time.Duration) (Frame, map[string]any, error) {
	f, err := c.Next(d)
	if err != nil {
		return f, nil, fmt.Errorf("waiting for %s: %w", op, err)
	}
	m := f.Map()
	if m["op"] != op {
		return f, m, fmt.Errorf("want %s, got opcode %v %q", op, f.Op, f.Data)
	}
	return f, m, nil
}

// Until polls f every 5ms until it returns nil, and returns its last error
// once deadline has passed. For goroutines other than the test's.
func Until(deadline time.Time, f func() error) error {
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// WaitFor polls f until it returns nil and fails tb with f's last error if
// that takes longer than d.
func WaitFor(tb testing.TB, d time.Duration, f func() error) {
	tb.Helper()
	if err := Until(time.Now().Add(d), f); err != nil {
		tb.Fatalf("after %s: %v", d, err)
	}
}
