package test

import (
	"context"
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
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

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
	n0.Kill()
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

// dbBackendCPU is the CPU time (user+system, from /proc) spent so far by
// the PostgreSQL backends connected to the database of url.
func dbBackendCPU(tb testing.TB, url string) time.Duration {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`)
	if err != nil {
		tb.Fatal(err)
	}
	var ticks int64
	for rows.Next() {
		var pid int
		_ = rows.Scan(&pid)
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += ut + st
	}
	rows.Close()
	return time.Duration(ticks) * 10 * time.Millisecond // USER_HZ is 100 on Linux
}

// BenchmarkWebhookPGCPU: PostgreSQL CPU per publish with webhooks on and
// off, same load, interleaved. One node (PostgreSQL store, Redis broker)
// serves two apps alike but for a webhook: "chat" POSTs to a local
// receiver, "chatoff" has none. Each round publishes b.N messages over 10
// rooms through the server API at 1,000 a second to one app, waits until
// they are delivered (on) and for the dispatcher's next sweep (both), and
// charges the CPU of the database's backends (/proc) to that app; rounds
// alternate on, off, off, on, on, off. Reports µs of PostgreSQL CPU per
// publish for each and their ratio.
//
//	go test -run XXX -bench WebhookPGCPU -benchtime 3000x .
func BenchmarkWebhookPGCPU(b *testing.B) {
	redistest.Require(b)
	var delivered atomic.Int64
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var p struct {
			Events []json.RawMessage `json:"events"`
		}
		_ = json.Unmarshal(body, &p)
		delivered.Add(int64(len(p.Events)))
	}))
	defer recv.Close()
	e := newEnv(b, redistest.Addr)
	f := filepath.Join(b.TempDir(), "apps.json")
	body := fmt.Sprintf(`{"apps":[{"id":"chat","secret":%q,"webhook":{"url":%q}},{"id":"chatoff","secret":%q}]}`, apiSecret, recv.URL, apiSecret)
	if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
		b.Fatal(err)
	}
	api := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(b, false))
	if _, err := launchNode(b, e, "node0", []string{"--apps", f, "--api", api, "--api-rate", "0"}); err != nil {
		b.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 50}, Timeout: 10 * time.Second}
	seq := 0
	round := func(app string) time.Duration {
		want := delivered.Load() + int64(b.N)
		cpu0 := dbBackendCPU(b, e.dbURL)
		jobs := make(chan int, 64)
		var wg sync.WaitGroup
		for w := 0; w < 20; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range jobs {
					url := fmt.Sprintf("http://%s/v1/apps/%s/rooms/r%d/messages", api, app, i%10)
					req, _ := http.NewRequest("POST", url, strings.NewReader(fmt.Sprintf(`{"id":"m-%d","from":"bot","body":{"n":%d,"text":"a message of a usual size, some sixty bytes"}}`, i, i)))
					req.Header.Set("Authorization", "Bearer "+apiSecret)
					resp, err := client.Do(req)
					if err != nil {
						b.Error(err)
						continue
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
		}
		start := time.Now()
		for i := 0; i < b.N; i++ {
			time.Sleep(time.Until(start.Add(time.Duration(i) * time.Millisecond)))
			seq++
			jobs <- seq
		}
		close(jobs)
		wg.Wait()
		if app == "chat" {
			deadline := time.Now().Add(30 * time.Second)
			for delivered.Load() < want && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
		}
		time.Sleep(1500 * time.Millisecond) // a sweep and an idle release fall inside the round
		return dbBackendCPU(b, e.dbURL) - cpu0
	}
	round("chat") // warm both apps' rooms and the prepared statements
	round("chatoff")
	b.ResetTimer()
	var on, off time.Duration
	for _, app := range []string{"chat", "chatoff", "chatoff", "chat", "chat", "chatoff"} {
		d := round(app)
		b.Logf("%s: %v of PostgreSQL CPU for %d publishes", app, d, b.N)
		if app == "chat" {
			on += d
		} else {
			off += d
		}
	}
	b.StopTimer()
	n := float64(3 * b.N)
	b.ReportMetric(float64(on.Microseconds())/n, "pg-µs/pub-on")
	b.ReportMetric(float64(off.Microseconds())/n, "pg-µs/pub-off")
	b.ReportMetric(float64(on)/float64(off), "on/off")
}

// TestWebhookTwoNodesShare: two real nodes on one database deliver one
// app's webhook: publishes of some rooms go through one node, of others
// through the other, of two rooms through both. Every message arrives, in
// seq order per room, none twice (each room is delivered by the node
// holding its lease), and both nodes deliver.
func TestWebhookTwoNodesShare(t *testing.T) {
	redistest.Require(t)
	var mu sync.Mutex
	seen := map[string][]uint64{}
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var p struct {
			Events []struct {
				Room string
				Seq  uint64
			} `json:"events"`
		}
		if err := json.NewDecoder(r.Body).Decode(&p); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
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
	var apis [2]string
	var nodes [2]*roostNode
	for i := range nodes {
		apis[i] = fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t, false))
		n, err := launchNode(t, e, fmt.Sprintf("node%d", i), []string{"--apps", f, "--api", apis[i], "--api-rate", "0"})
		if err != nil {
			t.Fatal(err)
		}
		nodes[i] = n
	}
	client := &http.Client{Timeout: 5 * time.Second}
	plan := [][]string{{"a1", "a2", "s1", "s2"}, {"b1", "b2", "s1", "s2"}}
	const per = 150
	var wg sync.WaitGroup
	for i := range nodes {
		for _, room := range plan[i] {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := 0; k < per; k++ {
					url := "http://" + apis[i] + "/v1/apps/" + testApp + "/rooms/" + room + "/messages"
					req, _ := http.NewRequest("POST", url, strings.NewReader(fmt.Sprintf(`{"id":"n%d-%d","from":"bot","body":%d}`, i, k, k)))
					req.Header.Set("Authorization", "Bearer "+apiSecret)
					resp, err := client.Do(req)
					if err != nil {
						t.Error(err)
						return
					}
					resp.Body.Close()
					if resp.StatusCode != 200 {
						t.Errorf("publish: %s", resp.Status)
					}
				}
			}()
		}
	}
	wg.Wait()
	want := map[string]uint64{"a1": per, "a2": per, "b1": per, "b2": per, "s1": 2 * per, "s2": 2 * per}
	prototest.WaitFor(t, 30*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		for room, n := range want {
			next := uint64(1)
			for _, s := range seen[room] {
				switch {
				case s == next:
					next++
				case s > next:
					return fmt.Errorf("room %s: seq %d arrived before %d", room, s, next)
				}
			}
			if next != n+1 {
				return fmt.Errorf("room %s: delivered up to %d of %d", room, next-1, n)
			}
		}
		return nil
	})
	mu.Lock()
	for room, seqs := range seen {
		if uint64(len(seqs)) != want[room] {
			t.Errorf("room %s: %d events for %d messages: delivered twice", room, len(seqs), want[room])
		}
	}
	mu.Unlock()
	var posts [2]float64
	for i, n := range nodes {
		posts[i] = n.Metrics(t)["roost_webhook_posts_total"]
	}
	t.Logf("POSTs by node: %v", posts)
	if posts[0] == 0 || posts[1] == 0 {
		t.Fatalf("POSTs by node %v: the work was not shared", posts)
	}
}
