package api

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/roost-chat/roost/persist"
)

func get(s *Server, path string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, path, nil)
	req.Header.Set("Authorization", "Bearer "+testSecret)
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, req)
	return rec
}

// The publish route takes kind and ref; the API may edit or delete any
// message; each rule answers with its status and nothing is stored.
func TestPublishKinds(t *testing.T) {
	s, store := newTestAPI(t)
	for _, tc := range []struct {
		body   string
		status int
		want   string
	}{
		{`{"id":"m1","from":"alice","body":"hi"}`, 200, `"seq":1`},
		{`{"id":"e1","from":"backend","kind":"edit","ref":1,"body":"moderated"}`, 200, `"seq":2`},
		{`{"id":"r1","from":"bob","kind":"react","ref":1,"body":"👍"}`, 200, `"seq":3`},
		{`{"id":"r2","from":"bob","kind":"react","ref":1,"body":"👍"}`, 200, `"seq":3`},    // stands already
		{`{"id":"x1","from":"bob","kind":"edit","ref":2,"body":"x"}`, 404, `"not_found"`}, // an edit of an edit
		{`{"id":"x2","from":"bob","kind":"edit","ref":99,"body":"x"}`, 404, `"not_found"`},
		{`{"id":"x3","from":"bob","kind":"shout","ref":1,"body":"x"}`, 400, `kind must be`},
		{`{"id":"x4","from":"bob","ref":1,"body":"x"}`, 400, `ref is only for`},
		{`{"id":"x5","from":"bob","kind":"edit","body":"x"}`, 400, `need ref`},
		{`{"id":"x6","from":"bob","kind":"edit","ref":1}`, 400, `an edit needs a body`},
		{`{"id":"x7","from":"bob","kind":"react","ref":1,"body":""}`, 400, `a reaction is`},
		{`{"id":"x8","from":"bob","kind":"react","ref":1,"body":"` + strings.Repeat("x", 33) + `"}`, 400, `a reaction is`},
		{`{"id":"x9","from":"bob","kind":"delete","ref":1,"body":1}`, 400, `a delete has no body`},
		{`{"id":"d1","from":"backend","kind":"delete","ref":1,"body":null}`, 200, `"seq":4`},
		{`{"id":"x10","from":"bob","kind":"react","ref":1,"body":"👍"}`, 404, `"not_found"`}, // deleted
	} {
		rec := publish(s, tc.body)
		if rec.Code != tc.status || !strings.Contains(rec.Body.String(), tc.want) {
			t.Fatalf("%s: %d %s, want %d with %s", tc.body, rec.Code, rec.Body, tc.status, tc.want)
		}
	}
	if last, _ := store.LastSeq(context.Background(), "chat/r"); last != 4 {
		t.Fatalf("stored up to %d, want 4: a refused publish was stored", last)
	}
	rec := get(s, "/v1/apps/chat/rooms/r/messages?fold=true")
	var h struct {
		Messages []map[string]any
		More     bool
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &h); err != nil || rec.Code != 200 {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	if len(h.Messages) != 1 || h.Messages[0]["deleted"] != true || h.Messages[0]["body"] != nil ||
		h.Messages[0]["reactions"].(map[string]any)["👍"] != float64(1) || h.Messages[0]["edited"] == nil {
		t.Fatalf("folded %s", rec.Body)
	}
	// The plain listing carries kind and ref.
	rec = get(s, "/v1/apps/chat/rooms/r/messages?after=0")
	if !strings.Contains(rec.Body.String(), `"kind":"edit","ref":1,"body":"moderated"`) || !strings.Contains(rec.Body.String(), `"kind":"delete","ref":1,"body":null`) {
		t.Fatalf("listing %s", rec.Body)
	}
	if rec := get(s, "/v1/apps/chat/rooms/r/messages?fold=maybe"); rec.Code != 400 {
		t.Fatalf("fold=maybe: %d", rec.Code)
	}
	var _ persist.Folder = store.(persist.Folder)
}
