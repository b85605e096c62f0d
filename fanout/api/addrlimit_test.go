package api

import (
	"net/netip"
	"testing"
	"time"
)

// An address gets its burst, then waits its rate; IPv6 addresses of one
// /64 share a bucket; a full table refuses new addresses until a sweep
// finds idle ones to forget.
func TestAddrLimiter(t *testing.T) {
	al := newAddrLimiter()
	now := time.Unix(1000, 0)
	a := netip.MustParseAddr("192.0.2.1")
	for i := 0; i < unauthBurst; i++ {
		if ok, _ := al.allow(a, now); !ok {
			t.Fatalf("request %d of the burst refused", i)
		}
	}
	ok, retry := al.allow(a, now)
	if ok || retry <= 0 || retry > time.Second/unauthRate+time.Millisecond {
		t.Fatalf("past the burst: ok=%v retry=%s, want refused for about 1/%d s", ok, retry, unauthRate)
	}
	if ok, _ := al.allow(netip.MustParseAddr("192.0.2.2"), now); !ok {
		t.Fatal("another address refused")
	}
	if ok, _ := al.allow(a, now.Add(time.Second/unauthRate)); !ok {
		t.Fatal("not allowed again after its rate's interval")
	}

	v6 := netip.MustParseAddr("2001:db8::1")
	for i := 0; i < unauthBurst; i++ {
		al.allow(v6, now)
	}
	if ok, _ := al.allow(netip.MustParseAddr("2001:db8::ffff:1"), now); ok {
		t.Fatal("another address of the same /64 has a bucket of its own")
	}
	if addrKey(netip.MustParseAddr("::ffff:192.0.2.1")) != a {
		t.Fatal("an IPv4-mapped address is counted apart from its IPv4 form")
	}

	full := newAddrLimiter()
	for i := 0; len(full.m) < unauthAddrs; i++ {
		full.allow(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), now)
	}
	if ok, _ := full.allow(netip.MustParseAddr("192.0.2.9"), now); ok {
		t.Fatal("a new address admitted past a full table of busy ones")
	}
	later := now.Add(unauthBurst * time.Second / unauthRate)
	if ok, _ := full.allow(netip.MustParseAddr("192.0.2.9"), later); !ok || len(full.m) != 1 {
		t.Fatalf("after the buckets refilled: ok=%v, %d addresses kept, want the idle ones forgotten", ok, len(full.m))
	}
}
