package api

import (
	"context"
	"log"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/roost-chat/roost/fanout/api/httpedge"
	"github.com/roost-chat/roost/proto"
)

// Edge is the API listener's budget: who may hold its connections and
// for how long.
type Edge struct {
	// MaxConns is the connections of all apps held at once on this node
	// (a connection is an app's from its first request with a valid
	// secret). As many again may wait for their first answer, half of them
	// from one client address; past that the oldest of those that have
	// sent nothing yet gives way (of that address first).
	MaxConns int
	// AppMaxConns is the connections one app may hold on this node. At
	// most half of MaxConns, so that one app never holds the node's all.
	AppMaxConns int
	// AppInFlight is the requests of one app being answered at once on
	// this node.
	AppInFlight int
}

// Default budgets: a backend keeps a few keep-alive connections per node;
// a deployment's backends together far fewer than the node-wide ceiling.
const (
	DefaultMaxConns    = 256
	DefaultAppMaxConns = 64
	DefaultAppInFlight = 64
)

// Timeouts of the API listener, sized for backends on the same network:
// a request head comes at once, and a pooled connection that has been
// quiet this long is reopened for little.
const (
	HeaderTimeout = 5 * time.Second
	IdleTimeout   = 30 * time.Second
	bodyTimeout   = 30 * time.Second
)

// EdgeStats are the API listener's counters.
type EdgeStats struct {
	Unauthenticated atomic.Uint64 // requests refused for their secret (or its absence), 401 or 429
	AddrLimited     atomic.Uint64 // of those, refused 429 by the per-address rate
	AppConnsFull    atomic.Uint64 // connections refused: their app held its --api-app-max-conns
	NodeConnsFull   atomic.Uint64 // connections refused: all apps together held --api-max-conns
	AppInFlightFull atomic.Uint64 // requests refused: their app had --api-app-inflight in flight
	Bound           atomic.Int64  // connections held by apps now
}

// budget is one app's share of the listener. Kept by id, beyond the
// registry's changes: a connection bound to it gives its place back here.
type budget struct {
	conns    atomic.Int64
	inflight atomic.Int64
}

// edge is the Server's part that budgets connections.
type edge struct {
	cfg   Edge
	addrs *addrLimiter

	mu      sync.Mutex
	budgets map[string]*budget
	ln      *httpedge.Listener // nil until NewHTTPServer
}

// connInfo is one connection's state, in the context of each of its
// requests. net/http serves one request of an HTTP/1.1 connection at a
// time, so only that request's goroutine touches it.
type connInfo struct {
	c     *httpedge.Conn
	bound bool    // held by an app's budget
	busy  *budget // whose in-flight slot the running request holds
}

type connKey struct{}

func (e *edge) init(cfg Edge) {
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.AppMaxConns <= 0 {
		cfg.AppMaxConns = DefaultAppMaxConns
	}
	if cfg.AppInFlight <= 0 {
		cfg.AppInFlight = DefaultAppInFlight
	}
	e.cfg = cfg
	e.addrs = newAddrLimiter()
	e.budgets = map[string]*budget{}
}

func (e *edge) budget(app string) *budget {
	e.mu.Lock()
	defer e.mu.Unlock()
	b := e.budgets[app]
	if b == nil {
		b = &budget{}
		e.budgets[app] = b
	}
	return b
}

// busyAnswer is what a connection gets when every one waiting for its
// first answer is being answered: the listener's ceiling, with no wait.
var busyAnswer = func() []byte {
	body := `{"error":{"code":"overloaded","message":"server API connections of this node are all busy: retry","retry_after":1000}}` + "\n"
	return []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}()

// NewHTTPServer wraps ln with the API's connection budget and returns the
// http.Server to serve it with: server.Serve(listener).
func (s *Server) NewHTTPServer(ln net.Listener, errLog *log.Logger) (*http.Server, net.Listener) {
	el := httpedge.New(ln, httpedge.Config{Max: s.edge.cfg.MaxConns, PerAddr: s.edge.cfg.MaxConns / 2, Busy: busyAnswer})
	s.edge.mu.Lock()
	s.edge.ln = el
	s.edge.mu.Unlock()
	hs := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: HeaderTimeout,
		ReadTimeout:       bodyTimeout,
		WriteTimeout:      bodyTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          errLog,
		ConnState:         el.ConnState,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			ec, _ := c.(*httpedge.Conn)
			return context.WithValue(ctx, connKey{}, &connInfo{c: ec})
		},
	}
	return hs, el
}

// ListenerStats are the counters of the listener of NewHTTPServer (nil
// before it).
func (s *Server) ListenerStats() *httpedge.Stats {
	s.edge.mu.Lock()
	defer s.edge.mu.Unlock()
	if s.edge.ln == nil {
		return nil
	}
	return &s.edge.ln.Stats
}

// AppBudgets calls f with each app's connections held and requests in
// flight on this node (apps that never held one are not listed).
func (s *Server) AppBudgets(f func(app string, conns, inflight int64)) {
	s.edge.mu.Lock()
	type row struct {
		app string
		b   *budget
	}
	rows := make([]row, 0, len(s.edge.budgets))
	for app, b := range s.edge.budgets {
		rows = append(rows, row{app, b})
	}
	s.edge.mu.Unlock()
	slices.SortFunc(rows, func(a, b row) int { return strings.Compare(a.app, b.app) })
	for _, r := range rows {
		f(r.app, r.b.conns.Load(), r.b.inflight.Load())
	}
}

// serveHTTP routes a request, then gives back the in-flight slot it took.
func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	s.mux.ServeHTTP(w, r)
	if ci, _ := r.Context().Value(connKey{}).(*connInfo); ci != nil && ci.busy != nil {
		ci.busy.inflight.Add(-1)
		ci.busy = nil
	}
}

// limitedWait is how long a request without a valid secret from an
// address past its rate waits for its 429. Answered at once, a flood that
// waits for its answers (most do) would cost the node a request's work
// per answer as fast as it can read them; waiting, it is slowed to its
// concurrency a second, and each waiting connection may be pushed out by
// a newcomer meanwhile, so the wait holds no place a backend needs.
const limitedWait = time.Second

// refuseUnauthenticated answers a request without a valid secret and
// closes its connection: it holds nothing past its answer. Past the
// address's rate the answer is 429 instead of the refusal given, after
// limitedWait.
func (s *Server) refuseUnauthenticated(w http.ResponseWriter, r *http.Request, route, status int, code proto.Code, msg string) {
	s.EdgeStats.Unauthenticated.Add(1)
	w.Header().Set("Connection", "close")
	addr := remoteAddr(r.RemoteAddr)
	ci, _ := r.Context().Value(connKey{}).(*connInfo)
	if ci != nil && ci.c != nil {
		addr = ci.c.Addr
	}
	if ok, retry := s.edge.addrs.allow(addr, time.Now()); !ok {
		s.EdgeStats.AddrLimited.Add(1)
		if ci != nil && ci.c != nil {
			ci.c.Wait(true)
			t := time.NewTimer(limitedWait)
			select {
			case <-t.C:
			case <-ci.c.PushedOut():
				t.Stop()
				return
			case <-r.Context().Done(): // the client left
				t.Stop()
				return
			}
			ci.c.Wait(false)
			retry = max(retry-limitedWait, time.Second)
		}
		s.failRetry(w, route, http.StatusTooManyRequests, proto.CodeRateLimited,
			"too many requests without a valid secret from this address: retry after retry_after ms with a current secret of the app", retry.Milliseconds())
		return
	}
	s.fail(w, route, status, code, msg)
}

// hold gives the request of an authenticated app a place: the connection
// joins the app's budget on its first such request, and the request takes
// one of the app's in-flight slots. It answers the refusal itself.
func (s *Server) hold(w http.ResponseWriter, r *http.Request, route int, app string) bool {
	ci, _ := r.Context().Value(connKey{}).(*connInfo)
	if ci == nil {
		return true // not served through NewHTTPServer: no budget to keep
	}
	b := s.edge.budget(app)
	if ci.c != nil && !ci.bound {
		if b.conns.Add(1) > int64(s.edge.cfg.AppMaxConns) {
			b.conns.Add(-1)
			s.EdgeStats.AppConnsFull.Add(1)
			w.Header().Set("Connection", "close")
			s.failRetry(w, route, http.StatusTooManyRequests, proto.CodeRateLimited,
				"this app holds its "+strconv.Itoa(s.edge.cfg.AppMaxConns)+" server API connections on this node (--api-app-max-conns): reuse keep-alive connections, or retry after retry_after ms", 1000)
			return false
		}
		if s.EdgeStats.Bound.Add(1) > int64(s.edge.cfg.MaxConns) {
			s.EdgeStats.Bound.Add(-1)
			b.conns.Add(-1)
			s.EdgeStats.NodeConnsFull.Add(1)
			w.Header().Set("Connection", "close")
			s.failRetry(w, route, http.StatusServiceUnavailable, proto.CodeOverloaded,
				"the server API connections of this node are all held (--api-max-conns): retry after retry_after ms, or on another node", 1000)
			return false
		}
		if !ci.c.Release(func() { b.conns.Add(-1); s.EdgeStats.Bound.Add(-1) }) {
			b.conns.Add(-1)
			s.EdgeStats.Bound.Add(-1)
			return false // closed under us: nobody to answer
		}
		ci.bound = true
	}
	if b.inflight.Add(1) > int64(s.edge.cfg.AppInFlight) {
		b.inflight.Add(-1)
		s.EdgeStats.AppInFlightFull.Add(1)
		s.failRetry(w, route, http.StatusTooManyRequests, proto.CodeRateLimited,
			"this app has "+strconv.Itoa(s.edge.cfg.AppInFlight)+" server API requests in flight on this node (--api-app-inflight): retry after retry_after ms", 100)
		return false
	}
	ci.busy = b
	return true
}
