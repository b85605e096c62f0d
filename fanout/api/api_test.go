package api

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/roost-chat/roost/fanout"
	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
)

const testSecret = "api-test-secret-0123456789"

// newTestAPI is the API on a memory store and a real publish path.
func newTestAPI(tb testing.TB) (*Server, persist.Store) {
	return newTestAPIWith(tb, Config{MaxMsg: 256, Static: map[string][]byte{"chat": []byte(testSecret)}})
}

func newTestAPIWith(tb testing.TB, cfg Config) (*Server, persist.Store) {
	tb.Helper()
	store := persist.NewMemory(1000)
	fan, err := fanout.New(fanout.Config{Loops: 1, OutboundLimit: 1 << 20, MaxRooms: 256, Readers: 2, GapWindow: 250 * time.Millisecond},
		fanout.Parts{Store: store, Pool: fanout.PoolConfig{Window: -1}})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { fan.Close(); store.Close() })
	s := New(cfg,
		Parts{Fan: fan, Store: store, Disconnect: func(string, string, time.Duration) int { return 0 }})
	return s, store
}

func publish(s *Server, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/v1/apps/chat/rooms/r/messages", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+testSecret)
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, req)
	return rec
}

// FuzzPublish: whatever the body, a publish is answered 200, 400 or 413
// with a JSON answer, and a 200 stored the body byte for byte as valid
// UTF-8 JSON.
func FuzzPublish(f *testing.F) {
	for _, seed := range []string{
		`{"id":"k-1","from":"bot","body":{"a":[1,2.50,"\u00e9"]}}`,
		`{"id":"k-1","from":"bot","body":null}`,
		`{"id":"k","from":"a\u0000b","body":1}`,
		`{"id":"k","from":"b","body":"` + strings.Repeat("x", 300) + `"}`,
		`{"id":"k","from":"b","body":{bad}}`,
		"{\"id\":\"k\",\"from\":\"b\",\"body\":\"\xff\"}",
		`{"id":"k","from":"b","body":1,"body":2}`,
		`[]`, ``, `{"id":null,"from":"b","body":1}`,
		`{"id":"e","from":"b","kind":"edit","ref":1,"body":{"t":2}}`,
		`{"id":"r","from":"b","kind":"react","ref":1,"body":"\ud83d\udc4d"}`,
		`{"id":"d","from":"b","kind":"delete","ref":1}`,
		`{"id":"x","from":"b","kind":"shout","ref":1,"body":1}`,
		`{"id":"x","from":"b","ref":1,"body":1}`,
	} {
		f.Add(seed)
	}
	s, store := newTestAPI(f)
	f.Fuzz(func(t *testing.T, body string) {
		dups := s.Stats.Duplicates.Load()
		rec := publish(s, body)
		var kinded struct{ Kind *string }
		_ = json.Unmarshal([]byte(body), &kinded)
		if kinded.Kind != nil && (rec.Code == 404 || rec.Code == 403) {
			return // a change of no message (or of another's: never, the API may change any)
		}
		if rec.Code != 200 && rec.Code != 400 && rec.Code != 413 {
			t.Fatalf("%q answered %d %s", body, rec.Code, rec.Body)
		}
		if !json.Valid(rec.Body.Bytes()) {
			t.Fatalf("%q: answer %q is not JSON", body, rec.Body)
		}
		if rec.Code != 200 {
			return
		}
		var ans struct{ Seq uint64 }
		_ = json.Unmarshal(rec.Body.Bytes(), &ans)
		var req struct{ Body json.RawMessage }
		_ = json.Unmarshal([]byte(body), &req)
		msgs, _, err := store.Range(context.Background(), "chat/r", ans.Seq-1, ans.Seq, persist.Bounds{Limit: 1})
		if err != nil || len(msgs) != 1 {
			t.Fatalf("%q: seq %d not stored: %v", body, ans.Seq, err)
		}
		// An earlier input had this (from, id), or a reaction that stands:
		// its body stands.
		dup := s.Stats.Duplicates.Load() != dups
		deleted := kinded.Kind != nil && *kinded.Kind == "delete" && len(msgs[0].Body) == 0 // a delete has no body
		if !deleted && (!dup && !bytes.Equal(msgs[0].Body, req.Body) || !utf8.Valid(msgs[0].Body) || !json.Valid(msgs[0].Body)) {
			t.Fatalf("%q: stored body %q", body, msgs[0].Body)
		}
		if !proto.ValidUser([]byte(msgs[0].From)) || !proto.ValidID([]byte(msgs[0].ID)) {
			t.Fatalf("%q: stored from %q id %q", body, msgs[0].From, msgs[0].ID)
		}
	})
}

// The same (from, id) twice: one message, the same seq.
func TestPublishIdempotent(t *testing.T) {
	s, store := newTestAPI(t)
	a := publish(s, `{"id":"k-1","from":"bot","body":1}`)
	b := publish(s, `{"id":"k-1","from":"bot","body":2}`)
	c := publish(s, `{"id":"k-1","from":"other","body":3}`)
	if a.Code != 200 || a.Body.String() != b.Body.String() || a.Body.String() != `{"room":"r","seq":1,"id":"k-1"}`+"\n" {
		t.Fatalf("answers %d %s / %d %s", a.Code, a.Body, b.Code, b.Body)
	}
	if !strings.Contains(c.Body.String(), `"seq":2`) {
		t.Fatalf("another sender's k-1: %s", c.Body)
	}
	if last, _ := store.LastSeq(context.Background(), "chat/r"); last != 2 {
		t.Fatalf("stored up to seq %d, want 2", last)
	}
	if s.Stats.Published.Load() != 2 || s.Stats.Duplicates.Load() != 1 {
		t.Fatalf("published %d duplicates %d", s.Stats.Published.Load(), s.Stats.Duplicates.Load())
	}
}
