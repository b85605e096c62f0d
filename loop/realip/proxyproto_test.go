package realip

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// v2 builds a v2 header: command, family/protocol byte, address block and
// TLVs.
func v2(cmd, famProto byte, addrs []byte, tlvs []byte) []byte {
	b := append([]byte{}, sigV2...)
	b = append(b, 0x20|cmd, famProto)
	b = binary.BigEndian.AppendUint16(b, uint16(len(addrs)+len(tlvs)))
	b = append(b, addrs...)
	return append(b, tlvs...)
}

func v2inet(src, dst [4]byte, sport, dport uint16) []byte {
	b := append(src[:], dst[:]...)
	b = binary.BigEndian.AppendUint16(b, sport)
	return binary.BigEndian.AppendUint16(b, dport)
}

func v2inet6(src, dst netip.Addr, sport, dport uint16) []byte {
	s, d := src.As16(), dst.As16()
	b := append(s[:], d[:]...)
	b = binary.BigEndian.AppendUint16(b, sport)
	return binary.BigEndian.AppendUint16(b, dport)
}

// awsTLV is the VPC endpoint TLV (type 0xEA) AWS NLB appends to its v2
// headers, plus a NOOP one.
var awsTLV = []byte{0xEA, 0x00, 0x17, 0x01, 'v', 'p', 'c', 'e', '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'a', 'b', 'c', 'd', 'e', 'f', 0x04, 0x00, 0x02, 0, 0}

var parseCases = []struct {
	name string
	in   []byte
	src  string // "" with ok: the socket's peer stands
	err  error
}{
	{"v1 tcp4", []byte("PROXY TCP4 203.0.113.7 10.0.0.1 52114 8080\r\n"), "203.0.113.7:52114", nil},
	{"v1 tcp6", []byte("PROXY TCP6 2001:db8::7 2001:db8::1 52114 443\r\n"), "[2001:db8::7]:52114", nil},
	{"v1 tcp6 mapped", []byte("PROXY TCP6 ::ffff:203.0.113.7 ::1 1 2\r\n"), "203.0.113.7:1", nil},
	{"v1 unknown", []byte("PROXY UNKNOWN\r\n"), "", nil},
	{"v1 unknown with addresses", []byte("PROXY UNKNOWN ffff:f::f ffff:f::f 65535 65535\r\n"), "", nil},
	{"v1 longest", []byte("PROXY UNKNOWN " + strings.Repeat("f", 91) + "\r\n"), "", nil},
	{"v1 too long", []byte("PROXY UNKNOWN " + strings.Repeat("f", 92) + "\r\n"), "", ErrTooLong},
	{"v1 family mismatch", []byte("PROXY TCP4 2001:db8::7 10.0.0.1 1 2\r\n"), "", ErrMalformed},
	{"v1 tcp6 with v4", []byte("PROXY TCP6 10.0.0.7 10.0.0.1 1 2\r\n"), "", ErrMalformed},
	{"v1 bad port", []byte("PROXY TCP4 10.0.0.7 10.0.0.1 65536 2\r\n"), "", ErrMalformed},
	{"v1 leading zero port", []byte("PROXY TCP4 10.0.0.7 10.0.0.1 080 2\r\n"), "", ErrMalformed},
	{"v1 extra field", []byte("PROXY TCP4 10.0.0.7 10.0.0.1 1 2 3\r\n"), "", ErrMalformed},
	{"v1 missing field", []byte("PROXY TCP4 10.0.0.7 10.0.0.1 1\r\n"), "", ErrMalformed},
	{"v1 double space", []byte("PROXY TCP4  10.0.0.7 10.0.0.1 1 2\r\n"), "", ErrMalformed},
	{"v1 bare LF", []byte("PROXY TCP4 10.0.0.7 10.0.0.1 1 2\n"), "", ErrMalformed},
	{"v1 zone", []byte("PROXY TCP6 fe80::1%eth0 fe80::2 1 2\r\n"), "", ErrMalformed},
	{"v1 udp", []byte("PROXY UDP4 10.0.0.7 10.0.0.1 1 2\r\n"), "", ErrMalformed},
	{"http request", []byte("GET /ws HTTP/1.1\r\n\r\n"), "", ErrNotProxy},
	{"P but not PROXY", []byte("POST / HTTP/1.1\r\n"), "", ErrNotProxy},
	{"tls hello", []byte{0x16, 0x03, 0x01, 0x02, 0x00}, "", ErrNotProxy},
	{"v2 tcp4", v2(1, 0x11, v2inet([4]byte{203, 0, 113, 7}, [4]byte{10, 0, 0, 1}, 52114, 8080), nil), "203.0.113.7:52114", nil},
	{"v2 tcp4 aws tlv", v2(1, 0x11, v2inet([4]byte{198, 51, 100, 9}, [4]byte{10, 0, 0, 1}, 40000, 8080), awsTLV), "198.51.100.9:40000", nil},
	{"v2 tcp6", v2(1, 0x21, v2inet6(netip.MustParseAddr("2001:db8::7"), netip.MustParseAddr("2001:db8::1"), 1, 2), nil), "[2001:db8::7]:1", nil},
	{"v2 local", v2(0, 0x00, nil, nil), "", nil},
	{"v2 local with addresses", v2(0, 0x11, v2inet([4]byte{127, 0, 0, 1}, [4]byte{127, 0, 0, 1}, 1, 2), nil), "", nil},
	{"v2 unspec", v2(1, 0x00, nil, nil), "", nil},
	{"v2 unix", v2(1, 0x31, make([]byte, 216), nil), "", nil},
	{"v2 short inet", v2(1, 0x11, make([]byte, 11), nil), "", ErrMalformed},
	{"v2 short inet6", v2(1, 0x21, make([]byte, 35), nil), "", ErrMalformed},
	{"v2 bad version", append(append(append([]byte{}, sigV2...), 0x11, 0x11), 0, 12), "", ErrMalformed},
	{"v2 bad command", append(append(append([]byte{}, sigV2...), 0x22, 0x11), 0, 12), "", ErrMalformed},
	{"v2 bad family", append(append(append([]byte{}, sigV2...), 0x21, 0x41), 0, 12), "", ErrMalformed},
	{"v2 bad protocol", append(append(append([]byte{}, sigV2...), 0x21, 0x13), 0, 12), "", ErrMalformed},
	{"v2 too long", append(append(append([]byte{}, sigV2...), 0x21, 0x11), 0x10, 0x00), "", ErrTooLong},
	{"v2 bad signature", []byte("\r\n\r\n\x00\r\nQUIX\n\x21\x11\x00\x0c"), "", ErrNotProxy},
}

func TestParseProxy(t *testing.T) {
	for _, tc := range parseCases {
		t.Run(tc.name, func(t *testing.T) {
			src, n, err := ParseProxy(append(tc.in, "GET /ws"...))
			if !errors.Is(err, tc.err) {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
			if err != nil {
				if n != 0 || src.IsValid() {
					t.Fatalf("error with n %d src %v", n, src)
				}
				return
			}
			if n != len(tc.in) {
				t.Fatalf("n %d, want %d", n, len(tc.in))
			}
			if got := ""; src.IsValid() {
				if got = src.String(); got != tc.src {
					t.Fatalf("src %s, want %s", got, tc.src)
				}
			} else if tc.src != "" {
				t.Fatalf("no src, want %s", tc.src)
			}
		})
	}
}

// Every proper prefix of a valid header asks for more (it may be how the
// bytes arrive), and every prefix of an invalid one either asks for more
// or fails as the whole does: never a success.
func TestParseProxyPrefixes(t *testing.T) {
	for _, tc := range parseCases {
		for i := 0; i < len(tc.in); i++ {
			src, n, err := ParseProxy(tc.in[:i])
			if n != 0 || src.IsValid() {
				t.Fatalf("%s: prefix %d gave n %d src %v", tc.name, i, n, src)
			}
			if err != nil && (tc.err == nil || (err != tc.err && !(tc.err == ErrMalformed && err == ErrTooLong))) {
				t.Fatalf("%s: prefix %d failed with %v, the whole with %v", tc.name, i, err, tc.err)
			}
		}
	}
}

func TestParseProxyAllocs(t *testing.T) {
	hdrs := [][]byte{parseCases[0].in, parseCases[1].in, parseCases[20].in, parseCases[22].in}
	for _, h := range hdrs {
		if a := testing.AllocsPerRun(100, func() { _, _, _ = ParseProxy(h) }); a != 0 {
			t.Fatalf("%q: %v allocs per parse, want 0", h, a)
		}
	}
}

// FuzzParseProxy: any input, whole or split anywhere, parses to the same
// outcome, and a success consumes a header that parses alone.
func FuzzParseProxy(f *testing.F) {
	for _, tc := range parseCases {
		f.Add(tc.in, uint8(7))
	}
	f.Fuzz(func(t *testing.T, b []byte, split uint8) {
		src, n, err := ParseProxy(b)
		if n < 0 || n > len(b) || (err != nil && n != 0) || (n == 0 && src.IsValid()) {
			t.Fatalf("n %d src %v err %v for %d bytes", n, src, err, len(b))
		}
		if n > MaxV2 {
			t.Fatalf("n %d past MaxV2", n)
		}
		if n > 0 {
			src2, n2, err2 := ParseProxy(b[:n])
			if src2 != src || n2 != n || err2 != nil {
				t.Fatalf("the header alone: %v %d %v, with the rest: %v %d", src2, n2, err2, src, n)
			}
		}
		// A prefix never succeeds where the whole does not, and never
		// fails where the whole succeeds or waits.
		k := int(split) % (len(b) + 1)
		psrc, pn, perr := ParseProxy(b[:k])
		if pn > 0 && (pn != n || psrc != src) {
			t.Fatalf("prefix %d: %v %d, whole: %v %d %v", k, psrc, pn, src, n, err)
		}
		if perr != nil && err == nil {
			t.Fatalf("prefix %d fails (%v) where the whole does not", k, perr)
		}
	})
}
