package test

import (
	"bytes"
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
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/roost-chat/roost/pubsub/redistest"
	"github.com/roost-chat/roost/test/harness"
)

// The server API's test app: its current secret, and the previous one,
// still valid during a rotation.
const (
	apiSecret     = "api-current-secret-0123456789"
	apiPrevSecret = "api-previous-secret-0123456789"
	apiMaxMsg     = 1024
)

// writeAPIApps writes an app registry holding testApp mid-rotation.
func writeAPIApps(t *testing.T) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "apps.json")
	body := fmt.Sprintf(`{"apps":[{"id":%q,"secret":%q,"previous_secret":%q,"previous_until":%q,"limits":{"max_msg":%d}}]}`,
		testApp, apiSecret, apiPrevSecret, time.Now().Add(time.Hour).UTC().Format(time.RFC3339), apiMaxMsg)
	if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// apiNode starts a node of e with the registry apps and its server API on
// a free port; it returns the node and the API's base URL.
func apiNode(t *testing.T, e *env, name, apps string, extra ...string) (*roostNode, string) {
	t.Helper()
	addr := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t, false))
	// launchNode passes --api off; a later flag wins.
	n, err := launchNode(t, e, name, append([]string{"--apps", apps, "--api", addr}, extra...))
	if err != nil {
		t.Fatal(err)
	}
	return n, "http://" + addr
}

// apiAnswer is an API answer: status and the decoded JSON.
type apiAnswer struct {
	status int
	body   []byte
	header http.Header
}

func (a apiAnswer) code() string {
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	_ = json.Unmarshal(a.body, &e)
	return e.Error.Code
}

func apiCall(t *testing.T, method, url, secret, body string) apiAnswer {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if secret != "" {
		req.Header.Set("Authorization", "Bearer "+secret)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return apiAnswer{status: resp.StatusCode, body: b, header: resp.Header}
}

// want fails the test unless a has the status (and, for errors, the code).
func (a apiAnswer) want(t *testing.T, what string, status int, code string) {
	t.Helper()
	if a.status != status || code != "" && a.code() != code {
		t.Fatalf("%s: got %d %s, want %d %s", what, a.status, a.body, status, code)
	}
	if status >= 400 && !bytes.HasPrefix(a.body, []byte(`{"error":{"code":`)) {
		t.Fatalf("%s: error body %s is not {\"error\":{...}}", what, a.body)
	}
}

// storedRows counts the messages of the test's database, or those of one
// (from, id).
func storedRows(t *testing.T, dbURL, from, id string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var n int
	q, args := `SELECT count(*) FROM messages`, []any{}
	if from != "" {
		q, args = q+` WHERE sender = $1 AND idem_key = $2`, []any{from, []byte(id)}
	}
	if err := c.QueryRow(ctx, q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestServerAPI: every route with no, a wrong, the current and the
// rotated-out-but-valid secret; a publish through the API reaches members
// on two nodes, once, with the same idempotency as a socket's; bad input
// gets its status and never reaches the database; disconnect closes the
// user's connections on both nodes.
func TestServerAPI(t *testing.T) {
	redistest.Require(t)
	e := newEnv(t, redistest.Addr)
	apps := writeAPIApps(t)
	n0, api0 := apiNode(t, e, "node0", apps)
	n1, api1 := apiNode(t, e, "node1", apps)

	alice := dialClient(t, n0, "alice")
	bob := dialClient(t, n1, "bob")
	alice.join(t, "r")
	bob.join(t, "r")

	base := api0 + "/v1/apps/" + testApp
	pubURL := base + "/rooms/r/messages"
	const body = `{"t": 1.50, "s":"\u00e9\n", "n":[1e3,-0]}`
	pub := `{"id":"k-1","from":"backend","body":` + body + `}`

	// Secrets, on every route.
	routes := []struct{ method, url, body string }{
		{"POST", pubURL, pub},
		{"GET", pubURL + "?after=0", ""},
		{"GET", base + "/rooms/r", ""},
		{"POST", base + "/users/nobody/disconnect", ""},
	}
	for _, r := range routes {
		what := r.method + " " + strings.TrimPrefix(r.url, api0)
		apiCall(t, r.method, r.url, "", r.body).want(t, what+" without a secret", 401, "forbidden")
		apiCall(t, r.method, r.url, "not-the-secret-0123456789", r.body).want(t, what+" with a wrong secret", 401, "forbidden")
		apiCall(t, r.method, r.url, apiSecret+"x", r.body).want(t, what+" with a longer secret", 401, "forbidden")
	}
	if n := storedRows(t, e.dbURL, "", ""); n != 0 {
		t.Fatalf("refused publishes stored %d messages", n)
	}
	apiCall(t, "GET", strings.Replace(pubURL, testApp, "other", 1), apiSecret, "").want(t, "another app with this app's secret", 401, "forbidden")

	// Publish with the current secret, then the previous one.
	a := apiCall(t, "POST", pubURL, apiSecret, pub)
	a.want(t, "publish", 200, "")
	if string(a.body) != `{"room":"r","seq":1,"id":"k-1"}`+"\n" {
		t.Fatalf("publish answered %s", a.body)
	}
	a = apiCall(t, "POST", pubURL, apiPrevSecret, `{"id":"k-2","from":"backend","body":"two"}`)
	a.want(t, "publish with the previous secret", 200, "")
	if !strings.Contains(string(a.body), `"seq":2`) {
		t.Fatalf("second publish answered %s", a.body)
	}
	// The same (from, id) again, through the other node: the same seq,
	// nothing stored or delivered twice.
	a = apiCall(t, "POST", api1+"/v1/apps/"+testApp+"/rooms/r/messages", apiSecret, pub)
	a.want(t, "repeated publish", 200, "")
	if string(a.body) != `{"room":"r","seq":1,"id":"k-1"}`+"\n" {
		t.Fatalf("repeated publish answered %s, want seq 1", a.body)
	}
	// A socket publish of the same (from, id) is the same message too.
	backend := dialClient(t, n1, "backend")
	if err := backend.send(`{"op":"pub","room":"r","id":"k-1","body":"other"}`); err != nil {
		t.Fatal(err)
	}
	redistest.WaitFor(t, 5*time.Second, func() error {
		backend.mu.Lock()
		defer backend.mu.Unlock()
		if s, ok := backend.acks["r\x00k-1"]; !ok || s != 1 {
			return fmt.Errorf("socket publish of the same id: acks %v", backend.acks)
		}
		return nil
	})
	if n := storedRows(t, e.dbURL, "backend", "k-1"); n != 1 {
		t.Fatalf("(backend, k-1) stored %d times", n)
	}
	for _, c := range []*wsClient{alice, bob} {
		redistest.WaitFor(t, 5*time.Second, func() error { return checkSeqs(c.seqs("r"), 2) })
	}

	// Bad input: its status, and nothing stored.
	stored := storedRows(t, e.dbURL, "", "")
	big := `{"id":"k-big","from":"backend","body":"` + strings.Repeat("x", apiMaxMsg) + `"}`
	huge := `{"id":"k-huge","from":"backend","body":"` + strings.Repeat("x", 64<<10) + `"}`
	for _, c := range []struct {
		what, url, body string
		status          int
		code            string
	}{
		{"bad room", base + "/rooms/bad%20room/messages", pub, 400, "bad_request"},
		{"room too long", base + "/rooms/" + strings.Repeat("r", 129) + "/messages", pub, 400, "bad_request"},
		{"bad app id", api0 + "/v1/apps/b%21d/rooms/r/messages", pub, 400, "bad_request"},
		{"NUL in from", pubURL, `{"id":"k-3","from":"a\u0000b","body":1}`, 400, "bad_request"},
		{"control character in from", pubURL, `{"id":"k-3","from":"a\u001fb","body":1}`, 400, "bad_request"},
		{"no from", pubURL, `{"id":"k-3","body":1}`, 400, "bad_request"},
		{"no id", pubURL, `{"from":"backend","body":1}`, 400, "bad_request"},
		{"id too long", pubURL, `{"id":"` + strings.Repeat("i", 65) + `","from":"backend","body":1}`, 400, "bad_request"},
		{"id not a string", pubURL, `{"id":3,"from":"backend","body":1}`, 400, "bad_request"},
		{"no body", pubURL, `{"id":"k-3","from":"backend"}`, 400, "bad_request"},
		{"invalid JSON body", pubURL, `{"id":"k-3","from":"backend","body":{bad}}`, 400, "bad_request"},
		{"truncated JSON", pubURL, `{"id":"k-3","from":"backend","body":[1,2`, 400, "bad_request"},
		{"invalid UTF-8", pubURL, "{\"id\":\"k-3\",\"from\":\"backend\",\"body\":\"\xff\"}", 400, "bad_request"},
		{"body over the app's max_msg", pubURL, big, 413, "too_large"},
		{"request far over the app's max_msg", pubURL, huge, 413, "too_large"},
	} {
		apiCall(t, "POST", c.url, apiSecret, c.body).want(t, c.what, c.status, c.code)
	}
	if n := storedRows(t, e.dbURL, "", ""); n != stored {
		t.Fatalf("bad requests stored %d messages", n-stored)
	}
	apiCall(t, "GET", base+"/rooms/bad%20room", apiSecret, "").want(t, "room: bad name", 400, "bad_request")
	apiCall(t, "GET", pubURL+"?after=1&before=2", apiSecret, "").want(t, "history: after and before", 400, "bad_request")
	apiCall(t, "GET", pubURL+"?limit=0", apiSecret, "").want(t, "history: limit 0", 400, "bad_request")
	apiCall(t, "GET", pubURL+"?after=-1", apiSecret, "").want(t, "history: negative after", 400, "bad_request")
	apiCall(t, "POST", base+"/users/a%00b/disconnect", apiSecret, "").want(t, "disconnect: NUL in user", 400, "bad_request")
	apiCall(t, "DELETE", pubURL, apiSecret, "").want(t, "unknown route", 404, "not_found")

	// History and the room, with both secrets, on the other node.
	type history struct {
		Room     string            `json:"room"`
		Epoch    string            `json:"epoch"`
		Messages []json.RawMessage `json:"messages"`
		More     bool              `json:"more"`
	}
	var h history
	a = apiCall(t, "GET", api1+"/v1/apps/"+testApp+"/rooms/r/messages?after=0", apiPrevSecret, "")
	a.want(t, "history after 0", 200, "")
	if err := json.Unmarshal(a.body, &h); err != nil || h.Room != "r" || h.Epoch == "" || len(h.Messages) != 2 || h.More {
		t.Fatalf("history answered %s (%v)", a.body, err)
	}
	// Messages are the msg objects, the body byte for byte.
	if !strings.HasPrefix(string(h.Messages[0]), `{"op":"msg","room":"r","seq":1,"id":"k-1","from":"backend","ts":`) ||
		!strings.HasSuffix(string(h.Messages[0]), `"body":`+body+`}`) {
		t.Fatalf("history message %s", h.Messages[0])
	}
	a = apiCall(t, "GET", pubURL+"?before=3&limit=1", apiSecret, "")
	a.want(t, "history before 3", 200, "")
	if err := json.Unmarshal(a.body, &h); err != nil || len(h.Messages) != 1 || !strings.Contains(string(h.Messages[0]), `"seq":2`) {
		t.Fatalf("history before=3&limit=1 answered %s", a.body)
	}
	a = apiCall(t, "GET", pubURL+"?after=1&limit=1000", apiSecret, "")
	a.want(t, "history after 1", 200, "")
	if err := json.Unmarshal(a.body, &h); err != nil || len(h.Messages) != 1 || !strings.Contains(string(h.Messages[0]), `"seq":2`) {
		t.Fatalf("history after=1 answered %s", a.body)
	}
	epoch := h.Epoch
	// alice (node0) and bob (node1) are in the room: presence counts them
	// on every node, once each node's next presence tick applied them.
	for _, sec := range []string{apiSecret, apiPrevSecret} {
		want := `{"room":"r","epoch":"` + epoch + `","seq":2,"presence":{"count":2}}` + "\n"
		redistest.WaitFor(t, 5*time.Second, func() error {
			a = apiCall(t, "GET", base+"/rooms/r", sec, "")
			a.want(t, "room", 200, "")
			if string(a.body) != want {
				return fmt.Errorf("room answered %s, want %s", a.body, want)
			}
			return nil
		})
	}

	// Disconnect: carol has a connection on each node; the call on node0
	// closes both, and counts the one of node0.
	carol0 := dialClient(t, n0, "carol")
	carol1 := dialClient(t, n1, "carol")
	carol0.join(t, "r")
	carol1.join(t, "r")
	a = apiCall(t, "POST", base+"/users/carol/disconnect", apiPrevSecret, "")
	a.want(t, "disconnect", 200, "")
	if string(a.body) != `{"closed":1}`+"\n" {
		t.Fatalf("disconnect answered %s, want closed 1 (node0's connection)", a.body)
	}
	for _, c := range []*wsClient{carol0, carol1} {
		redistest.WaitFor(t, 5*time.Second, func() error {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.closeCode != 1008 || !c.dead() {
				return fmt.Errorf("carol on %s: close code %d", c.node.Name, c.closeCode)
			}
			return nil
		})
	}
	if alice.dead() || bob.dead() {
		t.Fatal("disconnecting carol closed another user")
	}
	a = apiCall(t, "POST", base+"/users/carol/disconnect", apiSecret, "")
	if a.status != 200 || string(a.body) != `{"closed":0}`+"\n" {
		t.Fatalf("second disconnect answered %d %s", a.status, a.body)
	}
	m := n1.Metrics(t)
	if m["roost_disconnected_total"] != 1 {
		t.Fatalf("node1 roost_disconnected_total = %v, want 1", m["roost_disconnected_total"])
	}
	m = n0.Metrics(t)
	if m[`roost_api_requests_total{route="publish",code="ok"}`] < 2 || m[`roost_api_requests_total{route="publish",code="too_large"}`] != 2 || m["roost_api_published_total"] != 2 {
		t.Fatalf("node0 API metrics: publish ok %v, too_large %v, published %v", m[`roost_api_requests_total{route="publish",code="ok"}`],
			m[`roost_api_requests_total{route="publish",code="too_large"}`], m["roost_api_published_total"])
	}
}

// TestServerAPIRateLimit: past --api-rate and --api-burst an app gets 429
// rate_limited with a retry hint, and another request later succeeds.
func TestServerAPIRateLimit(t *testing.T) {
	redistest.Require(t)
	e := newEnv(t, redistest.Addr)
	_, api0 := apiNode(t, e, "node0", writeAPIApps(t), "--api-rate", "2", "--api-burst", "3")
	url := api0 + "/v1/apps/" + testApp + "/rooms/r"
	for i := 0; i < 3; i++ {
		apiCall(t, "GET", url, apiSecret, "").want(t, fmt.Sprintf("request %d of the burst", i+1), 200, "")
	}
	a := apiCall(t, "GET", url, apiSecret, "")
	a.want(t, "request past the burst", 429, "rate_limited")
	if a.header.Get("Retry-After") == "" || !strings.Contains(string(a.body), `"retry_after":`) {
		t.Fatalf("429 without a retry hint: %v %s", a.header, a.body)
	}
	// Requests without the secret spend nothing of the app's rate.
	time.Sleep(600 * time.Millisecond)
	apiCall(t, "GET", url, "", "").want(t, "no secret", 401, "forbidden")
	apiCall(t, "GET", url, apiSecret, "").want(t, "after a wait", 200, "")
}

// TestWebhooksFromNode: `roost app set --webhook-url` reaches a running
// node, which POSTs the messages of the rooms it names, published through
// the API and through sockets, to a real receiver: every one, in seq
// order, signed with both secrets of the rotation.
func TestWebhooksFromNode(t *testing.T) {
	redistest.Require(t)
	type event struct {
		Type string `json:"type"`
		Room string `json:"room"`
		Seq  uint64 `json:"seq"`
		ID   string `json:"id"`
		From string `json:"from"`
	}
	var mu sync.Mutex
	var got []event
	var badSig string
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		ts := r.Header.Get("X-Roost-Timestamp")
		want := []string{}
		for _, s := range []string{apiSecret, apiPrevSecret} {
			m := hmac.New(sha256.New, []byte(s))
			m.Write([]byte(ts + "." + string(body)))
			want = append(want, "sha256="+hex.EncodeToString(m.Sum(nil)))
		}
		var p struct {
			App    string  `json:"app"`
			Events []event `json:"events"`
		}
		_ = json.Unmarshal(body, &p)
		mu.Lock()
		defer mu.Unlock()
		if sig := r.Header.Get("X-Roost-Signature"); sig != strings.Join(want, ",") && badSig == "" {
			badSig = sig
		}
		if p.App != testApp {
			badSig = "app " + p.App
		}
		got = append(got, p.Events...)
	}))
	t.Cleanup(recv.Close)

	e := newEnv(t, redistest.Addr)
	apps := writeAPIApps(t)
	set := exec.Command(harness.Binary(t), "app", "set", testApp, "--apps", apps, "--webhook-url", recv.URL+"/hook", "--webhook-rooms", "r*", "--webhook-timeout", "2s")
	if out, err := set.CombinedOutput(); err != nil || !strings.Contains(string(out), `"webhook"`) {
		t.Fatalf("roost app set --webhook-url: %v\n%s", err, out)
	}
	n0, api0 := apiNode(t, e, "node0", apps)
	alice := dialClient(t, n0, "alice")
	const total = 300
	for i := 1; i <= total; i++ {
		if i%3 == 0 {
			if err := alice.send(fmt.Sprintf(`{"op":"pub","room":"r1","id":"s-%d","body":%d}`, i, i)); err != nil {
				t.Fatal(err)
			}
			continue
		}
		apiCall(t, "POST", api0+"/v1/apps/"+testApp+"/rooms/r1/messages", apiSecret, fmt.Sprintf(`{"id":"a-%d","from":"bot","body":%d}`, i, i)).want(t, "publish", 200, "")
	}
	apiCall(t, "POST", api0+"/v1/apps/"+testApp+"/rooms/other/messages", apiSecret, `{"id":"o-1","from":"bot","body":1}`).want(t, "publish elsewhere", 200, "")
	redistest.WaitFor(t, 15*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if badSig != "" {
			return fmt.Errorf("bad signature or app: %s", badSig)
		}
		next := uint64(1)
		for _, ev := range got {
			switch {
			case ev.Room != "r1" || ev.Type != "msg":
				return fmt.Errorf("event %+v: not of room r1", ev)
			case ev.Seq == next:
				next++
			case ev.Seq > next:
				return fmt.Errorf("seq %d arrived before %d", ev.Seq, next)
			}
		}
		if next != total+1 {
			return fmt.Errorf("delivered up to seq %d of %d", next-1, total)
		}
		return nil
	})
	m := n0.Metrics(t)
	dropped := `roost_webhook_dropped_total{app="` + testApp + `"}`
	if v, ok := m[dropped]; m["roost_webhook_delivered_total"] < total || !ok || v != 0 {
		t.Fatalf("webhook metrics: delivered %v, dropped %v (exposed %v)", m["roost_webhook_delivered_total"], v, ok)
	}
}

// BenchmarkWebhookThroughNode: messages published through the server API
// of a real node (PostgreSQL store, Redis broker) to one app whose webhook
// is a local receiver answering 200 at once. It reports the delivered
// rate and the lag from each message's commit (its ts) to the receiver's
// read. "max" publishes from 100 concurrent backends as fast as the node
// commits; "1000/s" paces them at 1,000 a second.
//
//	go test -run XXX -bench WebhookThroughNode -benchtime 5000x .
func BenchmarkWebhookThroughNode(b *testing.B) {
	b.Run("max", func(b *testing.B) { benchWebhookNode(b, 0) })
	b.Run("1000/s", func(b *testing.B) { benchWebhookNode(b, 1000) })
}

func benchWebhookNode(b *testing.B, rate int) {
	redistest.Require(b)
	var mu sync.Mutex
	var lags []float64
	done := make(chan struct{})
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		now := float64(time.Now().UnixMicro()) / 1000
		var p struct {
			Events []struct{ TS int64 } `json:"events"`
		}
		_ = json.Unmarshal(body, &p)
		mu.Lock()
		defer mu.Unlock()
		for _, e := range p.Events {
			lags = append(lags, now-float64(e.TS))
		}
		if len(lags) >= b.N {
			select {
			case <-done:
			default:
				close(done)
			}
		}
	}))
	defer recv.Close()
	e := newEnv(b, redistest.Addr)
	f := filepath.Join(b.TempDir(), "apps.json")
	body := fmt.Sprintf(`{"apps":[{"id":%q,"secret":%q,"webhook":{"url":%q}}]}`, testApp, apiSecret, recv.URL)
	if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
		b.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(b, false))
	node, err := launchNode(b, e, "node0", []string{"--apps", f, "--api", addr, "--api-rate", "0"})
	if err != nil {
		b.Fatal(err)
	}
	url := "http://" + addr + "/v1/apps/" + testApp + "/rooms/r/messages"
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 100}, Timeout: 10 * time.Second}
	jobs := make(chan int, 64)
	var wg sync.WaitGroup
	for w := 0; w < 100; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				req, _ := http.NewRequest("POST", url, strings.NewReader(fmt.Sprintf(`{"id":"m-%d","from":"bot","body":%d}`, i, i)))
				req.Header.Set("Authorization", "Bearer "+apiSecret)
				resp, err := client.Do(req)
				if err != nil {
					b.Error(err)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Errorf("publish: %s", resp.Status)
				}
			}
		}()
	}
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if rate > 0 {
			time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))))
		}
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		b.Fatalf("delivered %d of %d", len(lags), b.N)
	}
	el := time.Since(start)
	b.StopTimer()
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(lags)
	b.ReportMetric(float64(b.N)/el.Seconds(), "msgs/s")
	b.ReportMetric(lags[len(lags)/2], "lag-p50-ms")
	b.ReportMetric(lags[len(lags)*99/100], "lag-p99-ms")
	// The node's own part: from the commit's hand-off to the webhooks to
	// the POST's 2xx (roost_webhook_lag_seconds), as the bucket bound
	// under which 99 % of the events fall.
	m := node.Metrics(b)
	if total := m["roost_webhook_lag_seconds_count"]; total > 0 {
		for _, le := range []string{"0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5"} {
			if m[`roost_webhook_lag_seconds_bucket{le="`+le+`"}`] >= 0.99*total {
				v, _ := strconv.ParseFloat(le, 64)
				b.ReportMetric(v*1000, "hook-p99≤ms")
				break
			}
		}
	}
}
