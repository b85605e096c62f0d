package main_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/roost-chat/roost/proto/prototest"
	"github.com/roost-chat/roost/pubsub/redistest"
)

// TestWebhookSurvivesSIGKILL: a real node (PostgreSQL, Redis) delivering
// an app's messages to a slow receiver is killed with SIGKILL mid-delivery;
// a second node started afterwards delivers everything the first one
// acknowledged and had not delivered, in seq order per room, signed: what
// is owed lives in the database, not in the dead process.
func TestWebhookSurvivesSIGKILL(t *testing.T) {
	redistest.Require(t)
	var mu sync.Mutex
	seen := map[string][]uint64{}
	var badSig atomic.Value
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		m := hmac.New(sha256.New, []byte(apiSecret))
		m.Write([]byte(r.Header.Get("X-Roost-Timestamp") + "." + string(body)))
		if r.Header.Get("X-Roost-Signature") != "sha256="+hex.EncodeToString(m.Sum(nil)) {
			badSig.Store(r.Header.Get("X-Roost-Signature"))
		}
		var p struct {
			Events []struct {
				Room string
				Seq  uint64
			} `json:"events"`
		}
		if err := json.Unmarshal(body, &p); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		time.Sleep(100 * time.Millisecond) // slow: the node falls behind, so it has something owed when killed
		mu.Lock()
		for _, e := range p.Events {
			seen[e.Room] = append(seen[e.Room], e.Seq)
		}
		mu.Unlock()
	}))
	defer recv.Close()
	e := newEnv(t, redistest.Addr)
	f := filepath.Join(t.TempDir(), "apps.json")
	body := fmt.Sprintf(`{"apps":[{"id":%q,"secret":%q,"webhook":{"url":%q}}]}`, testApp, apiSecret, recv.URL)
	if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	api := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t, false))
	n0, err := launchNode(t, e, "node0", []string{"--apps", f, "--api", api, "--api-rate", "0", "--webhook-lease", "2s"})
	if err != nil {
		t.Fatal(err)
	}
	rooms := []string{"r1", "r2", "r3"}
	var amu sync.Mutex
	acked := map[string]uint64{} // room -> highest acknowledged seq
	client := &http.Client{Timeout: 5 * time.Second}
	var wg sync.WaitGroup
	var sent atomic.Int64
	stop := make(chan struct{})
	for w := 0; w < 6; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			room := rooms[w%len(rooms)]
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				url := "http://" + api + "/v1/apps/" + testApp + "/rooms/" + room + "/messages"
				req, _ := http.NewRequest("POST", url, strings.NewReader(fmt.Sprintf(`{"id":"w%d-%d","from":"bot","body":%d}`, w, i, i)))
				req.Header.Set("Authorization", "Bearer "+apiSecret)
				resp, err := client.Do(req)
				if err != nil {
					return // the node is gone
				}
				var out struct{ Seq uint64 }
				_ = json.NewDecoder(resp.Body).Decode(&out)
				resp.Body.Close()
				if resp.StatusCode == 200 {
					sent.Add(1)
					amu.Lock()
					acked[room] = max(acked[room], out.Seq)
					amu.Unlock()
				}
			}
		}()
	}
	prototest.WaitFor(t, 20*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if sent.Load() < 1500 || len(seen["r1"]) == 0 {
			return fmt.Errorf("%d acked, %d delivered in r1", sent.Load(), len(seen["r1"]))
		}
		return nil
	})
	n0.kill()
	close(stop)
	wg.Wait()
	mu.Lock()
	delivered := 0
	for _, s := range seen {
		delivered += len(s)
	}
	mu.Unlock()
	t.Logf("killed node0 with %d publishes acknowledged, %d events delivered", sent.Load(), delivered)
	if int64(delivered) >= sent.Load() {
		t.Fatalf("nothing was owed at the kill (%d delivered of %d): the test proves nothing", delivered, sent.Load())
	}
	if _, err := launchNode(t, e, "node1", []string{"--apps", f, "--webhook-lease", "2s"}); err != nil {
		t.Fatal(err)
	}
	prototest.WaitFor(t, 60*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		amu.Lock()
		defer amu.Unlock()
		for _, room := range rooms {
			next := uint64(1)
			for _, s := range seen[room] {
				switch {
				case s == next:
					next++
				case s > next:
					return fmt.Errorf("room %s: seq %d arrived before %d", room, s, next)
				}
			}
			if next <= acked[room] {
				return fmt.Errorf("room %s: delivered up to %d of %d acknowledged", room, next-1, acked[room])
			}
		}
		return nil
	})
	if s := badSig.Load(); s != nil {
		t.Fatalf("a signature did not verify: %v", s)
	}
}
