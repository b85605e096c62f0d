package webhook

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/roost-chat/roost/proto"
	"github.com/roost-chat/roost/proto/prototest"
)

// TestShedsLargestAppOldestFirst: without a database, past MaxBytes the
// app holding the most loses its oldest owed events, counted per app; the
// small app loses nothing, the node holds no more than its bound (and a
// batch in flight), and once the receiver answers each app gets what was
// not dropped: the big app's newest, as many missing as counted.
func TestShedsLargestAppOldestFirst(t *testing.T) {
	var down atomic.Bool
	down.Store(true)
	var mu sync.Mutex
	seen := map[string]map[uint64]bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		body, _ := io.ReadAll(r.Body)
		var p struct {
			App    string `json:"app"`
			Events []struct{ Seq uint64 }
		}
		if err := json.Unmarshal(body, &p); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		if seen[p.App] == nil {
			seen[p.App] = map[uint64]bool{}
		}
		for _, e := range p.Events {
			seen[p.App][e.Seq] = true
		}
		mu.Unlock()
	}))
	defer srv.Close()
	cfg := Defaults()
	cfg.MaxBytes = 256 << 10
	cfg.MaxBatchBytes = 16 << 10 // a batch in flight is not shed: small beside the bound, as 1 MiB is beside the default
	cfg.RetryMin, cfg.RetryMax = 5*time.Millisecond, 20*time.Millisecond
	d := New(cfg)
	defer d.Close()
	hook := &proto.Webhook{URL: srv.URL, Timeout: proto.Duration(2 * time.Second)}
	d.SetApps([]proto.App{{ID: "big", Secret: "big-secret-0123456789", Webhook: hook}, {ID: "small", Secret: "small-secret-0123456789", Webhook: hook}})
	body := []byte(fmt.Sprintf(`"%01000d"`, 0))
	feed := func(app string, n int) {
		for i := 1; i <= n; i++ {
			ts := time.Now().UnixMilli()
			d.Committed(proto.RoomKey(app, "r"), uint64(i), ts, proto.AppendMsgFrame(nil, "r", uint64(i), []byte(fmt.Sprint("m-", i)), "bot", ts, body))
		}
	}
	feed("small", 20)
	feed("big", 3000)
	if held := d.Stats.Held.Load(); held > cfg.MaxBytes+int64(cfg.MaxBatchBytes)*2 {
		t.Fatalf("%d bytes held, bound %d (and a batch in flight per app)", held, cfg.MaxBytes)
	}
	drops := map[string]uint64{}
	d.EachDropped(func(app string, n uint64) { drops[app] = n })
	if drops["small"] != 0 || drops["big"] == 0 {
		t.Fatalf("dropped %v: want the big app's events only", drops)
	}
	down.Store(false)
	prototest.WaitFor(t, 20*time.Second, func() error {
		if o := d.Stats.Owed.Load(); o != 0 {
			return fmt.Errorf("%d owed", o)
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if len(seen["small"]) != 20 {
		t.Fatalf("small app got %d of 20", len(seen["small"]))
	}
	var missing []uint64
	for s := uint64(1); s <= 3000; s++ {
		if !seen["big"][s] {
			missing = append(missing, s)
		}
	}
	if uint64(len(missing)) != drops["big"] {
		t.Fatalf("big app: %d missing, %d counted as dropped", len(missing), drops["big"])
	}
	// What arrived is the batch that was in flight when the receiver went
	// down (one run) and the newest events (a run ending at the newest):
	// everything shed was older than what was kept.
	runs := 0
	for s := uint64(1); s <= 3000; s++ {
		if seen["big"][s] && !seen["big"][s-1] {
			runs++
		}
	}
	if runs > 2 || !seen["big"][3000] {
		t.Fatalf("big app: delivered seqs in %d runs (newest delivered: %v): want the batch in flight and the newest", runs, seen["big"][3000])
	}
	// 64 of 1 KB fit in the bound besides the batch in flight and the
	// small app's: the newest are kept.
	if i := slices.IndexFunc(missing, func(s uint64) bool { return s > 3000-64 }); i >= 0 {
		t.Fatalf("a newest event (%d) was dropped (missing %d..%d, %d)", missing[i], missing[0], missing[len(missing)-1], len(missing))
	}
	t.Logf("big app: %d dropped (seqs %d..%d), %d delivered in %d runs", len(missing), missing[0], missing[len(missing)-1], len(seen["big"]), runs)
}
