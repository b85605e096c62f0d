package api

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
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

// PUT .../read sets a read position as the read op does.
func TestReadAPI(t *testing.T) {
	s, _ := newTestAPI(t)
	for i := 0; i < 3; i++ {
		if rec := publish(s, `{"id":"k`+string(rune('0'+i))+`","from":"bot","body":1}`); rec.Code != 200 {
			t.Fatal(rec.Body)
		}
	}
	for _, c := range []struct {
		body string
		code int
		want string
	}{
		{`{"room":"r","seq":2}`, 200, `{"room":"r","seq":2}`},
		{`{"room":"r","seq":1}`, 200, `{"room":"r","seq":2}`},
		{`{"room":"r","seq":4}`, 400, ""},
		{`{"room":"r","seq":1.5}`, 400, ""},
		{`{"room":"r"}`, 400, ""},
		{`{"room":"r r","seq":1}`, 400, ""},
	} {
		rec := call(s, http.MethodPut, "/v1/apps/chat/users/alice/read", c.body)
		if rec.Code != c.code || c.want != "" && strings.TrimSpace(rec.Body.String()) != c.want {
			t.Errorf("%s: %d %s", c.body, rec.Code, rec.Body)
		}
	}
}

// Many PUT .../read at once: each answered as if alone, a position never
// moving back, a mark beyond the room's newest seq (or in a room with
// none) a 400. How the node batches them depends on timing and is not
// asserted here; fanout's TestAPIMarksLookedUpTogether asserts that
// marks waiting together read the store together.
func TestReadAPIConcurrent(t *testing.T) {
	s, _ := newTestAPI(t)
	for i := 0; i < 3; i++ {
		if rec := publish(s, `{"id":"k`+string(rune('0'+i))+`","from":"bot","body":1}`); rec.Code != 200 {
			t.Fatal(rec.Body)
		}
	}
	const users = 100
	type mark struct {
		user, body string
		codes      []int    // what the answer's status may be
		wants      []string // and its body, for a 200
	}
	var marks []mark
	for u := range users {
		user := "u" + strconv.Itoa(u)
		marks = append(marks,
			mark{user, `{"room":"r","seq":2}`, []int{200}, []string{`{"room":"r","seq":2}`}},
			// Before or after the 2: either answer, never below what it marked.
			mark{user, `{"room":"r","seq":1}`, []int{200}, []string{`{"room":"r","seq":1}`, `{"room":"r","seq":2}`}},
			mark{user, `{"room":"r","seq":4}`, []int{400}, nil},
			mark{user, `{"room":"z","seq":1}`, []int{400}, nil})
	}
	var wg sync.WaitGroup
	errs := make(chan string, len(marks))
	for _, m := range marks {
		wg.Go(func() {
			rec := call(s, http.MethodPut, "/v1/apps/chat/users/"+m.user+"/read", m.body)
			got := strings.TrimSpace(rec.Body.String())
			if !slices.Contains(m.codes, rec.Code) || rec.Code == 200 && !slices.Contains(m.wants, got) {
				errs <- fmt.Sprintf("%s %s: %d %s", m.user, m.body, rec.Code, got)
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	for u := range users {
		rec := call(s, http.MethodGet, "/v1/apps/chat/users/u"+strconv.Itoa(u)+"/unread?room=r", "")
		if want := `{"r":{"read":2,"seq":3,"count":1}}`; rec.Code != 200 || strings.TrimSpace(rec.Body.String()) != want {
			t.Fatalf("u%d afterwards: %d %s, want %s", u, rec.Code, rec.Body, want)
		}
	}
}

func TestUnreadAPI(t *testing.T) {
	s, _ := newTestAPI(t)
	for i := 0; i < 3; i++ {
		if rec := publish(s, `{"id":"k`+string(rune('0'+i))+`","from":"bot","body":1}`); rec.Code != 200 {
			t.Fatal(rec.Body)
		}
	}
	if rec := call(s, http.MethodPut, "/v1/apps/chat/users/alice/read", `{"room":"r","seq":1}`); rec.Code != 200 {
		t.Fatal(rec.Body)
	}
	rec := call(s, http.MethodGet, "/v1/apps/chat/users/alice/unread?room=r&room=z", "")
	if rec.Code != 200 || strings.TrimSpace(rec.Body.String()) != `{"r":{"read":1,"seq":3,"count":2},"z":{"read":0,"seq":0,"count":0}}` {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	if rec := call(s, http.MethodGet, "/v1/apps/chat/users/alice/unread", ""); rec.Code != 400 {
		t.Fatalf("no rooms: %d", rec.Code)
	}
	if rec := call(s, http.MethodGet, "/v1/apps/chat/users/alice/unread?room="+strings.Repeat("x", 129), ""); rec.Code != 400 {
		t.Fatalf("bad room: %d", rec.Code)
	}
}
