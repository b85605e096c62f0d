package webhook

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
	"github.com/roost-chat/roost/proto/prototest"
)

// Changes reach webhooks with kind and ref, in order, whether the node
// POSTs them from memory or reads them from the store (a crashed node's).
func TestKindsWebhook(t *testing.T) {
	p, _ := pgStore(t)
	var mu sync.Mutex
	var events []map[string]any
	url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var b struct{ Events []map[string]any }
		if err := json.Unmarshal(body, &b); err != nil {
			t.Errorf("bad POST %s", body)
		}
		mu.Lock()
		events = append(events, b.Events...)
		mu.Unlock()
	}))
	a := registered(t, p, app(url, "current-secret-0123456789"))
	rows := []*persist.Row{
		{Key: "chat/r1", From: "alice", ID: []byte("m"), Body: []byte(`"hi"`)},
		{Key: "chat/r1", From: "alice", ID: []byte("e"), Body: []byte(`"hi!"`), Kind: proto.KindEdit, Ref: 1},
		{Key: "chat/r1", From: "bob", ID: []byte("r"), Body: []byte(`"👍"`), Kind: proto.KindReact, Ref: 1},
	}
	if err := p.CommitBatch(context.Background(), rows); err != nil {
		t.Fatal(err)
	}
	// Not handed to any dispatcher: read from the store.
	d := New(durableCfg(p, "node-a"))
	defer d.Close()
	d.SetApps([]proto.App{a})
	more := []*persist.Row{{Key: "chat/r1", From: "alice", ID: []byte("d"), Kind: proto.KindDelete, Ref: 1}}
	if err := p.CommitBatch(context.Background(), more); err != nil {
		t.Fatal(err)
	}
	frame := proto.AppendMsgFrameKind(nil, "r1", more[0].Seq, more[0].ID, "alice", more[0].TS, proto.KindDelete, 1, nil)
	hand(d, more, [][]byte{frame})
	prototest.WaitFor(t, 20*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(events) < 4 {
			return io.ErrUnexpectedEOF
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	want := []struct {
		kind string
		ref  float64
	}{{"", 0}, {"edit", 1}, {"react", 1}, {"delete", 1}}
	for i, w := range want {
		e := events[i]
		kind, _ := e["kind"].(string)
		ref, _ := e["ref"].(float64)
		if e["type"] != "msg" || e["seq"] != float64(i+1) || kind != w.kind || ref != w.ref {
			t.Fatalf("event %d: %v, want kind %q ref %v", i, e, w.kind, w.ref)
		}
	}
}
