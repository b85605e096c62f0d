// Package hooknet is what a node's outgoing hook calls (webhooks, proxy
// hooks) may connect to. A hook URL is the app's, so it is checked where
// the connection is made, on the address the name resolved to (a DNS
// answer that changes after the URL was set does not get past it):
//
//   - link-local addresses (169.254.0.0/16, fe80::/10), where cloud
//     metadata services answer with the machine's credentials, are never
//     called;
//   - an address that reaches one of the node's own listeners (client,
//     server API, admin) is not either: a webhook aimed at the admin
//     listener would have run a CPU profile of the node on each POST. A
//     listener on 0.0.0.0 or :: owns the port on every local address.
//
// Loopback and private addresses stay allowed: a backend is often on the
// same host or network.
package hooknet

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/roost-chat/roost/proto"
)

// ErrRefused wraps every refusal, for errors.Is.
var ErrRefused = errors.New("hook address refused")

// Guard holds the node's own listeners. Any goroutine.
type Guard struct {
	mu     sync.RWMutex
	own    []listener
	locals []netip.Addr // the host's interface addresses, for wildcard listeners
	read   time.Time    // when locals was read
	logged map[string]bool
	log    *slog.Logger
}

type listener struct {
	what string // "admin", "api", "client"
	ap   netip.AddrPort
}

// Default is the process's guard: main adds the node's listeners, and the
// webhook and proxy dialers check with it.
var Default = &Guard{}

// SetLog sets where a refusal is logged (once per address and reason).
func (g *Guard) SetLog(l *slog.Logger) {
	g.mu.Lock()
	g.log = l
	g.mu.Unlock()
}

// Own records a listener of this node (what names it in errors: "admin")
// at addr, its bound host:port. The returned func removes it.
func (g *Guard) Own(what string, addr net.Addr) (remove func()) {
	ta, ok := addr.(*net.TCPAddr)
	if !ok {
		return func() {}
	}
	ip, _ := netip.AddrFromSlice(ta.IP)
	if !ip.IsValid() {
		ip = netip.IPv6Unspecified()
	}
	l := listener{what: what, ap: netip.AddrPortFrom(ip.Unmap(), uint16(ta.Port))}
	g.mu.Lock()
	g.own = append(g.own, l)
	g.mu.Unlock()
	return func() {
		g.mu.Lock()
		if i := slices.Index(g.own, l); i >= 0 {
			g.own = slices.Delete(g.own, i, i+1)
		}
		g.mu.Unlock()
	}
}

// Control is a net.Dialer's Control: it refuses address (ip:port, already
// resolved) when a hook may not call it.
func (g *Guard) Control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: %q is not an ip:port", ErrRefused, address)
	}
	ip := ap.Addr().Unmap()
	if ip.Is4() && ip.IsUnspecified() {
		ip = netip.AddrFrom4([4]byte{127, 0, 0, 1}) // what connecting to 0.0.0.0 reaches
	} else if ip.IsUnspecified() {
		ip = netip.IPv6Loopback()
	}
	if why := proto.ForbiddenHookAddr(ip); why != "" {
		return g.refuse(address, why)
	}
	if what := g.owner(netip.AddrPortFrom(ip, ap.Port())); what != "" {
		return g.refuse(address, "it reaches this node's own "+what+" listener")
	}
	return nil
}

// Dialer returns a dialer that checks with g.
func (g *Guard) Dialer() *net.Dialer {
	return &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Control: g.Control}
}

func (g *Guard) refuse(address, why string) error {
	err := fmt.Errorf("%w: %s: %s", ErrRefused, address, why)
	g.mu.Lock()
	first := !g.logged[address]
	if first {
		if g.logged == nil {
			g.logged = map[string]bool{}
		}
		if len(g.logged) < 1024 { // an app changing URLs at will costs no more
			g.logged[address] = true
		}
	}
	log := g.log
	g.mu.Unlock()
	if first && log != nil {
		log.Warn("hook call refused (counted as a failure; change the app's URL)", "addr", address, "why", why)
	}
	return err
}

// localsEvery is how often the interface addresses are read again.
const localsEvery = 5 * time.Second

// owner names the listener of this node that ap reaches, or "".
func (g *Guard) owner(ap netip.AddrPort) string {
	g.mu.RLock()
	own := g.own
	stale := time.Since(g.read) > localsEvery
	g.mu.RUnlock()
	wild := false
	for _, l := range own {
		if l.ap.Port() != ap.Port() {
			continue
		}
		if l.ap.Addr() == ap.Addr() {
			return l.what
		}
		wild = wild || l.ap.Addr().IsUnspecified()
	}
	if !wild {
		return ""
	}
	if stale {
		g.readLocals()
	}
	if ap.Addr().IsLoopback() || ap.Addr().IsUnspecified() || g.isLocal(ap.Addr()) {
		for _, l := range own {
			if l.ap.Port() == ap.Port() && l.ap.Addr().IsUnspecified() {
				return l.what
			}
		}
	}
	return ""
}

func (g *Guard) isLocal(ip netip.Addr) bool {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return slices.Contains(g.locals, ip)
}

func (g *Guard) readLocals() {
	var locals []netip.Addr
	if as, err := net.InterfaceAddrs(); err == nil {
		for _, a := range as {
			if p, err := netip.ParsePrefix(a.String()); err == nil {
				locals = append(locals, p.Addr().Unmap())
			}
		}
	}
	g.mu.Lock()
	g.locals, g.read = locals, time.Now()
	g.mu.Unlock()
}
