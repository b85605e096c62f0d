package api

import (
	"net"
	"net/http"

	"github.com/roost-chat/roost/fanout/tenancy"
	"github.com/roost-chat/roost/proto"
)

// Development mode (Config.Dev: a node in insecure mode whose API listens
// on loopback) lets a request without an Authorization header name its
// app, as a development client names itself with ?app=: `curl -d ...
// http://127.0.0.1:8090/v1/apps/demo/rooms/lobby/messages` works as the
// README prints it. An app that is configured (registry, --app-secret)
// has a secret, and needs it as in token mode; a request that sends a
// secret is checked as always. Only loopback peers are admitted so: a
// proxy or a port forward that reaches the listener from elsewhere still
// needs a secret.

// devTenant returns the tenant a secret-less request in development mode
// acts as: an app made on first use with the node's defaults, at most
// DevMaxApps. It answers the refusal itself.
func (s *Server) devTenant(w http.ResponseWriter, r *http.Request, id string, route int) (*tenant, bool) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		s.fail(w, route, http.StatusUnauthorized, proto.CodeForbidden, "missing secret: development mode admits requests without a secret from loopback only; send Authorization: Bearer SECRET")
		return nil, false
	}
	s.mu.RLock()
	t, configured := s.dev[id], s.apps[id] != nil
	s.mu.RUnlock()
	if configured {
		s.fail(w, route, http.StatusUnauthorized, proto.CodeForbidden, "missing secret: send Authorization: Bearer SECRET with a current secret of the app")
		return nil, false
	}
	if t != nil {
		return t, true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if t = s.dev[id]; t != nil {
		return t, true
	}
	if s.cfg.DevMaxApps > 0 && len(s.dev) >= s.cfg.DevMaxApps {
		s.fail(w, route, http.StatusForbidden, proto.CodeForbidden, "development mode: too many apps made on first use (--insecure-max-apps)")
		return nil, false
	}
	t = newTenant(tenancy.Resolve(tenancy.Limits{MaxMsg: s.cfg.MaxMsg}, &proto.App{ID: id}), nil)
	s.dev[id] = t
	return t, true
}
