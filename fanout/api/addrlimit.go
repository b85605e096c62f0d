package api

import (
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/roost-chat/roost/fanout/tenancy"
)

// Requests without a valid secret, per client address: a backend with a
// wrong secret learns why within its first few calls, and a flood of them
// costs the node a 429 each, then nothing more than the kernel's work.
const (
	unauthRate  = 10 // per second
	unauthBurst = 20
	// unauthAddrs bounds the addresses remembered. Past it, with no idle
	// one to forget, a new address is refused as if over its rate: only
	// requests without a valid secret are ever counted here, so no app
	// loses anything by it.
	unauthAddrs = 16384
	// sweepEvery spaces the scans for idle addresses, so that a full table
	// does not cost a scan per request.
	sweepEvery = time.Second
)

// unauth is an address's bucket terms, the node's one limiter's
// (tenancy.Bucket) as for the apps' rates.
var unauth = tenancy.NewRate(unauthRate, unauthBurst)

// addrLimiter is the rate of requests without a valid secret, per client
// address (IPv6 per /64, what one host is usually given). Any goroutine.
type addrLimiter struct {
	mu        sync.Mutex
	m         map[netip.Addr]*tenancy.Bucket
	lastSweep time.Time
}

func newAddrLimiter() *addrLimiter {
	return &addrLimiter{m: map[netip.Addr]*tenancy.Bucket{}}
}

// addrKey is the address a request is counted under.
func addrKey(a netip.Addr) netip.Addr {
	a = a.Unmap()
	if a.Is6() {
		if p, err := a.Prefix(64); err == nil {
			return p.Addr()
		}
	}
	return a
}

// remoteAddr parses an http.Request's RemoteAddr (the zero Addr when it
// is not an IP:port).
func remoteAddr(s string) netip.Addr {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr()
	}
	host, _, err := net.SplitHostPort(s)
	if err != nil {
		return netip.Addr{}
	}
	a, _ := netip.ParseAddr(host)
	return a
}

// allow takes one request of addr; when refused, retry is how long until
// the next would be allowed.
func (al *addrLimiter) allow(addr netip.Addr, now time.Time) (ok bool, retry time.Duration) {
	key := addrKey(addr)
	al.mu.Lock()
	defer al.mu.Unlock()
	b := al.m[key]
	if b == nil {
		if len(al.m) >= unauthAddrs && now.Sub(al.lastSweep) >= sweepEvery {
			al.sweepLocked(now)
		}
		if len(al.m) >= unauthAddrs {
			return false, sweepEvery
		}
		b = new(tenancy.Bucket)
		al.m[key] = b
	}
	if wait := b.Take(now.UnixNano(), unauth); wait > 0 {
		return false, max(time.Duration(wait), time.Millisecond)
	}
	return true, 0
}

// sweepLocked forgets the addresses whose bucket is full again: they are
// as if never seen.
func (al *addrLimiter) sweepLocked(now time.Time) {
	al.lastSweep = now
	for k, b := range al.m {
		if b.Full(now.UnixNano()) {
			delete(al.m, k)
		}
	}
}
