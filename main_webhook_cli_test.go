package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/persist/pgtest"
)

// TestWebhookDeadCommands: `roost webhook dead` lists a dead letter as
// JSON, `roost webhook replay ID` POSTs its events to the app's webhook
// signed with the app's secret and records it; bad arguments exit 2.
func TestWebhookDeadCommands(t *testing.T) {
	url := pgtest.NewDB(t)
	ctx := context.Background()
	if err := persist.Migrate(ctx, url); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []string
	var secret string
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		m := hmac.New(sha256.New, []byte(secret))
		m.Write([]byte(r.Header.Get("X-Roost-Timestamp") + "." + string(body)))
		if r.Header.Get("X-Roost-Signature") != "sha256="+hex.EncodeToString(m.Sum(nil)) {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		mu.Lock()
		got = append(got, string(body))
		mu.Unlock()
	}))
	defer recv.Close()
	var created struct{ Secret string }
	if err := json.Unmarshal([]byte(mustRoost(t, "app", "create", "chat", "--database-url", url)), &created); err != nil {
		t.Fatal(err)
	}
	secret = created.Secret
	mustRoost(t, "app", "set", "chat", "--database-url", url, "--webhook-url", recv.URL, "--webhook-max-age", "1h")
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	events := `[{"type":"msg","room":"r","seq":7,"id":"m-7","from":"alice","ts":1764484800123,"body":{"t":1}}]`
	if _, err := conn.Exec(ctx, `INSERT INTO webhook_dead (app, room, from_seq, to_seq, last_error, events, n_events) VALUES ('chat', 'r', 7, 7, 'receiver answered 500', $1, 1)`, []byte(events)); err != nil {
		t.Fatal(err)
	}
	var dead []struct {
		ID         int64
		App, Room  string
		FromSeq    uint64 `json:"from_seq"`
		Events     int
		ReplayedAt *string `json:"replayed_at"`
	}
	if err := json.Unmarshal([]byte(mustRoost(t, "webhook", "dead", "--app", "chat", "--database-url", url)), &dead); err != nil || len(dead) != 1 || dead[0].Room != "r" || dead[0].FromSeq != 7 || dead[0].Events != 1 || dead[0].ReplayedAt != nil {
		t.Fatalf("dead letters %+v (%v)", dead, err)
	}
	out := mustRoost(t, "webhook", "replay", strconv.FormatInt(dead[0].ID, 10), "--database-url", url)
	if !strings.Contains(out, "replayed dead letter") {
		t.Fatalf("replay printed %q", out)
	}
	mu.Lock()
	if len(got) != 1 || got[0] != `{"app":"chat","events":`+events+`}` {
		t.Fatalf("receiver got %q", got)
	}
	mu.Unlock()
	if err := json.Unmarshal([]byte(mustRoost(t, "webhook", "dead", "--database-url", url)), &dead); err != nil || len(dead) != 1 || dead[0].ReplayedAt == nil {
		t.Fatalf("after replay: %+v (%v)", dead, err)
	}
	for _, args := range [][]string{
		{"webhook", "replay", "abc", "--database-url", url},
		{"webhook", "replay", "--database-url", url},
		{"webhook", "dead", "extra", "--database-url", url},
		{"webhook", "nope"},
	} {
		if code, _, _ := roost(t, args...); code != 2 {
			t.Errorf("roost %s: exit %d, want 2", strings.Join(args, " "), code)
		}
	}
	if code, _, errs := roost(t, "webhook", "replay", "999", "--database-url", url); code != 1 || !strings.Contains(errs, "no such dead letter") {
		t.Errorf("replay of a missing id: exit %d, %s", code, errs)
	}
}
