package main

// Tests of the operator's side of `roost serve`: /metrics after a scripted
// session, configuration precedence and validation, and the drain on
// SIGTERM of the real binary.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/roost-chat/roost/persist/pgtest"
	"github.com/roost-chat/roost/proto/prototest"
	"github.com/roost-chat/roost/pubsub/redistest"
	"github.com/roost-chat/roost/test/harness"
)

// opsFrame is a received frame with its JSON decoded.
type opsFrame struct {
	prototest.Frame
	json map[string]any
}

// opsClient is the shared wire client with the test's failure handling.
type opsClient struct {
	*prototest.Client
	t testing.TB
}

func dialOps(t testing.TB, addr, query string) *opsClient {
	t.Helper()
	return &opsClient{prototest.DialT(t, "ws://"+addr+"/ws?"+query, prototest.Options{}), t}
}

func (c *opsClient) send(s string) error { return c.Send(s) }

// expect reads the next frame, within 5s, and checks that it is op.
func (c *opsClient) expect(op string) opsFrame {
	c.t.Helper()
	f, m, err := c.Expect(op, 5*time.Second)
	if err != nil {
		c.t.Fatal(err)
	}
	return opsFrame{f, m}
}

// logAddr finds the addr attribute of the JSON log line with message msg.
func logAddr(log, msg string) string {
	for _, line := range strings.Split(log, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == msg {
			if a, ok := m["addr"].(string); ok {
				return a
			}
		}
	}
	return ""
}

// inProcessNode runs serve() in this process, as main runs it, until the
// test ends; it returns the client and admin addresses.
func inProcessNode(t *testing.T, args ...string) (addr, admin string) {
	addr, admin, _ = inProcessNodeStop(t, args...)
	return addr, admin
}

// inProcessNodeStop is inProcessNode with a stop function: SIGTERM as the
// signal handler would deliver it, then wait for serve to return 0.
func inProcessNodeStop(t *testing.T, args ...string) (addr, admin string, stop func()) {
	return inProcessServe(t, append([]string{"--insecure"}, args...)...)
}

// inProcessServe is inProcessNodeStop without --insecure.
func inProcessServe(t *testing.T, args ...string) (addr, admin string, stop func()) {
	t.Helper()
	sig := make(chan os.Signal, 1)
	logs := &harness.SyncBuffer{}
	done := make(chan int, 1)
	args = append([]string{"--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--api", "off", "--log-format", "json", "--loops", "2", "--flush", "1ms", "--drain", "100ms"}, args...)
	go func() { done <- serve(args, io.Discard, logs, sig) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			sig <- syscall.SIGTERM
			select {
			case code := <-done:
				if code != 0 {
					t.Errorf("serve exited %d\n%s", code, logs)
				}
			case <-time.After(10 * time.Second):
				t.Errorf("serve did not stop within 10s\n%s", logs)
			}
		})
	}
	t.Cleanup(stop)
	deadline := time.Now().Add(10 * time.Second)
	for addr == "" || admin == "" {
		select {
		case code := <-done:
			t.Fatalf("serve exited %d\n%s", code, logs)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("node did not start\n%s", logs)
		}
		time.Sleep(5 * time.Millisecond)
		l := logs.String()
		addr, admin = logAddr(l, "roost serving"), logAddr(l, "admin listening")
	}
	return addr, admin, stop
}

// scrape reads /metrics into series -> value (series include labels).
func scrape(t testing.TB, admin string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Fatalf("/metrics Content-Type %q", ct)
	}
	m := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("bad sample line %q", line)
		}
		m[line[:i]] = v
	}
	return m
}

func TestMetricsAfterScriptedSession(t *testing.T) {
	addr, admin := inProcessNode(t)
	const receivers, pubs = 3, 5

	var framesOut, bytesOut float64
	count := func(f opsFrame) { framesOut++; bytesOut += float64(f.Size) }

	var rs []*opsClient
	for i := 0; i < receivers; i++ {
		c := dialOps(t, addr, fmt.Sprintf("user=r%d&app=mx", i))
		if err := c.send(`{"op":"join","room":"lobby"}`); err != nil {
			t.Fatal(err)
		}
		count(c.expect("joined"))
		rs = append(rs, c)
	}
	pub := dialOps(t, addr, "user=p&app=other")
	pubRoom := dialOps(t, addr, "user=p2&app=mx") // publishes into the receivers' room
	for i := 0; i < pubs; i++ {
		if err := pubRoom.send(fmt.Sprintf(`{"op":"pub","room":"lobby","id":"m%d","body":{"n":%d}}`, i, i)); err != nil {
			t.Fatal(err)
		}
		count(pubRoom.expect("ack"))
	}
	for _, c := range rs {
		for i := 0; i < pubs; i++ {
			f := c.expect("msg")
			if f.json["seq"] != float64(i+1) {
				t.Fatalf("msg %d has seq %v", i, f.json["seq"])
			}
			count(f)
		}
	}
	_ = pub

	// A frame is counted once the loop's write returns, which can be after
	// its receiver has read it: the counters settle within a moment of the
	// last frame read, so the check waits for them (and reports every
	// mismatch of its last scrape if they never settle).
	var m map[string]float64
	var bad []string
	deadline := time.Now().Add(5 * time.Second)
	for {
		m = scrape(t, admin)
		bad = bad[:0]
		want := map[string]float64{
			`roost_connections{app="mx"}`:          receivers + 1,
			`roost_connections{app="other"}`:       1,
			"roost_connections_total_open":         receivers + 2,
			"roost_accepted_total":                 receivers + 2,
			"roost_upgrading_connections":          0,
			"roost_room_memberships":               receivers,
			"roost_rooms":                          1,
			"roost_frames_in_total":                receivers + pubs,
			"roost_frames_out_total":               framesOut,
			"roost_bytes_out_total":                bytesOut,
			"roost_write_frames_sum":               framesOut,
			"roost_publishes_total":                pubs,
			"roost_acks_total":                     pubs,
			"roost_publishes_in_flight":            0,
			"roost_publish_latency_seconds_count":  pubs,
			"roost_ack_latency_seconds_count":      pubs,
			"roost_broker_publish_seconds_count":   pubs,
			"roost_commit_batch_size_sum":          pubs,
			"roost_store_errors_total":             0,
			"roost_slow_consumer_closes_total":     0,
			"roost_broker_errors_total":            0,
			`roost_write_frames_bucket{le="+Inf"}`: m["roost_writes_total"],
			"roost_commit_batch_size_count":        m["roost_commit_batches_total"],
		}
		// Every ack's time split: one observation per phase per ack.
		for _, ph := range []string{"queue", "pipeline", "window", "commit", "answer", "broker", "inbox", "write"} {
			want[`roost_ack_phase_seconds_count{phase="`+ph+`"}`] = pubs
		}
		for k, v := range want {
			if got, ok := m[k]; !ok {
				bad = append(bad, k+" missing from /metrics")
			} else if got != v {
				bad = append(bad, fmt.Sprintf("%s = %v, want %v", k, got, v))
			}
		}
		if len(bad) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	sort.Strings(bad)
	for _, b := range bad {
		t.Error(b)
	}
	if m["roost_writes_total"] < 1 || m["roost_writes_total"] > framesOut {
		t.Errorf("roost_writes_total = %v, want 1..%v", m["roost_writes_total"], framesOut)
	}
	if _, ok := m[`roost_loop_inbox_depth{loop="0"}`]; !ok {
		t.Errorf("no inbox depth gauge for loop 0")
	}

	// Leave one room, close one receiver: the gauges follow.
	if err := rs[0].send(`{"op":"leave","room":"lobby"}`); err != nil {
		t.Fatal(err)
	}
	rs[0].expect("left")
	rs[1].Conn().Close()
	redistest.WaitFor(t, 5*time.Second, func() error {
		m := scrape(t, admin)
		if m["roost_room_memberships"] != receivers-2 || m[`roost_connections{app="mx"}`] != receivers {
			return fmt.Errorf("memberships %v, mx connections %v; want %d and %d",
				m["roost_room_memberships"], m[`roost_connections{app="mx"}`], receivers-2, receivers)
		}
		return nil
	})

	// Plain HTTP on the client listener (the demo page) is not a connection.
	resp, err := http.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	redistest.WaitFor(t, 5*time.Second, func() error {
		m := scrape(t, admin)
		if m["roost_upgrading_connections"] != 0 || m["roost_connections_total_open"] != receivers+1 {
			return fmt.Errorf("upgrading %v, open %v after a plain GET /", m["roost_upgrading_connections"], m["roost_connections_total_open"])
		}
		return nil
	})
}

func TestAdminHealthAndReadiness(t *testing.T) {
	_, admin := inProcessNode(t)
	for path, want := range map[string]string{"/healthz": " conns=0 rooms=0", "/readyz": "ready", "/debug/pprof/": "goroutine"} {
		resp, err := http.Get("http://" + admin + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), want) {
			t.Errorf("GET %s: %d %q, want 200 containing %q", path, resp.StatusCode, b, want)
		}
	}
}

func TestConfigPrecedence(t *testing.T) {
	file := []byte(`# a comment
loops = 3
max-rooms = 7
--publish-workers = 5
listen = "127.0.0.1:7001"
database-url = postgres://app:filepw@db:5432/chat
`)
	env := map[string]string{
		"ROOST_CONFIG":     "/etc/roost.conf",
		"ROOST_MAX_ROOMS":  "9",
		"ROOST_LISTEN":     "127.0.0.1:7002",
		"REDIS_URL":        "redis://:redispw@127.0.0.1:6379",
		"ROOST_APP_SECRET": "a=s3cret,b=other",
	}
	var c config
	errs := parse([]string{"--listen", "127.0.0.1:7003"}, &c, io.Discard,
		func(k string) (string, bool) { v, ok := env[k]; return v, ok },
		func(path string) ([]byte, error) {
			if path != "/etc/roost.conf" {
				return nil, fmt.Errorf("no file %s", path)
			}
			return file, nil
		})
	if len(errs) > 0 {
		t.Fatalf("errors: %v", errs)
	}
	checks := []struct{ got, want, source, wantSource string }{
		{c.node.Listen, "127.0.0.1:7003", c.source["listen"], "flag"},
		{strconv.Itoa(c.node.MaxRooms), "9", c.source["max-rooms"], "env ROOST_MAX_ROOMS"},
		{strconv.Itoa(c.node.Loops), "3", c.source["loops"], "file /etc/roost.conf:2"},
		{strconv.Itoa(c.workers), "5", c.source["publish-workers"], "file /etc/roost.conf:4"},
		{c.redisURL, "redis://:redispw@127.0.0.1:6379", c.source["redis-url"], "env REDIS_URL"},
		{strconv.Itoa(c.batchMax), "256", c.source["batch-max"], "default"},
		{c.configFile, "/etc/roost.conf", c.source["config"], "env ROOST_CONFIG"},
	}
	for _, ch := range checks {
		if ch.got != ch.want || ch.source != ch.wantSource {
			t.Errorf("got %q from %q, want %q from %q", ch.got, ch.source, ch.want, ch.wantSource)
		}
	}
	if string(c.node.Apps["a"]) != "s3cret" || string(c.node.Apps["b"]) != "other" {
		t.Errorf("apps %v", c.node.Apps)
	}

	var out bytes.Buffer
	if err := printConfig(&out, &c); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, secret := range []string{"s3cret", "other", "filepw", "redispw"} {
		if strings.Contains(s, secret) {
			t.Errorf("print-config shows secret %q:\n%s", secret, s)
		}
	}
	for _, line := range []string{
		`app-secret\s+a=\*\*\*\*\*,b=\*\*\*\*\*\s+env ROOST_APP_SECRET`,
		`database-url\s+postgres://app:\*\*\*\*\*@db:5432/chat\s+file /etc/roost.conf:6`,
		`redis-url\s+redis://:\*\*\*\*\*@127.0.0.1:6379\s+env REDIS_URL`,
		`listen\s+127.0.0.1:7003\s+flag`,
		`batch-window\s+10ms\s+default`,
		// The pool size it computes from the 5 publish workers, not a bare default.
		`pg-max-conns\s+24 \(4 x publish workers \+ 4\)\s+default`,
	} {
		if !regexp.MustCompile(`(?m)^` + line + `$`).MatchString(s) {
			t.Errorf("print-config lacks a line matching %s:\n%s", line, s)
		}
	}
	// Every setting is printed.
	var shadow config
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	flags(&shadow, fs)
	n := 0
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name != "print-config" {
			n++
			if !regexp.MustCompile(`(?m)^` + f.Name + `\s`).MatchString(s) {
				t.Errorf("print-config lacks %s", f.Name)
			}
		}
	})
	if !regexp.MustCompile(`(?m)^\(auth mode\)\s+token .*2 --app-secret app\(s\)\s+derived$`).MatchString(s) {
		t.Errorf("print-config lacks the auth mode:\n%s", s)
	}
	if lines := strings.Count(s, "\n") - 2; lines != n { // less the header and the auth mode
		t.Errorf("print-config has %d settings, want %d", lines, n)
	}
}

func TestConfigErrorsAllReported(t *testing.T) {
	file := []byte("loops = 0\nnonsense = 1\nthis line has no equals\n")
	env := map[string]string{"ROOST_MAX_FRAME": "big", "ROOST_CONFIG": "f"}
	var c config
	errs := parse([]string{"--idle", "3", "--log-level", "loud", "--insecure", "--listen", "10.1.2.3:80", "--redis-url", "http://x"}, &c, io.Discard,
		func(k string) (string, bool) { v, ok := env[k]; return v, ok },
		func(string) ([]byte, error) { return file, nil })
	want := []string{
		`invalid --idle "3" (from flag): want a duration`,
		`invalid --max-frame "big" (from env ROOST_MAX_FRAME): want a whole number`,
		`file f:2: unknown setting "nonsense"`,
		`file f:3: want key = value`,
		`invalid --loops 0: want 1 to 64`,
		`invalid --log-level "loud"`,
		`invalid --listen "10.1.2.3:80" with --insecure`,
		`invalid --redis-url "http://x"`,
	}
	got := make([]string, len(errs))
	for i, e := range errs {
		got[i] = e.Error()
	}
	joined := strings.Join(got, "\n")
	for _, w := range want {
		if !strings.Contains(joined, w) {
			t.Errorf("no error containing %q in:\n%s", w, joined)
		}
	}
	if len(errs) != len(want) {
		t.Errorf("%d errors, want %d (one per bad value):\n%s", len(errs), len(want), joined)
	}

	// Through the command: exit 2, each error on its own line naming the flag.
	var stderr bytes.Buffer
	if code := run([]string{"serve", "--loops", "0", "--keep", "0", "--insecure"}, io.Discard, &stderr); code != 2 {
		t.Fatalf("exit %d, want 2", code)
	}
	if s := stderr.String(); !strings.Contains(s, "--loops") || !strings.Contains(s, "--keep") || strings.Count(s, "\n") != 3 {
		t.Errorf("stderr:\n%s", s)
	}
	stderr.Reset()
	var stdout bytes.Buffer
	if code := run([]string{"serve", "--insecure", "--print-config"}, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "insecure") {
		t.Errorf("print-config: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
}

// With no secrets, a loopback listener runs in development mode (so `go
// run .` works), and any other listener is refused.
func TestNoSecretsImpliesDevelopmentOnLoopback(t *testing.T) {
	noEnv := func(string) (string, bool) { return "", false }
	noFile := func(string) ([]byte, error) { return nil, nil }
	var c config
	if errs := parse(nil, &c, io.Discard, noEnv, noFile); len(errs) != 0 {
		t.Fatalf("defaults: %v", errs)
	}
	if !c.node.Insecure || !c.impliedInsecure {
		t.Fatalf("defaults: insecure=%v implied=%v, want both", c.node.Insecure, c.impliedInsecure)
	}
	c = config{}
	errs := parse([]string{"--listen", "0.0.0.0:8080"}, &c, io.Discard, noEnv, noFile)
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "--app-secret") {
		t.Fatalf("public listener without secrets: %v", errs)
	}
	c = config{}
	if errs := parse([]string{"--app-secret", "a=s"}, &c, io.Discard, noEnv, noFile); len(errs) != 0 || c.node.Insecure {
		t.Fatalf("with a secret: insecure=%v errs=%v", c.node.Insecure, errs)
	}
}

func TestMetricsWithRedis(t *testing.T) {
	redistest.Require(t)
	addr, admin := inProcessNode(t, "--redis-url", "redis://"+redistest.Addr+"?prefix="+redistest.Prefix(t))
	r := dialOps(t, addr, "user=r&app=rx")
	if err := r.send(`{"op":"join","room":"a"}`); err != nil {
		t.Fatal(err)
	}
	r.expect("joined")
	for i := 0; i < 3; i++ {
		if err := r.send(fmt.Sprintf(`{"op":"pub","room":"a","id":"x%d","body":1}`, i)); err != nil {
			t.Fatal(err)
		}
	}
	for got := 0; got < 6; { // 3 acks and 3 msgs, in whatever order
		select {
		case f := <-r.Frames():
			if op := f.Map()["op"]; op == "ack" || op == "msg" {
				got++
			}
		case <-time.After(5 * time.Second):
			t.Fatal("acks and messages did not arrive")
		}
	}
	m := scrape(t, admin)
	for k, v := range map[string]float64{
		"roost_redis_published_total":      3,
		"roost_redis_received_total":       3,
		"roost_redis_publish_errors_total": 0,
		"roost_redis_subscribed_rooms":     1,
		"roost_acks_total":                 3,
	} {
		if m[k] != v {
			t.Errorf("%s = %v, want %v", k, m[k], v)
		}
	}
	// One broker round trip per commit batch: the three publishes were
	// sent at once, so they took one to three.
	if n := m["roost_broker_publish_seconds_count"]; n < 1 || n > 3 {
		t.Errorf("roost_broker_publish_seconds_count = %v, want 1 to 3", n)
	}
	resp, err := http.Get("http://" + admin + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("/readyz with Redis up: %s", resp.Status)
	}
}

// serve refuses a database whose schema is behind the binary, naming the
// fix; --migrate brings it up to date and serves.
func TestServeRefusesOutdatedSchema(t *testing.T) {
	url := pgtest.NewDB(t) // empty: no migration applied
	logs := &harness.SyncBuffer{}
	sig := make(chan os.Signal, 1)
	done := make(chan int, 1)
	go func() {
		done <- serve([]string{"--insecure", "--listen", "127.0.0.1:0", "--admin", "off", "--api", "off", "--database-url", url}, io.Discard, logs, sig)
	}()
	var code int
	select {
	case code = <-done:
	case <-time.After(10 * time.Second):
		sig <- syscall.SIGTERM
		<-done
		t.Fatalf("serve ran on an unmigrated database:\n%s", logs)
	}
	if code != 1 || !strings.Contains(logs.String(), "roost migrate") || !strings.Contains(logs.String(), "--migrate") {
		t.Fatalf("exit %d, want 1 naming roost migrate and --migrate:\n%s", code, logs)
	}
	addr, _ := inProcessNode(t, "--database-url", url, "--migrate")
	if addr == "" {
		t.Fatal("node with --migrate did not serve")
	}
}

// The proxy pool's sizes come from flags, the environment or the config
// file like every setting, reach the node's config, and are checked.
func TestProxyPoolSettings(t *testing.T) {
	parseWith := func(args []string, env map[string]string, file string) (config, string) {
		var c config
		errs := parse(args, &c, io.Discard,
			func(k string) (string, bool) { v, ok := env[k]; return v, ok },
			func(string) ([]byte, error) { return []byte(file), nil })
		var msgs []string
		for _, e := range errs {
			msgs = append(msgs, e.Error())
		}
		return c, strings.Join(msgs, "\n")
	}
	c, errs := parseWith(nil, nil, "")
	if errs != "" || c.node.ProxyInFlight != 32 || c.node.ProxyQueue != 1024 {
		t.Fatalf("defaults: inflight %d, queue %d, errors %s", c.node.ProxyInFlight, c.node.ProxyQueue, errs)
	}
	c, errs = parseWith([]string{"--config", "f"}, map[string]string{"ROOST_PROXY_QUEUE": "64"}, "proxy-inflight = 8\nproxy-queue = 9\n")
	if errs != "" || c.node.ProxyInFlight != 8 || c.node.ProxyQueue != 64 || c.source["proxy-inflight"] != "file f:1" || c.source["proxy-queue"] != "env ROOST_PROXY_QUEUE" {
		t.Fatalf("inflight %d from %s, queue %d from %s, errors %s", c.node.ProxyInFlight, c.source["proxy-inflight"], c.node.ProxyQueue, c.source["proxy-queue"], errs)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--proxy-inflight", "0"}, "invalid --proxy-inflight 0: want 1 to 4096"},
		{[]string{"--proxy-inflight", "5000"}, "invalid --proxy-inflight 5000: want 1 to 4096"},
		{[]string{"--proxy-queue", "0"}, "invalid --proxy-queue 0: want 1 to 1048576"},
		{[]string{"--proxy-queue", "-3"}, "invalid --proxy-queue -3: want 1 to 1048576"},
		{[]string{"--proxy-queue", "many"}, `invalid --proxy-queue "many" (from flag): want a whole number`},
	} {
		if _, errs := parseWith(tc.args, nil, ""); !strings.Contains(errs, tc.want) || strings.Count(errs, "\n") != 0 {
			t.Errorf("%v: errors %q, want one containing %q", tc.args, errs, tc.want)
		}
	}
}

// An outbound limit past what the queue's 32-bit counters hold is refused
// at start with the range, not clamped unseen.
func TestOutboundLimitBounded(t *testing.T) {
	for _, v := range []string{"1024", "2147483648"} {
		var c config
		errs := parse([]string{"--outbound-limit", v}, &c, io.Discard,
			func(string) (string, bool) { return "", false },
			func(string) ([]byte, error) { return nil, nil })
		want := "invalid --outbound-limit " + v + ": want 4096 to 1073741824 bytes"
		var got []string
		for _, e := range errs {
			got = append(got, e.Error())
		}
		if !strings.Contains(strings.Join(got, "\n"), want) {
			t.Errorf("--outbound-limit %s: errors %q, want one containing %q", v, got, want)
		}
	}
}

// --read-queue reaches the node's read queue from a flag or the
// environment, and a length outside 1..1048576 (each slot is allocated at
// start) is refused with its range.
func TestReadQueueFlag(t *testing.T) {
	parseWith := func(args []string, env map[string]string) (config, string) {
		var c config
		errs := parse(args, &c, io.Discard,
			func(k string) (string, bool) { v, ok := env[k]; return v, ok },
			func(string) ([]byte, error) { return nil, nil })
		var msgs []string
		for _, e := range errs {
			msgs = append(msgs, e.Error())
		}
		return c, strings.Join(msgs, "\n")
	}
	if c, errs := parseWith(nil, nil); errs != "" || c.node.ReadQueue != 4096 {
		t.Fatalf("default %d, errors %s", c.node.ReadQueue, errs)
	}
	if c, errs := parseWith(nil, map[string]string{"ROOST_READ_QUEUE": "65536"}); errs != "" || c.node.ReadQueue != 65536 || c.source["read-queue"] != "env ROOST_READ_QUEUE" {
		t.Fatalf("from env: %d from %s, errors %s", c.node.ReadQueue, c.source["read-queue"], errs)
	}
	for _, v := range []string{"0", "-1", "1048577"} {
		if _, errs := parseWith([]string{"--read-queue", v}, nil); !strings.Contains(errs, "invalid --read-queue "+v+": want 1 to 1048576") {
			t.Errorf("--read-queue %s: errors %q", v, errs)
		}
	}
}
