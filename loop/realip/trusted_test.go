package realip

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
)

func trusted(t *testing.T, s string) *Trusted {
	t.Helper()
	var tr Trusted
	if err := tr.Set(s); err != nil {
		t.Fatal(err)
	}
	return &tr
}

func TestTrustedSet(t *testing.T) {
	tr := trusted(t, " 10.0.0.0/8, 192.0.2.7,2001:db8::/32 ,::ffff:198.51.100.0/120")
	if got, want := tr.String(), "10.0.0.0/8,192.0.2.7/32,2001:db8::/32,198.51.100.0/24"; got != want {
		t.Fatalf("String %q, want %q", got, want)
	}
	for a, want := range map[string]bool{"10.1.2.3": true, "::ffff:10.1.2.3": true, "192.0.2.7": true, "192.0.2.8": false,
		"2001:db8::1": true, "2001:db9::1": false, "198.51.100.200": true, "11.0.0.1": false} {
		if tr.Contains(netip.MustParseAddr(a)) != want {
			t.Errorf("Contains(%s) = %v", a, !want)
		}
	}
	for _, bad := range []string{"10.0.0.0/33", "example.com", "fe80::1%eth0", "10.0.0.1/8/8"} {
		var tr Trusted
		if err := tr.Set(bad); err == nil {
			t.Errorf("Set(%q) accepted", bad)
		}
	}
	var none *Trusted
	if none.Any() || none.Contains(netip.MustParseAddr("10.0.0.1")) {
		t.Fatal("a nil Trusted trusts")
	}
}

const (
	proxyPeer = "10.0.0.5:40000"
	strangerP = "198.51.100.9:40000"
)

var headCases = []struct {
	name, peer string
	headers    []string
	want       string
}{
	{"untrusted peer ignores headers", strangerP, []string{"X-Forwarded-For: 203.0.113.7"}, strangerP},
	{"no header: the proxy", proxyPeer, nil, proxyPeer},
	{"one hop", proxyPeer, []string{"X-Forwarded-For: 203.0.113.7"}, "203.0.113.7"},
	{"client-sent spoof left of the real hop", proxyPeer, []string{"X-Forwarded-For: 1.2.3.4, 203.0.113.7"}, "203.0.113.7"},
	{"chain of trusted proxies", proxyPeer, []string{"X-Forwarded-For: 1.2.3.4, 203.0.113.7, 10.0.0.9,10.0.0.8"}, "203.0.113.7"},
	{"haproxy adds a line per hop", proxyPeer, []string{"X-Forwarded-For: 1.2.3.4", "Host: x", "x-forwarded-for: 203.0.113.7", "X-Forwarded-For: 10.0.0.9"}, "203.0.113.7"},
	{"all trusted: the left-most", proxyPeer, []string{"X-Forwarded-For: 10.0.0.7, 10.0.0.9"}, "10.0.0.7"},
	{"garbage ends at the last trusted hop", proxyPeer, []string{"X-Forwarded-For: 203.0.113.7, unknown, 10.0.0.9"}, "10.0.0.9"},
	{"with ports", proxyPeer, []string{"X-Forwarded-For: [2001:db8::7]:443, 203.0.113.7:5000"}, "203.0.113.7:5000"},
	{"ipv6", proxyPeer, []string{"X-Forwarded-For: 2001:db8::7"}, "2001:db8::7"},
	{"mapped", proxyPeer, []string{"X-Forwarded-For: ::ffff:203.0.113.7"}, "203.0.113.7"},
	{"empty entries", proxyPeer, []string{"X-Forwarded-For: , 203.0.113.7 ,, "}, "203.0.113.7"},
	{"x-real-ip", proxyPeer, []string{"X-Real-IP: 203.0.113.7"}, "203.0.113.7"},
	{"xff beats x-real-ip", proxyPeer, []string{"X-Real-IP: 1.2.3.4", "X-Forwarded-For: 203.0.113.7"}, "203.0.113.7"},
	{"bad x-real-ip: the proxy", proxyPeer, []string{"X-Real-IP: nonsense"}, proxyPeer},
}

func TestFromHeadAndHeader(t *testing.T) {
	tr := trusted(t, "10.0.0.0/8")
	for _, tc := range headCases {
		t.Run(tc.name, func(t *testing.T) {
			peer := netip.MustParseAddrPort(tc.peer)
			head := "GET /ws HTTP/1.1\r\nHost: x\r\n"
			h := http.Header{}
			for _, l := range tc.headers {
				head += l + "\r\n"
				k, v, _ := strings.Cut(l, ":")
				h.Add(k, strings.TrimSpace(v))
			}
			head += "\r\n"
			if got := HostPort(tr.FromHead(peer, []byte(head))); got != tc.want {
				t.Errorf("FromHead %s, want %s", got, tc.want)
			}
			if got := HostPort(tr.FromHeader(peer, h)); got != tc.want {
				t.Errorf("FromHeader %s, want %s", got, tc.want)
			}
		})
	}
}

func TestFromHeadAllocs(t *testing.T) {
	tr := trusted(t, "10.0.0.0/8")
	peer := netip.MustParseAddrPort(proxyPeer)
	head := []byte("GET /ws HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 1.2.3.4, [2001:db8::7]:443, 10.0.0.9\r\nX-Forwarded-For: 10.0.0.8\r\nX-Real-IP: 10.0.0.1\r\n\r\n")
	if a := testing.AllocsPerRun(100, func() { _ = tr.FromHead(peer, head) }); a != 0 {
		t.Fatalf("%v allocs per FromHead, want 0", a)
	}
}

func TestHandler(t *testing.T) {
	var seen string
	h := trusted(t, "10.0.0.0/8").Handler(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { seen = r.RemoteAddr }))
	for _, tc := range []struct{ peer, xff, want string }{
		{proxyPeer, "1.2.3.4, 203.0.113.7", "203.0.113.7:0"},
		{strangerP, "203.0.113.7", strangerP},
		{"[::ffff:10.0.0.5]:40000", "203.0.113.7:5000", "203.0.113.7:5000"},
		{proxyPeer, "2001:db8::7", "[2001:db8::7]:0"},
		{proxyPeer, "", proxyPeer},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = tc.peer
		if tc.xff != "" {
			r.Header.Set("X-Forwarded-For", tc.xff)
		}
		h.ServeHTTP(httptest.NewRecorder(), r)
		if seen != tc.want {
			t.Errorf("peer %s xff %q: RemoteAddr %s, want %s", tc.peer, tc.xff, seen, tc.want)
		}
	}
	next := http.NotFoundHandler()
	if got := (&Trusted{}).Handler(next); got == nil {
		t.Fatal("nil handler")
	}
}

// FuzzFromHead: any request head from a trusted peer gives the peer or an
// address a forwarding header names (unmapped, without a zone), never a
// panic; from an untrusted peer, always the peer.
func FuzzFromHead(f *testing.F) {
	for _, tc := range headCases {
		f.Add("GET / HTTP/1.1\r\n" + strings.Join(tc.headers, "\r\n") + "\r\n\r\n")
	}
	tr := &Trusted{}
	if err := tr.Set("10.0.0.0/8"); err != nil {
		f.Fatal(err)
	}
	peer := netip.MustParseAddrPort(proxyPeer)
	stranger := netip.MustParseAddrPort(strangerP)
	f.Fuzz(func(t *testing.T, head string) {
		if got := tr.FromHead(stranger, []byte(head)); got != stranger {
			t.Fatalf("untrusted peer became %v", got)
		}
		got := tr.FromHead(peer, []byte(head))
		if !got.IsValid() || got.Addr().Zone() != "" || got.Addr().Is4In6() {
			t.Fatalf("client %v from %q", got, head)
		}
		if got != peer && !strings.Contains(strings.ToLower(head), "x-forwarded-for") && !strings.Contains(strings.ToLower(head), "x-real-ip") {
			t.Fatalf("client %v without a forwarding header in %q", got, head)
		}
	})
}
