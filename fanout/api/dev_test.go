package api

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// In development mode a request without a secret from loopback names its
// app (made on first use, capped); one from elsewhere, one for a
// configured app, or one with a wrong secret, is refused as in token mode.
func TestDevModeWithoutSecret(t *testing.T) {
	s, _ := newTestAPIWith(t, Config{MaxMsg: 256, Dev: true, DevMaxApps: 2, Static: map[string][]byte{"chat": []byte(testSecret)}})
	do := func(app, remote, auth string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/v1/apps/"+app+"/rooms/lobby/messages", strings.NewReader(`{"id":"k-1","from":"bot","body":"hi"}`))
		req.RemoteAddr = remote
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, req)
		return rec
	}
	for _, c := range []struct {
		app, remote, auth string
		code              int
		body              string
	}{
		{"demo", "127.0.0.1:40000", "", 200, `"seq":1`},
		{"demo", "[::1]:40000", "", 200, `"seq":1`}, // the same id: the first publish's answer
		{"demo", "192.0.2.7:40000", "", 401, "loopback only"},
		{"chat", "127.0.0.1:40000", "", 401, "missing secret"},           // a configured app needs its secret
		{"chat", "127.0.0.1:40000", "Bearer wrong", 401, "wrong secret"}, // a secret sent is checked
		{"chat", "127.0.0.1:40000", "Bearer " + testSecret, 200, `"seq":1`},
		{"second", "127.0.0.1:40000", "", 200, `"seq":1`},
		{"third", "127.0.0.1:40000", "", 403, "too many apps"}, // DevMaxApps 2: demo and second
	} {
		rec := do(c.app, c.remote, c.auth)
		if rec.Code != c.code || !strings.Contains(rec.Body.String(), c.body) {
			t.Errorf("%s from %s auth %q: %d %s, want %d with %q", c.app, c.remote, c.auth, rec.Code, rec.Body, c.code, c.body)
		}
	}

	// Out of development mode the same request is refused.
	s2, _ := newTestAPI(t)
	req := httptest.NewRequest(http.MethodPost, "/v1/apps/chat/rooms/lobby/messages", strings.NewReader(`{"id":"k-1","from":"bot","body":"hi"}`))
	req.RemoteAddr = "127.0.0.1:40000"
	rec := httptest.NewRecorder()
	s2.Handler().ServeHTTP(rec, req)
	if rec.Code != 401 || !strings.Contains(rec.Body.String(), "missing secret") {
		t.Errorf("token mode without a secret: %d %s", rec.Code, rec.Body)
	}
}
