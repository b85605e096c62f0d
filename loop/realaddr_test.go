package loop

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/roost-chat/roost/proto"
)

// addrConn is a memConn with a socket peer address.
type addrConn struct {
	memConn
	ra net.Addr
}

func (c *addrConn) RemoteAddr() net.Addr { return c.ra }

// dial opens a connection from peer and sends in, step bytes per read.
func dial(s *Server, el *memLoop, peer string, in string, step int) *addrConn {
	gc := &addrConn{memConn: memConn{el: el}, ra: net.TCPAddrFromAddrPort(mustAddrPort(peer))}
	if _, act := s.OnOpen(gc); act != 0 {
		gc.closed = true
		return gc
	}
	for i := 0; i < len(in) && !gc.closed; i += step {
		gc.in = append(gc.in, in[i:min(i+step, len(in))]...)
		s.OnTraffic(gc)
	}
	return gc
}

func clientOf(gc *addrConn) string {
	c, _ := gc.ctx.(*conn)
	if c == nil {
		return ""
	}
	return c.clientAddr()
}

func upgraded(gc *addrConn) bool {
	return !gc.closed && bytes.HasPrefix(gc.out, []byte("HTTP/1.1 101 "))
}

func TestProxyProtocolNamesTheClient(t *testing.T) {
	s, el := memNode(t, func(c *Config) { c.ProxyProtocol = true; c.MaxConnsPerIP = 1 })
	v1 := "PROXY TCP4 203.0.113.7 10.0.0.1 52114 8080\r\n"
	v2h := string(v2Header([4]byte{198, 51, 100, 9}, 40000))
	for _, step := range []int{1, 5, 1000} {
		s, el := memNode(t, func(c *Config) { c.ProxyProtocol = true })
		gc := dial(s, el, "127.0.0.1:9000", v1+fuzzUpgrade, step)
		if !upgraded(gc) || clientOf(gc) != "203.0.113.7:52114" {
			t.Fatalf("v1 in %d-byte reads: upgraded %v, client %q, out %q", step, upgraded(gc), clientOf(gc), gc.out)
		}
		gc = dial(s, el, "127.0.0.1:9001", v2h+fuzzUpgrade, step)
		if !upgraded(gc) || clientOf(gc) != "198.51.100.9:40000" {
			t.Fatalf("v2 in %d-byte reads: upgraded %v, client %q, out %q", step, upgraded(gc), clientOf(gc), gc.out)
		}
	}
	// The per-address cap counts clients, not the proxy: a second
	// connection of one client is refused, another client's is not.
	a := dial(s, el, "127.0.0.1:9000", v1+fuzzUpgrade, 1000)
	b := dial(s, el, "127.0.0.1:9001", v1+fuzzUpgrade, 1000)
	other := dial(s, el, "127.0.0.1:9002", v2h+fuzzUpgrade, 1000)
	if !upgraded(a) || upgraded(b) || !upgraded(other) {
		t.Fatalf("per-ip: first %v second %v other client %v", upgraded(a), upgraded(b), upgraded(other))
	}
	if !strings.Contains(string(b.out), "429") || s.Stats.RefusedPerIP.Load() != 1 {
		t.Fatalf("second connection of a client: %q, refused per ip %d", b.out, s.Stats.RefusedPerIP.Load())
	}
	s.OnClose(a, nil)
	if c := dial(s, el, "127.0.0.1:9003", v1+fuzzUpgrade, 1000); !upgraded(c) {
		t.Fatalf("after the first closed, the client's next connection was refused: %q", c.out)
	}
	// LOCAL (a health check of the proxy's own): the socket's peer stands.
	local := dial(s, el, "127.0.0.1:9004", "PROXY UNKNOWN\r\n"+fuzzUpgrade, 1000)
	if !upgraded(local) || clientOf(local) != "127.0.0.1:9004" {
		t.Fatalf("UNKNOWN: upgraded %v client %q", upgraded(local), clientOf(local))
	}
}

func TestProxyProtocolRefusesWithoutHeader(t *testing.T) {
	s, el := memNode(t, func(c *Config) { c.ProxyProtocol = true })
	for i, in := range []string{
		fuzzUpgrade, // straight to the node, past the proxy
		"PROXY TCP4 203.0.113.7 10.0.0.1 52114\r\n" + fuzzUpgrade,
		"PROXY TCP4 " + strings.Repeat("1", 200),
		"\r\n\r\n\x00\r\nQUIT\n\x21\x11\xff\xff",
	} {
		gc := dial(s, el, "127.0.0.1:9000", in, 3)
		if !gc.closed || !bytes.HasPrefix(gc.out, []byte("HTTP/1.1 400 ")) {
			t.Fatalf("input %d: closed %v, out %q", i, gc.closed, gc.out)
		}
		if got := s.Stats.RefusedProxyHeader.Load(); got != uint64(i+1) {
			t.Fatalf("input %d: refused_proxy_header %d", i, got)
		}
		s.OnClose(gc, nil)
	}
	// A partial header waits.
	gc := dial(s, el, "127.0.0.1:9000", "PROXY TCP4 203.0.113.7", 1)
	if gc.closed || len(gc.out) != 0 {
		t.Fatalf("partial header: closed %v out %q", gc.closed, gc.out)
	}
}

func TestTrustedProxiesXFF(t *testing.T) {
	s, el := memNode(t, func(c *Config) {
		if err := c.TrustedProxies.Set("10.0.0.0/8"); err != nil {
			t.Fatal(err)
		}
		c.MaxConnsPerIP = 1
	})
	up := strings.Replace(fuzzUpgrade, "Host: x\r\n", "Host: x\r\nX-Forwarded-For: 1.2.3.4, 203.0.113.7\r\n", 1)
	gc := dial(s, el, "10.0.0.5:9000", up, 7)
	if !upgraded(gc) || clientOf(gc) != "203.0.113.7" {
		t.Fatalf("trusted peer: upgraded %v client %q", upgraded(gc), clientOf(gc))
	}
	// Two connections through the proxy from two clients: both in.
	up2 := strings.Replace(up, "203.0.113.7", "203.0.113.8", 1)
	if gc := dial(s, el, "10.0.0.5:9001", up2, 1000); !upgraded(gc) {
		t.Fatalf("second client through the proxy refused: %q", gc.out)
	}
	// An untrusted peer's header is ignored: it is the client.
	gc = dial(s, el, "198.51.100.9:9000", up, 1000)
	if !upgraded(gc) || clientOf(gc) != "198.51.100.9:9000" {
		t.Fatalf("untrusted peer: upgraded %v client %q", upgraded(gc), clientOf(gc))
	}
}

// Without the flags nothing changes: no peer map, the socket's peer.
func TestRealAddrOffCostsNothing(t *testing.T) {
	s, el := memNode(t, func(c *Config) {})
	gc := dial(s, el, "10.0.0.5:9000", strings.Replace(fuzzUpgrade, "Host: x\r\n", "Host: x\r\nX-Forwarded-For: 1.2.3.4\r\n", 1), 1000)
	if !upgraded(gc) || clientOf(gc) != "10.0.0.5:9000" || s.loops[0].Load().peers != nil || s.realLater {
		t.Fatalf("upgraded %v client %q", upgraded(gc), clientOf(gc))
	}
}

func mustAddrPort(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// v2Header is a PROXY v2 header for a TCP4 client.
func v2Header(src [4]byte, port uint16) []byte {
	b := []byte("\r\n\r\n\x00\r\nQUIT\n\x21\x11\x00\x0c")
	b = append(b, src[:]...)
	b = append(b, 10, 0, 0, 1)
	b = binary.BigEndian.AppendUint16(b, port)
	return binary.BigEndian.AppendUint16(b, 8080)
}

// The PROXY header costs the upgrade no allocation: a connection opened,
// upgraded through a v2 header and closed allocates what one without the
// flag does (once the loop's peer map has its size).
func TestProxyHeaderAddsNoAllocation(t *testing.T) {
	cycle := func(proxyProtocol bool) float64 {
		s, el := memNode(t, func(c *Config) { c.ProxyProtocol = proxyProtocol })
		in := fuzzUpgrade
		if proxyProtocol {
			in = string(v2Header([4]byte{198, 51, 100, 9}, 40000)) + in
		}
		gc := &addrConn{memConn: memConn{el: el, out: make([]byte, 0, 4096), in: make([]byte, 0, 4096)}, ra: net.TCPAddrFromAddrPort(mustAddrPort("127.0.0.1:9000"))}
		run := func() {
			gc.in, gc.out, gc.closed = append(gc.in[:0], in...), gc.out[:0], false
			s.OnOpen(gc)
			s.OnTraffic(gc)
			if !upgraded(gc) {
				t.Fatalf("not upgraded: %q", gc.out)
			}
			s.OnClose(gc, nil)
		}
		for range 10 {
			run()
		}
		return testing.AllocsPerRun(200, run)
	}
	without, with := cycle(false), cycle(true)
	t.Logf("allocs per connection: %v without, %v with --proxy-protocol", without, with)
	if with > without {
		t.Fatalf("open+upgrade+close allocates %v with --proxy-protocol, %v without", with, without)
	}
}

// The proxy hooks' client field is the client a proxy names, on a real
// socket: the PROXY header (written by the dialer before the upgrade) and
// a trusted peer's X-Forwarded-For.
func TestProxyHooksSeeTheClient(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		dialer ws.Dialer
		want   string
	}{
		{"proxy protocol", func(c *Config) { c.ProxyProtocol = true }, ws.Dialer{
			NetDial: func(ctx context.Context, network, addr string) (net.Conn, error) {
				conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
				if err == nil {
					_, err = conn.Write([]byte("PROXY TCP4 203.0.113.7 10.0.0.1 52114 8080\r\n"))
				}
				return conn, err
			}}, "203.0.113.7:52114"},
		{"x-forwarded-for", func(c *Config) { _ = c.TrustedProxies.Set("127.0.0.0/8") }, ws.Dialer{
			Header: ws.HandshakeHeaderHTTP(http.Header{"X-Forwarded-For": {"198.51.100.1, 203.0.113.8"}})}, "203.0.113.8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBackend(t, allow)
			n := secureNode(t, tc.mutate, proxied("a", proto.Proxy{Connect: b.srv.URL + "/connect", Publish: b.srv.URL + "/publish"}))
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			conn, br, _, err := tc.dialer.Dial(ctx, "ws://"+n.addr+"/ws?token="+tok(secretA, "a", "alice", time.Now().Add(time.Hour)))
			if err != nil {
				t.Fatal(err)
			}
			if br == nil {
				br = bufio.NewReader(conn)
			}
			c := &client{t: t, conn: conn, rd: br}
			t.Cleanup(func() { conn.Close() })
			c.send(`{"op":"pub","room":"r","id":"p1","body":1}`)
			if m := c.expectAnswer("p1"); m["op"] != "ack" {
				t.Fatalf("publish: %v", m)
			}
			calls := b.calls()
			if len(calls) != 2 {
				t.Fatalf("backend saw %v", calls)
			}
			for _, call := range calls {
				if call["client"] != tc.want {
					t.Errorf("%s call: client %v, want %s", call["type"], call["client"], tc.want)
				}
			}
		})
	}
}
