package loop

import (
	"net"
	"net/netip"

	"github.com/roost-chat/roost/loop/realip"
	"github.com/roost-chat/roost/proto"
)

// A connection's client address behind a proxy. With --proxy-protocol the
// PROXY header that opens the connection names it; with --trusted-proxies
// a trusted peer's X-Forwarded-For (or X-Real-IP) on the request head
// does. Either way the address is settled once, at the request head, and
// only then counted against MaxConnsPerIP (OnOpen leaves a proxy's
// connections uncounted: they would all count as the proxy). Without
// either flag none of this runs: OnOpen counts the socket's peer as
// before and OnTraffic tests one bool.

var (
	errProxyHeader = &proto.HTTPError{Status: 400, Reason: "a PROXY protocol header was expected (the node runs with --proxy-protocol: connect through the proxy)"}
	errPerIP       = &proto.HTTPError{Status: 429, Reason: "too many connections from this address (--max-conns-per-ip)"}
)

// proxied reports whether a connection from ip may be a proxy's on behalf
// of someone else, and so is counted against MaxConnsPerIP later.
func (s *Server) proxied(ip netip.Addr) bool {
	return s.cfg.ProxyProtocol || s.cfg.TrustedProxies.Contains(ip)
}

// proxyHeader reads the PROXY header at the start of the connection. It
// reports whether the header is read (the request head may follow in the
// same buffer); false with the connection open means more bytes are
// awaited. A connection without a valid header is refused and counted.
// Loop only; parses the buffer in place, allocation-free.
func (c *conn) proxyHeader() bool {
	buf, _ := c.gc.Peek(-1)
	src, n, err := realip.ParseProxy(buf)
	if err != nil {
		c.l.srv.Stats.RefusedProxyHeader.Add(1)
		he := errProxyHeader
		if err != realip.ErrNotProxy {
			he = &proto.HTTPError{Status: 400, Reason: err.Error()}
		}
		c.refuse(he)
		return false
	}
	if n == 0 {
		return false // the rest of the header is on its way
	}
	_, _ = c.gc.Discard(n)
	c.ppRead = true
	if src.IsValid() {
		c.setPeer(src)
	}
	return true
}

func (c *conn) setPeer(a netip.AddrPort) {
	l := c.l
	if l.peers == nil {
		l.peers = make(map[*conn]netip.AddrPort)
	}
	l.peers[c] = a
}

// peer is who sent the connection's bytes: the client a PROXY header
// named, else the socket's peer.
func (c *conn) peer() netip.AddrPort {
	if a, ok := c.l.peers[c]; ok {
		return a
	}
	if ta, ok := c.gc.RemoteAddr().(*net.TCPAddr); ok {
		a, _ := netip.AddrFromSlice(ta.IP)
		return netip.AddrPortFrom(a.Unmap(), uint16(ta.Port))
	}
	return netip.AddrPort{}
}

// settleReal settles the client's address from the request head (a
// trusted proxy's forwarding headers) and counts it against
// MaxConnsPerIP. False: refused (too many from that address).
func (c *conn) settleReal(head []byte) bool {
	c.realSet = true
	s := c.l.srv
	peer := c.peer()
	if s.cfg.TrustedProxies.Any() {
		if a := s.cfg.TrustedProxies.FromHead(peer, head); a != peer {
			peer = a
			c.setPeer(a)
		}
	}
	if s.cfg.MaxConnsPerIP <= 0 || !peer.IsValid() {
		return true
	}
	if _, counted := c.l.ips[c]; counted {
		return true
	}
	ip := peer.Addr()
	if !s.admitIP(ip) {
		s.Stats.RefusedPerIP.Add(1)
		c.refuse(errPerIP)
		return false
	}
	if c.l.ips == nil {
		c.l.ips = make(map[*conn]netip.Addr)
	}
	c.l.ips[c] = ip
	return true
}

// clientAddr is the client's address as host:port (the host alone when a
// trusted proxy's X-Forwarded-For named no port), for the proxy hooks'
// backend and the logs.
func (c *conn) clientAddr() string {
	if a, ok := c.l.peers[c]; ok {
		return realip.HostPort(a)
	}
	if a := c.gc.RemoteAddr(); a != nil {
		return a.String()
	}
	return ""
}
