package main

import (
	"crypto/sha256"
	"crypto/subtle"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/roost-chat/roost/fanout/api/httpedge"
)

// The admin listener's budget: adminMaxConns connections, of which those
// idle give way to new ones (a prober's connection always gets in), and at
// most adminHeavy requests other than /healthz and /readyz answered at
// once (a 30 s CPU profile, a trace, scrapes), so that the probes always
// find a connection whose handler is not stuck behind them.
const adminHeavy = 8

// Timeouts of the admin listener: scrapers and probers send their request
// at once and reconnect for little. No read or write timeout: requests have
// no body, and a CPU profile or a trace runs for as long as it was asked
// (net/http ends a handler's context when the read timeout passes).
const (
	adminHeaderTimeout = 5 * time.Second
	adminIdleTimeout   = 30 * time.Second
)

// adminBusy answers a connection turned away because every one counted is
// running a handler.
var adminBusy = func() []byte {
	body := "admin listener busy: every connection is in use: retry\n"
	return []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}()

// newAdminServer serves a's admin endpoints on ln: probes on a path that
// nothing else can hold up, the rest behind --admin-token when it is set
// and within adminHeavy at once. A listener reachable from other hosts
// without a token is logged as a warning: pprof shows the node's memory.
func newAdminServer(ln net.Listener, a *admin, log *slog.Logger) (*http.Server, net.Listener) {
	if ta, ok := ln.Addr().(*net.TCPAddr); ok && !ta.IP.IsLoopback() && a.token == "" {
		log.Warn("the admin listener is reachable from other hosts and has no --admin-token: anyone who reaches it can read /metrics and run pprof; set --admin-token (or ROOST_ADMIN_TOKEN), or give --admin 127.0.0.1:PORT",
			"addr", ln.Addr().String())
	}
	el := httpedge.New(ln, httpedge.Config{Max: adminMaxConns, Busy: adminBusy})
	mux := adminMux(a)
	var heavy atomic.Int32
	want := sha256.Sum256([]byte("Bearer " + a.token))
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/healthz", "/readyz":
			// Load balancers and supervisors probe without a token.
			mux.ServeHTTP(w, r)
			return
		}
		// The admin page itself holds no data: it takes the token from its
		// address and sends it with its polls of /admin/status.
		if a.token != "" && r.URL.Path != "/" {
			got := sha256.Sum256([]byte(bearer(r.Header.Get("Authorization"))))
			if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
				w.Header().Set("WWW-Authenticate", `Bearer realm="roost admin"`)
				w.Header().Set("Connection", "close")
				http.Error(w, "unauthorized: send Authorization: Bearer with the node's --admin-token", http.StatusUnauthorized)
				return
			}
		}
		if heavy.Add(1) > adminHeavy {
			heavy.Add(-1)
			w.Header().Set("Retry-After", "1")
			http.Error(w, "admin listener busy: "+strconv.Itoa(adminHeavy)+" requests other than /healthz and /readyz are being answered: retry", http.StatusServiceUnavailable)
			return
		}
		defer heavy.Add(-1)
		mux.ServeHTTP(w, r)
	})
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: adminHeaderTimeout,
		IdleTimeout:       adminIdleTimeout,
		MaxHeaderBytes:    16 << 10,
		ConnState:         el.ConnState,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}, el
}

// bearer normalises an Authorization header to "Bearer TOKEN" (the scheme
// is case-insensitive), or "" when it is not a Bearer one.
func bearer(h string) string {
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || tok == "" {
		return ""
	}
	return "Bearer " + tok
}
