package api

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func call(s *Server, method, path, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+testSecret)
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, req)
	return rec
}

// The API writes to a user's inbox, "@user", an ordinary durable room.
func TestInboxPublish(t *testing.T) {
	s, _ := newTestAPI(t)
	rec := call(s, http.MethodPost, "/v1/apps/chat/users/alice/messages", `{"id":"k","from":"bot","body":{"n":1}}`)
	if rec.Code != 200 || strings.TrimSpace(rec.Body.String()) != `{"room":"@alice","seq":1,"id":"k"}` {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	rec = call(s, http.MethodGet, "/v1/apps/chat/rooms/@alice/messages", "")
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"body":{"n":1}`) {
		t.Fatalf("history: %d %s", rec.Code, rec.Body)
	}
	rec = call(s, http.MethodPost, "/v1/apps/chat/users/al%20ice/messages", `{"id":"k","from":"bot","body":1}`)
	if rec.Code != 400 {
		t.Fatalf("a user that cannot name an inbox: %d %s", rec.Code, rec.Body)
	}
}
