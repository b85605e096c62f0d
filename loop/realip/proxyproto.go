// Package realip finds the address a connection really comes from when a
// proxy or load balancer stands in front of the node: the PROXY protocol
// header (v1 text and v2 binary, as HAProxy, nginx and AWS NLB send it) at
// the start of a TCP connection, and X-Forwarded-For / X-Real-IP on an HTTP
// request whose peer is a trusted proxy. It owns no state and imports
// nothing of the module: the client listener's event loops call it on
// bytes they peek, the server API listener through Handler.
package realip

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"unsafe"
)

// The PROXY protocol parser is written here rather than taken from
// github.com/pires/go-proxyproto (the well-kept Go implementation) because
// that library reads the header through a blocking *bufio.Reader wrapped
// around a net.Conn, allocates a Header and a copy of the TLVs per
// connection, and treats a short read as an error. The client listener is a
// gnet event loop: no net.Conn, no goroutine per connection, and a header
// may arrive in pieces across OnTraffic calls. ParseProxy therefore works
// on whatever bytes are buffered, answers "need more" on a prefix, and
// allocates nothing. Its checks follow the specification (haproxy's
// doc/proxy-protocol.txt) and go-proxyproto's: v1 lines of at most 107
// bytes ending in CRLF, TCP4/TCP6/UNKNOWN, the family matching the
// addresses; v2's signature, version 2, command LOCAL or PROXY, a known
// family and protocol, and a length that covers the family's addresses.

// Errors of ParseProxy. Each means the connection cannot be believed and
// must be closed.
var (
	ErrNotProxy  = errors.New("connection does not start with a PROXY protocol header")
	ErrMalformed = errors.New("malformed PROXY protocol header")
	ErrTooLong   = errors.New("PROXY protocol header too long")
)

const (
	// maxV1 is the longest v1 line the specification allows, CRLF
	// included ("PROXY UNKNOWN" with two IPv6 addresses and ports).
	maxV1 = 107
	// MaxV2 bounds a v2 header, addresses and TLVs included. The
	// specification allows 16+65535 bytes; what proxies send is a few
	// hundred at most (HAProxy's SSL TLVs, AWS NLB's VPC endpoint TLV,
	// GCP's and Azure's link ids), so more is refused rather than held
	// in the loop's buffer.
	MaxV2 = 4096
)

// sigV2 starts every v2 header; it cannot start an HTTP request.
var sigV2 = []byte("\r\n\r\n\x00\r\nQUIT\n")

// ParseProxy parses the PROXY protocol header at the start of b, which may
// be any prefix of what the peer sent. It returns n=0 and no error while b
// is a valid prefix of a header, then the header's length and the source
// address it names. An invalid source address (and n > 0) means the proxy
// speaks for itself (v2 LOCAL, v1 UNKNOWN, an unspecified or Unix family:
// health checks and the like): the socket's peer stands. Bytes after the
// header are not looked at. Allocation-free.
func ParseProxy(b []byte) (src netip.AddrPort, n int, err error) {
	if len(b) == 0 {
		return src, 0, nil
	}
	switch b[0] {
	case 'P':
		return parseV1(b)
	case '\r':
		return parseV2(b)
	}
	return src, 0, ErrNotProxy
}

func parseV1(b []byte) (src netip.AddrPort, n int, err error) {
	const prefix = "PROXY "
	if k := min(len(b), len(prefix)); string(b[:k]) != prefix[:k] {
		return src, 0, ErrNotProxy
	}
	eol := bytes.IndexByte(b[:min(len(b), maxV1)], '\n')
	if eol < 0 {
		if len(b) >= maxV1 {
			return src, 0, ErrTooLong
		}
		return src, 0, nil
	}
	if eol == 0 || b[eol-1] != '\r' {
		return src, 0, ErrMalformed
	}
	n = eol + 1
	line := b[len(prefix) : eol-1]
	fam, rest, _ := bytes.Cut(line, []byte{' '})
	switch string(fam) {
	case "UNKNOWN":
		// The rest of the line is to be ignored (the specification).
		return src, n, nil
	case "TCP4", "TCP6":
	default:
		return src, 0, ErrMalformed
	}
	var f [4][]byte
	for i := range f {
		var ok bool
		f[i], rest, ok = bytes.Cut(rest, []byte{' '})
		if ok != (i < 3) || len(f[i]) == 0 {
			return src, 0, ErrMalformed
		}
	}
	s, err1 := parseAddr(f[0])
	d, err2 := parseAddr(f[1])
	sp, ok1 := port(f[2])
	_, ok2 := port(f[3])
	if err1 != nil || err2 != nil || !ok1 || !ok2 || s.Zone() != "" || d.Zone() != "" {
		return src, 0, ErrMalformed
	}
	if want4 := fam[3] == '4'; s.Is4() != want4 || d.Is4() != want4 {
		return src, 0, ErrMalformed
	}
	return netip.AddrPortFrom(s.Unmap(), sp), n, nil
}

func parseV2(b []byte) (src netip.AddrPort, n int, err error) {
	if k := min(len(b), len(sigV2)); !bytes.Equal(b[:k], sigV2[:k]) {
		return src, 0, ErrNotProxy
	}
	if len(b) < 16 {
		return src, 0, nil
	}
	verCmd, famProto := b[12], b[13]
	if verCmd>>4 != 2 || verCmd&0xf > 1 || famProto>>4 > 3 || famProto&0xf > 2 {
		return src, 0, ErrMalformed
	}
	n = 16 + int(binary.BigEndian.Uint16(b[14:16]))
	if n > MaxV2 {
		return src, 0, ErrTooLong
	}
	body := n - 16
	switch famProto >> 4 {
	case 1:
		if body < 12 {
			return src, 0, ErrMalformed
		}
	case 2:
		if body < 36 {
			return src, 0, ErrMalformed
		}
	case 3:
		if body < 216 {
			return src, 0, ErrMalformed
		}
	}
	if len(b) < n {
		return src, 0, nil
	}
	if verCmd&0xf == 0 {
		return src, n, nil // LOCAL: the proxy's own connection
	}
	switch famProto >> 4 {
	case 1:
		a := netip.AddrFrom4([4]byte(b[16:20]))
		return netip.AddrPortFrom(a, binary.BigEndian.Uint16(b[24:26])), n, nil
	case 2:
		a := netip.AddrFrom16([16]byte(b[16:32])).Unmap()
		return netip.AddrPortFrom(a, binary.BigEndian.Uint16(b[48:50])), n, nil
	}
	return src, n, nil // unspecified or Unix: no address to believe
}

// parseAddr parses an IP address in b without copying it: of the string
// it parses netip keeps only an IPv6 zone (cloned, and refused by the
// callers) and, on failure, an error that the callers drop at once.
func parseAddr(b []byte) (netip.Addr, error) {
	if len(b) == 0 {
		return netip.Addr{}, errors.New("empty address")
	}
	return netip.ParseAddr(unsafeString(b))
}

// unsafeString is b as a string sharing its bytes, for parsers that keep
// nothing of it; b must not be empty.
func unsafeString(b []byte) string { return unsafe.String(&b[0], len(b)) }

// port parses a decimal TCP port of at most five digits.
func port(b []byte) (uint16, bool) {
	if len(b) == 0 || len(b) > 5 || (len(b) > 1 && b[0] == '0') {
		return 0, false
	}
	v := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int(c-'0')
	}
	return uint16(v), v <= 65535
}
