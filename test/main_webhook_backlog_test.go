package test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
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
	"github.com/roost-chat/roost/test/harness"
)

// hangingReceiver is a real HTTP server that accepts every webhook POST
// and answers none of them until released; from then on it answers 200
// and records each (room, seq) it answered for.
type hangingReceiver struct {
	url     string
	release chan struct{}

	mu   sync.Mutex
	seen map[string]map[uint64]bool
}

func newHangingReceiver(t *testing.T) *hangingReceiver {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &hangingReceiver{url: "http://" + ln.Addr().String() + "/hook", release: make(chan struct{}), seen: map[string]map[uint64]bool{}}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		h.open()
		_ = srv.Close()
	})
	return h
}

func (h *hangingReceiver) open() {
	select {
	case <-h.release:
	default:
		close(h.release)
	}
}

func (h *hangingReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	select {
	case <-h.release:
	case <-r.Context().Done():
		return // the node gave up on this POST: it was never answered
	}
	var p struct {
		Events []struct {
			Room string
			Seq  uint64
		} `json:"events"`
	}
	if err := json.Unmarshal(body, &p); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	h.mu.Lock()
	for _, e := range p.Events {
		if h.seen[e.Room] == nil {
			h.seen[e.Room] = map[uint64]bool{}
		}
		h.seen[e.Room][e.Seq] = true
	}
	h.mu.Unlock()
}

// rss reads a process's resident set size in bytes.
func rss(t *testing.T, pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// backlogSeconds is how long the publishers run: ROOST_BACKLOG_SECONDS, 15
// by default (the 60 s run of docs/benchmarks.md sets it to 60).
func backlogSeconds(t *testing.T) time.Duration {
	if v := os.Getenv("ROOST_BACKLOG_SECONDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("ROOST_BACKLOG_SECONDS=%q: want a number of seconds", v)
		}
		return time.Duration(n) * time.Second
	}
	return 15 * time.Second
}

// backlogBudget is the node's memory budget in these tests (--memory-limit):
// without a database, the memory store's (64 MiB) and the webhook
// backlog's (16 MiB, its default share) fit in it; with PostgreSQL there
// is no memory store, and an app's owed events hold a 4 MiB window.
func backlogBudget(pg bool) int64 {
	if pg {
		return 96 << 20
	}
	return 256 << 20
}

// TestWebhookBacklogHangingReceiver: an app's receiver accepts and never
// answers while 32 KB messages are published at full speed; the node's
// RSS stays under its budget plus 10 %. Once the receiver answers, with
// PostgreSQL every acknowledged message reaches it and nothing counts as
// dropped; without a database, what reaches it plus what the node counts
// as dropped for the app is exactly what was acknowledged.
func TestWebhookBacklogHangingReceiver(t *testing.T) {
	t.Run("memory", func(t *testing.T) { backlogCase(t, false) })
	t.Run("postgres", func(t *testing.T) { backlogCase(t, true) })
}

func backlogCase(t *testing.T, pg bool) {
	recv := newHangingReceiver(t)
	f := filepath.Join(t.TempDir(), "apps.json")
	body := fmt.Sprintf(`{"apps":[{"id":%q,"secret":%q,"webhook":{"url":%q}}]}`, testApp, apiSecret, recv.url)
	if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	api := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t, false))
	budget := backlogBudget(pg)
	extra := []string{"--apps", f, "--api", api, "--api-rate", "0", "--memory-limit", strconv.FormatInt(budget, 10)}
	var n *roostNode
	if pg {
		redistest.Require(t)
		var err error
		if n, err = launchNode(t, newEnv(t, redistest.Addr), "node0", extra); err != nil {
			t.Fatal(err)
		}
	} else {
		// The memory store's budget 64 MiB, so the backlog's default is 16 MiB.
		n = plainNode(t, 0, false, append(extra, "--memory-store-max", "64MiB")...)
	}
	pid := n.Cmd.Process.Pid
	before := rss(t, pid)

	payload := `"` + strings.Repeat("x", 32<<10) + `"`
	rooms := []string{"r0", "r1", "r2", "r3"}
	var amu sync.Mutex
	acked := map[string][]uint64{}
	var sent atomic.Int64
	deadline := time.Now().Add(backlogSeconds(t))
	var peak atomic.Int64
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for time.Now().Before(deadline) {
			peak.Store(max(peak.Load(), rss(t, pid)))
			time.Sleep(100 * time.Millisecond)
		}
	}()
	client := &http.Client{Timeout: 10 * time.Second}
	var wg sync.WaitGroup
	for w, room := range rooms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(deadline); i++ {
				url := "http://" + api + "/v1/apps/" + testApp + "/rooms/" + room + "/messages"
				req, _ := http.NewRequest("POST", url, strings.NewReader(fmt.Sprintf(`{"id":"w%d-%d","from":"bot","body":%s}`, w, i, payload)))
				req.Header.Set("Authorization", "Bearer "+apiSecret)
				resp, err := client.Do(req)
				if err != nil {
					t.Errorf("publish: %v", err)
					return
				}
				var out struct{ Seq uint64 }
				_ = json.NewDecoder(resp.Body).Decode(&out)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Errorf("publish answered %d", resp.StatusCode)
					return
				}
				sent.Add(1)
				amu.Lock()
				acked[room] = append(acked[room], out.Seq)
				amu.Unlock()
			}
		}()
	}
	wg.Wait()
	<-sampled
	if t.Failed() {
		return
	}
	limit := budget * 11 / 10
	t.Logf("%d publishes of 32 KB acknowledged in %s; RSS before %d MiB, peak %d MiB (budget %d MiB + 10%%)",
		sent.Load(), backlogSeconds(t), before>>20, peak.Load()>>20, budget>>20)
	if peak.Load() > limit {
		t.Errorf("peak RSS %d MiB: over the budget plus 10 %% (%d MiB)", peak.Load()>>20, limit>>20)
	}
	if sent.Load() < 1000 {
		t.Fatalf("only %d publishes acknowledged: the test proves nothing", sent.Load())
	}

	recv.open()
	dropped := func() uint64 { return uint64(n.Metrics(t)[`roost_webhook_dropped_total{app="`+testApp+`"}`]) }
	missing := func() (miss uint64, first string) {
		recv.mu.Lock()
		defer recv.mu.Unlock()
		amu.Lock()
		defer amu.Unlock()
		for _, room := range rooms {
			for _, s := range acked[room] {
				if !recv.seen[room][s] {
					if miss == 0 {
						first = fmt.Sprintf("%s/%d", room, s)
					}
					miss++
				}
			}
		}
		return miss, first
	}
	prototest.WaitFor(t, 4*time.Minute, func() error {
		m := n.Metrics(t)
		if pg {
			if miss, first := missing(); miss > 0 {
				return fmt.Errorf("%d acknowledged messages not delivered yet (first %s)", miss, first)
			}
			return nil
		}
		if m["roost_webhook_owed"] != 0 || m["roost_webhook_held_bytes"] != 0 {
			return fmt.Errorf("owed %v, held %v bytes", m["roost_webhook_owed"], m["roost_webhook_held_bytes"])
		}
		return nil
	})
	miss, first := missing()
	d := dropped()
	t.Logf("RSS after delivery %d MiB; dropped %d, missing %d", rss(t, pid)>>20, d, miss)
	if pg {
		if d != 0 {
			t.Errorf("roost_webhook_dropped_total{app=%q} = %d with PostgreSQL, where nothing is lost", testApp, d)
		}
		return
	}
	if d == 0 {
		t.Errorf("nothing dropped past a %d MiB backlog: the test proves nothing", 16)
	}
	if miss != d {
		t.Errorf("%d acknowledged messages never delivered (first %s), %d counted as dropped: want them equal", miss, first, d)
	}
}

// TestHookURLRefused: a link-local (metadata) webhook URL is refused by
// `roost app set` with a clear error, and by the node when an app's stored
// URL resolves there (an app set before the check); a webhook aimed at
// the node's own admin listener is never called: refused, counted as a
// failure, logged once.
func TestHookURLRefused(t *testing.T) {
	redistest.Require(t)
	e := newEnv(t, redistest.Addr)
	bin := harness.Binary(t)
	run := func(args ...string) (int, string) {
		cmd := exec.Command(bin, append(args, "--database-url", e.dbURL)...)
		cmd.Env = harness.Env()
		out, err := cmd.CombinedOutput()
		code := 0
		if err != nil {
			code = cmd.ProcessState.ExitCode()
		}
		return code, string(out)
	}
	if code, out := run("migrate"); code != 0 {
		t.Fatalf("migrate: %d %s", code, out)
	}
	if code, out := run("app", "create", testApp); code != 0 {
		t.Fatalf("app create: %d %s", code, out)
	}
	for _, args := range [][]string{
		{"--webhook-url", "http://169.254.169.254/latest/meta-data/"},
		{"--webhook-url", "http://[fe80::1]:8080/hook"},
		{"--connect-proxy", "http://169.254.169.254/"},
		{"--publish-proxy", "http://[::ffff:169.254.1.1]/"},
	} {
		code, out := run(append([]string{"app", "set", testApp}, args...)...)
		if code == 0 || !strings.Contains(out, "link-local") {
			t.Errorf("app set %v: exit %d, %q: want a refusal naming link-local", args, code, out)
		}
	}
	n, err := launchNode(t, e, "node0", nil)
	if err != nil {
		t.Fatal(err)
	}
	// A webhook aimed at the node's own admin listener (its pprof).
	self := "http://" + n.Admin + "/debug/pprof/profile?seconds=1"
	if code, out := run("app", "set", testApp, "--webhook-url", self, "--webhook-timeout", "2s"); code != 0 {
		t.Fatalf("app set (own admin port): %d %s", code, out)
	}
	c := dialClient(t, n, "alice")
	c.join(t, "r")
	pub := func() {
		if err := c.send(`{"op":"pub","room":"r","id":"m` + strconv.FormatInt(time.Now().UnixNano(), 10) + `","body":1}`); err != nil {
			t.Fatal(err)
		}
	}
	prototest.WaitFor(t, 20*time.Second, func() error {
		pub() // until the registry's change has reached the node, a message owes nothing
		m := n.Metrics(t)
		if m["roost_webhook_delivered_total"] != 0 {
			t.Fatalf("the node POSTed to its own admin listener: %v delivered", m["roost_webhook_delivered_total"])
		}
		if m["roost_webhook_failures_total"] < 2 {
			return fmt.Errorf("failures %v", m["roost_webhook_failures_total"])
		}
		return nil
	})
	log := n.LogTail(400)
	if got := strings.Count(log, "hook call refused"); got != 1 || !strings.Contains(log, "own admin listener") {
		t.Errorf("want one log line refusing the call to the node's own admin listener, got %d:\n%s", got, log)
	}

	// Stored before the check existed (written past `roost app set`): the
	// node refuses it when it would call it.
	conn, err := pgx.Connect(context.Background(), e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), `UPDATE apps SET settings = jsonb_set(settings, '{webhook,url}', to_jsonb($1::text)) WHERE id = $2`,
		"http://169.254.169.254:80/latest", testApp); err != nil {
		t.Fatal(err)
	}
	prototest.WaitFor(t, 30*time.Second, func() error {
		if l := n.LogTail(400); !strings.Contains(l, `hook call refused (counted as a failure; change the app's URL)" addr=169.254.169.254:80 why="a link-local address`) {
			pub()
			return fmt.Errorf("no refusal of 169.254.169.254 logged yet")
		}
		return nil
	})
}
