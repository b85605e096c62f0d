package realip

import (
	"bytes"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
)

// Trusted is the set of proxies whose forwarding headers are believed
// (--trusted-proxies). The zero value trusts nobody. It implements
// flag.Value: "10.0.0.0/8,192.0.2.7" (a bare address is one host).
// Set before the node starts; read-only afterwards, from any goroutine.
type Trusted struct {
	nets []netip.Prefix
}

// Set parses a comma-separated list of CIDRs or addresses.
func (t *Trusted) Set(s string) error {
	t.nets = nil
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			a, err2 := netip.ParseAddr(f)
			if err2 != nil || a.Zone() != "" {
				return fmt.Errorf("%q is neither a CIDR (10.0.0.0/8) nor an address", f)
			}
			p = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		}
		if p.Addr().Is4In6() {
			p = netip.PrefixFrom(p.Addr().Unmap(), max(p.Bits()-96, 0))
		}
		t.nets = append(t.nets, p.Masked())
	}
	return nil
}

func (t *Trusted) String() string {
	if t == nil {
		return ""
	}
	s := make([]string, len(t.nets))
	for i, p := range t.nets {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

// Any reports whether any proxy is trusted.
func (t *Trusted) Any() bool { return t != nil && len(t.nets) > 0 }

// Contains reports whether a is a trusted proxy's address. A handful of
// prefixes is the expected size: a linear walk beats any tree.
func (t *Trusted) Contains(a netip.Addr) bool {
	if t == nil {
		return false
	}
	a = a.Unmap()
	for _, p := range t.nets {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// walk finds the client in a forwarding chain read from its right end:
// each trusted proxy appended the address it got the request from, so the
// right-most address that is not a trusted proxy's is the client, and
// everything left of it is whatever the client chose to send. An entry
// that is not an address ends the walk at the last trusted hop (nothing
// left of it can be vouched for).
type walk struct {
	t      *Trusted
	client netip.AddrPort // the last hop believed so far
	done   bool
	seen   bool // an X-Forwarded-For value was read
}

// list walks one X-Forwarded-For value, right to left.
func list[S ~string | ~[]byte](w *walk, v S) {
	w.seen = true
	for end := len(v); end >= 0 && !w.done; {
		start := 0
		for i := end - 1; i >= 0; i-- {
			if v[i] == ',' {
				start = i + 1
				break
			}
		}
		e := trimSpace(v[start:end])
		end = start - 1
		if len(e) == 0 {
			continue
		}
		a, ok := hop(e)
		if !ok {
			w.done = true
			return
		}
		w.client = a
		w.done = !w.t.Contains(a.Addr())
	}
}

// hop parses an X-Forwarded-For entry: an address, or address:port
// ([v6]:port). Allocation-free for the []byte of a request head.
func hop[S ~string | ~[]byte](e S) (netip.AddrPort, bool) {
	b := []byte(e) // S is a []byte in the loop (no copy), a string from net/http (the one that copies)
	if len(b) == 0 {
		return netip.AddrPort{}, false
	}
	// Pick the parser by shape: a failed parse allocates its error.
	if b[0] == '[' || bytes.Count(b, []byte{':'}) == 1 {
		ap, err := netip.ParseAddrPort(unsafeString(b))
		if err != nil || ap.Addr().Zone() != "" {
			return netip.AddrPort{}, false
		}
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), true
	}
	a, err := parseAddr(b)
	if err != nil || a.Zone() != "" {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(a.Unmap(), 0), true
}

func trimSpace[S ~string | ~[]byte](s S) S {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

// FromHead returns the client of an HTTP request head (request line to
// the empty line, as parsed from the connection) whose sender is peer:
// peer itself unless peer is trusted, else from X-Forwarded-For (the
// right-most untrusted hop over every such header line, read bottom up)
// or, without one, X-Real-IP. Its port is 0 when the header named none.
// Allocation-free; the event loops call it once per request.
func (t *Trusted) FromHead(peer netip.AddrPort, head []byte) netip.AddrPort {
	if !t.Contains(peer.Addr()) {
		return peer
	}
	w := walk{t: t, client: peer}
	var realIP []byte
	end := len(head)
	for end > 0 && (head[end-1] == '\n' || head[end-1] == '\r') {
		end--
	}
	for !w.done {
		i := bytes.LastIndex(head[:end], []byte("\r\n"))
		if i < 0 {
			break // the request line
		}
		line := head[i+2 : end]
		end = i
		name, val, ok := bytes.Cut(line, []byte{':'})
		if !ok {
			continue
		}
		switch {
		case bytes.EqualFold(name, []byte("X-Forwarded-For")):
			list(&w, val)
		case realIP == nil && bytes.EqualFold(name, []byte("X-Real-IP")):
			realIP = trimSpace(val)
		}
	}
	return w.result(realIP)
}

// FromHeader is FromHead for a net/http request's headers.
func (t *Trusted) FromHeader(peer netip.AddrPort, h http.Header) netip.AddrPort {
	if !t.Contains(peer.Addr()) {
		return peer
	}
	w := walk{t: t, client: peer}
	xff := h.Values("X-Forwarded-For")
	for i := len(xff) - 1; i >= 0 && !w.done; i-- {
		list(&w, xff[i])
	}
	return w.result([]byte(h.Get("X-Real-IP")))
}

// result: X-Real-IP counts only when there was no X-Forwarded-For (a proxy
// that sets both sets the same client; one that sets only X-Real-IP, as
// nginx's common configuration does, overwrites it).
func (w *walk) result(realIP []byte) netip.AddrPort {
	if !w.seen && len(realIP) > 0 {
		if a, ok := hop(realIP); ok {
			return a
		}
	}
	return w.client
}

// Handler rewrites r.RemoteAddr to the client a trusted proxy names, so
// that what comes after it (limits, logs, the loopback check of
// development mode) sees the client, not the proxy. RemoteAddr keeps
// net/http's IP:port form, port 0 when the header named none, so that
// code splitting it goes on working. With no trusted proxy it returns
// next itself.
func (t *Trusted) Handler(next http.Handler) http.Handler {
	if !t.Any() {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if peer, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
			peer = netip.AddrPortFrom(peer.Addr().Unmap(), peer.Port())
			if c := t.FromHeader(peer, r.Header); c != peer {
				r.RemoteAddr = c.String()
			}
		}
		next.ServeHTTP(w, r)
	})
}

// HostPort formats a client address as host:port, or as the host alone
// when its port is unknown (X-Forwarded-For names none).
func HostPort(a netip.AddrPort) string {
	if a.Port() == 0 {
		return a.Addr().String()
	}
	return a.String()
}
