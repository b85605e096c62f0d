package main

// Tests of the app registry from the operator's side: the roost app and
// roost token commands on both registries, changes reaching running nodes,
// the connection limit across two nodes, and the CLI's help and secrets.

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/golang-jwt/jwt/v5"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/persist/pgtest"
	"github.com/roost-chat/roost/proto"
	"github.com/roost-chat/roost/pubsub/redistest"
	"github.com/roost-chat/roost/test/harness"
)

// roost runs a command line in process and returns its exit code, stdout
// and stderr.
func roost(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func mustRoost(t *testing.T, args ...string) string {
	t.Helper()
	code, out, errs := roost(t, args...)
	if code != 0 {
		t.Fatalf("roost %s: exit %d\n%s", strings.Join(args, " "), code, errs)
	}
	return out
}

// appCommands runs every roost app command against a registry (reg are the
// flags naming it) and checks their output.
func appCommands(t *testing.T, reg ...string) {
	with := func(args ...string) []string { return append(args, reg...) }
	var created struct{ App, Secret string }
	if err := json.Unmarshal([]byte(mustRoost(t, with("app", "create", "chat", "--max-conns", "5")...)), &created); err != nil || created.App != "chat" || len(created.Secret) < 40 {
		t.Fatalf("create printed %+v (%v)", created, err)
	}
	if code, _, errs := roost(t, with("app", "create", "chat")...); code != 1 || !strings.Contains(errs, "already exists") {
		t.Fatalf("second create: exit %d %s", code, errs)
	}
	if code, _, errs := roost(t, with("app", "create", "bad/id")...); code != 2 || !strings.Contains(errs, "invalid app ID") {
		t.Fatalf("bad id: exit %d %s", code, errs)
	}
	mustRoost(t, with("app", "create", "other")...)

	list := mustRoost(t, with("app", "list")...)
	if strings.Contains(list, created.Secret) || !strings.Contains(list, `"secret": "*****`+created.Secret[len(created.Secret)-4:]+`"`) {
		t.Fatalf("list does not mask the secret:\n%s", list)
	}
	var views []appView
	if err := json.Unmarshal([]byte(list), &views); err != nil || len(views) != 2 || views[0].App != "chat" || *views[0].Limits.MaxConns != 5 || !views[0].Enabled {
		t.Fatalf("list: %v %+v", err, views)
	}

	set := mustRoost(t, with("app", "set", "chat", "--pub-rate", "3.5", "--max-conns", "default", "--keep-age", "24h", "--keep-count", "100", "--max-rooms", "0", "--max-presence", "7")...)
	var v appView
	if err := json.Unmarshal([]byte(set), &v); err != nil || v.Limits.MaxConns != nil || *v.Limits.PubRate != 3.5 || *v.Limits.MaxRooms != 0 || v.KeepAge != "24h0m0s" || v.KeepCount != 100 ||
		*v.Limits.MaxPresence != 7 {
		t.Fatalf("set: %v %s", err, set)
	}
	// The chat state's limits (signals, read requests) per connection.
	v = appView{}
	set = mustRoost(t, with("app", "set", "chat", "--signal-rate", "2", "--signal-burst", "3", "--read-rate", "0.5", "--read-burst", "1")...)
	if err := json.Unmarshal([]byte(set), &v); err != nil || *v.Limits.SignalRate != 2 || *v.Limits.SignalBurst != 3 || *v.Limits.ReadRate != 0.5 || *v.Limits.ReadBurst != 1 {
		t.Fatalf("set chat limits: %v %s", err, set)
	}
	for _, bad := range [][]string{{"--signal-rate", "-1"}, {"--signal-burst", "0"}, {"--read-rate", "often"}, {"--read-burst", "1.5"}} {
		if code, _, errs := roost(t, with(append([]string{"app", "set", "chat"}, bad...)...)...); code != 2 || !strings.Contains(errs, "invalid "+bad[0]) {
			t.Fatalf("set %v: exit %d %s", bad, code, errs)
		}
	}
	v = appView{}
	if err := json.Unmarshal([]byte(mustRoost(t, with("app", "set", "chat", "--signal-rate", "default", "--read-burst", "default")...)), &v); err != nil || v.Limits.SignalRate != nil || v.Limits.ReadBurst != nil || *v.Limits.SignalBurst != 3 {
		t.Fatalf("chat limits back to the defaults: %v %+v", err, v.Limits)
	}
	if code, _, errs := roost(t, with("app", "set", "chat", "--pub-rate", "fast")...); code != 2 || !strings.Contains(errs, "invalid --pub-rate") {
		t.Fatalf("bad value: %d %s", code, errs)
	}
	if code, _, errs := roost(t, with("app", "set", "nobody", "--pub-rate", "1")...); code != 1 || !strings.Contains(errs, "no such app") {
		t.Fatalf("unknown app: %d %s", code, errs)
	}

	// The webhook: set, kept across other changes, partly changed, removed.
	mustRoost(t, with("app", "set", "chat", "--webhook-url", "https://backend.example/hook", "--webhook-rooms", "lobby, team-*", "--webhook-timeout", "2s")...)
	mustRoost(t, with("app", "set", "chat", "--pub-burst", "9")...)
	if err := json.Unmarshal([]byte(mustRoost(t, with("app", "set", "chat", "--webhook-timeout", "3s")...)), &v); err != nil || v.Webhook == nil ||
		v.Webhook.URL != "https://backend.example/hook" || strings.Join(v.Webhook.Rooms, ",") != "lobby,team-*" || time.Duration(v.Webhook.Timeout) != 3*time.Second {
		t.Fatalf("webhook after set: %v %+v", err, v.Webhook)
	}
	for _, bad := range [][]string{{"--webhook-url", "ftp://x"}, {"--webhook-timeout", "2m"}, {"--webhook-rooms", "bad room"}} {
		if code, _, errs := roost(t, with(append([]string{"app", "set", "chat"}, bad...)...)...); code != 1 || !strings.Contains(errs, "webhook") {
			t.Fatalf("set %v: exit %d %s", bad, code, errs)
		}
	}
	// Connection events: kinds in one spelling, msg alone is the default.
	v = appView{}
	if err := json.Unmarshal([]byte(mustRoost(t, with("app", "set", "chat", "--webhook-events", "connection, msg,presence")...)), &v); err != nil || v.Webhook == nil ||
		strings.Join(v.Webhook.Events, ",") != "msg,presence,connection" || v.Webhook.URL != "https://backend.example/hook" {
		t.Fatalf("webhook events: %v %+v", err, v.Webhook)
	}
	v = appView{}
	if err := json.Unmarshal([]byte(mustRoost(t, with("app", "set", "chat", "--webhook-events", "msg")...)), &v); err != nil || v.Webhook == nil || v.Webhook.Events != nil {
		t.Fatalf("webhook events back to msg: %v %+v", err, v.Webhook)
	}
	for _, bad := range []string{"typing", "", "msg,msgs"} {
		if code, _, errs := roost(t, with("app", "set", "chat", "--webhook-events", bad)...); code != 2 || !strings.Contains(errs, "--webhook-events") {
			t.Fatalf("--webhook-events %q: exit %d %s", bad, code, errs)
		}
	}
	v = appView{}
	if err := json.Unmarshal([]byte(mustRoost(t, with("app", "set", "chat", "--webhook-url", "none")...)), &v); err != nil || v.Webhook != nil {
		t.Fatalf("webhook after --webhook-url none: %v %+v", err, v.Webhook)
	}

	// The proxy hooks: set, partly changed, failing open, removed.
	if code, _, errs := roost(t, with("app", "set", "chat", "--proxy-timeout", "2s")...); code != 1 || !strings.Contains(errs, "no proxy hook") {
		t.Fatalf("proxy timeout without a hook: exit %d %s", code, errs)
	}
	mustRoost(t, with("app", "set", "chat", "--connect-proxy", "http://127.0.0.1:9/connect", "--publish-proxy", "http://127.0.0.1:9/publish")...)
	v = appView{}
	if err := json.Unmarshal([]byte(mustRoost(t, with("app", "set", "chat", "--proxy-timeout", "250ms", "--proxy-fail", "open")...)), &v); err != nil || v.Proxy == nil ||
		v.Proxy.Connect != "http://127.0.0.1:9/connect" || v.Proxy.Publish != "http://127.0.0.1:9/publish" || time.Duration(v.Proxy.Timeout) != 250*time.Millisecond || !v.Proxy.FailOpen {
		t.Fatalf("proxy after set: %v %+v", err, v.Proxy)
	}
	v = appView{}
	if err := json.Unmarshal([]byte(mustRoost(t, with("app", "set", "chat", "--proxy-inflight", "64")...)), &v); err != nil || v.Proxy == nil || v.Proxy.InFlight != 64 || !v.Proxy.FailOpen {
		t.Fatalf("proxy after --proxy-inflight 64: %v %+v", err, v.Proxy)
	}
	v = appView{}
	if err := json.Unmarshal([]byte(mustRoost(t, with("app", "set", "chat", "--proxy-inflight", "default")...)), &v); err != nil || v.Proxy == nil || v.Proxy.InFlight != 0 {
		t.Fatalf("proxy after --proxy-inflight default: %v %+v", err, v.Proxy)
	}
	for _, bad := range [][]string{{"--connect-proxy", "ftp://x"}, {"--proxy-timeout", "11s"}, {"--proxy-fail", "maybe"}, {"--proxy-inflight", "0"}, {"--proxy-inflight", "5000"}, {"--proxy-inflight", "many"}} {
		if code, _, errs := roost(t, with(append([]string{"app", "set", "chat"}, bad...)...)...); code == 0 || !strings.Contains(errs, "proxy") {
			t.Fatalf("set %v: exit %d %s", bad, code, errs)
		}
	}
	v = appView{}
	if err := json.Unmarshal([]byte(mustRoost(t, with("app", "set", "chat", "--connect-proxy", "none")...)), &v); err != nil || v.Proxy == nil || v.Proxy.Connect != "" {
		t.Fatalf("proxy after --connect-proxy none: %v %+v", err, v.Proxy)
	}
	v = appView{}
	if err := json.Unmarshal([]byte(mustRoost(t, with("app", "set", "chat", "--publish-proxy", "none")...)), &v); err != nil || v.Proxy != nil {
		t.Fatalf("proxy after removing both hooks: %v %+v", err, v.Proxy)
	}

	rotated := strings.TrimSpace(mustRoost(t, with("app", "rotate", "chat", "--keep-previous", "1h")...))
	if len(rotated) < 40 || rotated == created.Secret {
		t.Fatalf("rotate printed %q", rotated)
	}
	show := mustRoost(t, with("app", "show", "chat")...)
	if err := json.Unmarshal([]byte(show), &v); err != nil || v.Secret != maskSecret(rotated) || v.PreviousSecret != maskSecret(created.Secret) || v.PreviousUntil == nil {
		t.Fatalf("show after rotate: %v %s", err, show)
	}

	mustRoost(t, with("app", "disable", "chat")...)
	if err := json.Unmarshal([]byte(mustRoost(t, with("app", "show", "chat")...)), &v); err != nil || v.Enabled {
		t.Fatalf("disabled app shows enabled: %+v", v)
	}
	// A token of a disabled app is still printed, alone on stdout; the
	// warning goes to stderr.
	if code, out, errs := roost(t, with("token", "--app", "chat", "--user", "alice")...); code != 0 || strings.Count(strings.TrimSpace(out), ".") != 2 || strings.Contains(out, " ") ||
		!strings.Contains(errs, "app chat is disabled") {
		t.Fatalf("token of a disabled app: exit %d stdout %q stderr %q", code, out, errs)
	}
	mustRoost(t, with("app", "enable", "chat")...)

	// roost token takes the secret from the registry, or from a file.
	token := strings.TrimSpace(mustRoost(t, with("token", "--app", "chat", "--user", "alice", "--ttl", "10m", "--rooms", "lobby,team-*")...))
	var cl proto.TokenClaims
	if _, err := jwt.ParseWithClaims(token, &cl, func(*jwt.Token) (any, error) { return []byte(rotated), nil }); err != nil {
		t.Fatalf("token from the registry: %v", err)
	}
	if cl.App != "chat" || cl.Subject != "alice" || len(cl.Rooms) != 2 || time.Until(cl.ExpiresAt.Time) > 10*time.Minute {
		t.Fatalf("claims %+v", cl)
	}
	sf := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(sf, []byte("a-secret-from-a-file\n"), 0o600)
	token = strings.TrimSpace(mustRoost(t, "token", "--app", "x", "--user", "u", "--secret-file", sf))
	if _, err := jwt.Parse(token, func(*jwt.Token) (any, error) { return []byte("a-secret-from-a-file"), nil }); err != nil {
		t.Fatalf("token from --secret-file: %v", err)
	}
}

func TestAppCommandsFile(t *testing.T) {
	f := filepath.Join(t.TempDir(), "apps.json")
	appCommands(t, "--apps", f)
	if fi, err := os.Stat(f); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("registry file mode: %v %v", fi.Mode(), err)
	}
}

func TestAppCommandsPostgres(t *testing.T) {
	url := pgtest.NewDB(t)
	if err := persist.Migrate(context.Background(), url); err != nil {
		t.Fatal(err)
	}
	appCommands(t, "--database-url", url)
}

// dialToken connects with a token and returns the client, or the error.
func dialToken(addr, token string) (*opsClientConn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, _, _, err := ws.Dial(ctx, "ws://"+addr+"/ws?token="+token)
	if err != nil {
		return nil, err
	}
	return &opsClientConn{conn}, nil
}

type opsClientConn struct{ c interface{ Close() error } }

// registryReachesNode checks that a node serving from a registry sees an
// app created after it started within 2 s, and closes the app's
// connections with 1008 within 2 s of roost app disable.
func registryReachesNode(t *testing.T, addr string, reg ...string) {
	var created struct{ Secret string }
	t0 := time.Now()
	json.Unmarshal([]byte(mustRoost(t, append([]string{"app", "create", "late"}, reg...)...)), &created)
	token, _ := proto.SignToken([]byte(created.Secret), "late", "u", time.Now().Add(time.Hour), nil)
	for {
		c, err := dialToken(addr, token)
		if err == nil {
			c.c.Close()
			break
		}
		if time.Since(t0) > 2*time.Second {
			t.Fatalf("new app not accepted within 2s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("created app accepted after %v", time.Since(t0))

	live := dialOps(t, addr, "token="+token)
	live.send(`{"op":"ping"}`)
	live.expect("pong")
	t0 = time.Now()
	mustRoost(t, append([]string{"app", "disable", "late"}, reg...)...)
	select {
	case f := <-live.Frames():
		if f.Op != ws.OpClose || f.Code != 1008 || f.Reason != "app disabled" {
			t.Fatalf("want close 1008 app disabled, got %v %d %q", f.Op, f.Code, f.Reason)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("disable did not close the connection within 2s")
	}
	t.Logf("disable closed the connection after %v", time.Since(t0))
	if _, err := dialToken(addr, token); err == nil || !strings.Contains(err.Error(), "403") {
		t.Fatalf("disabled app accepted: %v", err)
	}
}

func TestRegistryFileReachesNode(t *testing.T) {
	f := filepath.Join(t.TempDir(), "apps.json")
	addr, _, _ := inProcessServe(t, "--apps", f)
	registryReachesNode(t, addr, "--apps", f)
}

func TestRegistryPostgresReachesNode(t *testing.T) {
	url := pgtest.NewDB(t)
	addr, _, _ := inProcessServe(t, "--database-url", url, "--migrate")
	registryReachesNode(t, addr, "--database-url", url)
}

// SIGHUP re-reads the file registry.
func TestSIGHUPReloadsRegistry(t *testing.T) {
	f := filepath.Join(t.TempDir(), "apps.json")
	mustRoost(t, "app", "create", "a", "--apps", f)
	logs := serveAppsFile(t, f)
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	waitLog(t, logs, "SIGHUP: re-reading the app registry")
	waitLog(t, logs, `"msg":"app registry read"`)
}

func waitLog(t *testing.T, logs *harness.SyncBuffer, s string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in the log:\n%s", s, logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The app connection limit holds across two nodes sharing Redis: with a
// limit of 4, 2 connections on node A and 2 on node B, the next one on
// either is closed with 1008 "connection limit"; one closing frees a slot
// for the other node within the sharing period.
func TestAppConnLimitAcrossNodes(t *testing.T) {
	redistest.Require(t)
	f := filepath.Join(t.TempDir(), "apps.json")
	var created struct{ Secret string }
	json.Unmarshal([]byte(mustRoost(t, "app", "create", "shared", "--max-conns", "4", "--apps", f)), &created)
	redisURL := "redis://127.0.0.1:6379?prefix=" + redistest.Prefix(t)
	a, _, _ := inProcessServe(t, "--apps", f, "--redis-url", redisURL)
	b, _, _ := inProcessServe(t, "--apps", f, "--redis-url", redisURL)
	token := func(u string) string {
		s, _ := proto.SignToken([]byte(created.Secret), "shared", u, time.Now().Add(time.Hour), nil)
		return s
	}
	var first *opsClient
	for i, addr := range []string{a, a, b, b} {
		c := dialOps(t, addr, "token="+token("u"+string(rune('0'+i))))
		c.send(`{"op":"ping"}`)
		c.expect("pong")
		if i == 0 {
			first = c
		}
	}
	over := func(addr string) bool {
		c := dialOps(t, addr, "token="+token("extra"))
		c.send(`{"op":"ping"}`)
		f := <-c.Frames()
		c.Close()
		return f.Op == ws.OpClose && f.Code == 1008 && f.Reason == "connection limit"
	}
	// The counts reach the other node within the sharing period.
	deadline := time.Now().Add(3 * time.Second)
	for !(over(a) && over(b)) {
		if time.Now().After(deadline) {
			t.Fatal("the fifth connection of the cluster was admitted")
		}
		time.Sleep(100 * time.Millisecond)
	}
	first.Close() // a slot frees on A: B admits again
	deadline = time.Now().Add(3 * time.Second)
	for over(b) {
		if time.Now().After(deadline) {
			t.Fatal("node B did not see node A's freed slot")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestHelpAndVersion(t *testing.T) {
	for _, arg := range []string{"-h", "--help", "-help", "help"} {
		code, out, _ := roost(t, arg)
		if code != 0 || !strings.Contains(out, "roost app COMMAND") || !strings.Contains(out, "roost serve -h") {
			t.Fatalf("%s: exit %d\n%s", arg, code, out)
		}
	}
	for _, arg := range []string{"--version", "-version", "version"} {
		code, out, _ := roost(t, arg)
		if code != 0 || !strings.HasPrefix(out, "roost ") {
			t.Fatalf("%s: exit %d %q", arg, code, out)
		}
	}
	if code, _, errs := roost(t, "app"); code != 2 || !strings.Contains(errs, "create ID") {
		t.Fatalf("roost app: %d %s", code, errs)
	}
}

// A misspelled ROOST_ variable is reported like an unknown config key.
func TestMisspelledEnv(t *testing.T) {
	var c config
	c.environ = func() []string {
		return []string{"ROOST_LISTN=127.0.0.1:1", "ROOST_LOOPS=2", "ROOST_TEST_DATABASE_URL=x", "ROOST_CONFIG=", "HOME=/root"}
	}
	env := map[string]string{"ROOST_LOOPS": "2"}
	errs := parse(nil, &c, io.Discard, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, noFile)
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "ROOST_LISTN: unknown setting, did you mean ROOST_LISTEN?") {
		t.Fatalf("errors %v", errs)
	}
}

func noFile(string) ([]byte, error) { return nil, os.ErrNotExist }

func TestSecretsFromFileAndEnv(t *testing.T) {
	files := map[string]string{"/run/secrets": "# apps\nchat=file-secret\n\nops=other\n"}
	read := func(p string) ([]byte, error) {
		if s, ok := files[p]; ok {
			return []byte(s), nil
		}
		return nil, os.ErrNotExist
	}
	var c config
	env := map[string]string{"ROOST_APP_SECRET": "web=env-secret"}
	errs := parse([]string{"--app-secret-file", "/run/secrets", "--listen", "0.0.0.0:8080"}, &c, io.Discard, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, read)
	if len(errs) != 0 || string(c.node.Apps["chat"]) != "file-secret" || string(c.node.Apps["web"]) != "env-secret" || len(c.node.Apps) != 3 || c.node.Insecure {
		t.Fatalf("errs %v apps %v insecure %v", errs, c.node.Apps, c.node.Insecure)
	}
	// A repeated id is an error, not a silent overwrite.
	c = config{}
	env["ROOST_APP_SECRET"] = "chat=one,chat=two"
	errs = parse(nil, &c, io.Discard, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, read)
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "given twice") || strings.Contains(errs[0].Error(), "two") && !strings.Contains(errs[0].Error(), "*****") {
		t.Fatalf("errs %v", errs)
	}
	// A registry means token mode even on loopback.
	c = config{}
	if errs := parse([]string{"--apps", "/etc/roost/apps.json"}, &c, io.Discard, func(string) (string, bool) { return "", false }, read); len(errs) != 0 || c.node.Insecure || !c.node.Registry {
		t.Fatalf("--apps: errs %v insecure %v", errs, c.node.Insecure)
	}
	// Insecure mode: publish rates off unless set.
	c = config{}
	parse([]string{"--insecure", "--pub-rate", "7"}, &c, io.Discard, func(string) (string, bool) { return "", false }, read)
	if c.node.Limits.PubRate != 7 || c.node.Limits.AppPubRate != 0 {
		t.Fatalf("insecure rates %+v", c.node.Limits)
	}
}

func TestCmdlineRedacted(t *testing.T) {
	saved := os.Args
	defer func() { os.Args = saved }()
	os.Args = []string{"roost", "serve", "--app-secret", "a=topsecret1,b=topsecret2", "-app-secret=c=topsecret3",
		"--database-url", "postgres://u:topsecret4@db/x", "--secret", "topsecret5", "--listen", ":8080"}
	rec := httptest.NewRecorder()
	adminMux(&admin{}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/pprof/cmdline", nil))
	body := rec.Body.String()
	if regexp.MustCompile(`topsecret`).MatchString(body) {
		t.Fatalf("cmdline shows a secret: %q", body)
	}
	for _, want := range []string{"a=*****,b=*****", "-app-secret=c=*****", "postgres://u:*****@db/x", "--listen\x00:8080"} {
		if !strings.Contains(body, want) {
			t.Fatalf("cmdline %q lacks %q", body, want)
		}
	}
}

// The README's /etc/roost/roost.env example is a node in token mode on
// every address, with its registry in PostgreSQL.
func TestREADMEServiceExample(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(b), "# /etc/roost/roost.env")
	if !ok {
		t.Fatal("README has no /etc/roost/roost.env example")
	}
	block, _, _ := strings.Cut(after, "```")
	env := map[string]string{}
	var names []string
	for _, line := range strings.Split(block, "\n")[1:] {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok {
			env[k] = v
			names = append(names, k+"="+v)
		}
	}
	if len(env) < 3 {
		t.Fatalf("example too short: %v", env)
	}
	c := config{environ: func() []string { return names }}
	errs := parse([]string{}, &c, io.Discard, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, noFile)
	if len(errs) != 0 {
		t.Fatalf("the README's roost.env: %v", errs)
	}
	if c.node.Insecure || !c.node.Registry || c.node.Listen != "0.0.0.0:8080" || !c.migrate {
		t.Fatalf("the README's roost.env: insecure %v registry %v listen %s migrate %v", c.node.Insecure, c.node.Registry, c.node.Listen, c.migrate)
	}
	var out bytes.Buffer
	if err := printConfig(&out, &c); err != nil || !strings.Contains(out.String(), "token (HS256") || strings.Contains(out.String(), "PASSWORD") {
		t.Fatalf("print-config: %v\n%s", err, out.String())
	}
}

// An app's chat limits in the registry reach the node's edges, and the
// node's --signal-rate and --signal-burst are the other apps' defaults.
func TestChatLimitsFromRegistry(t *testing.T) {
	f := filepath.Join(t.TempDir(), "apps.json")
	var a, b struct{ Secret string }
	json.Unmarshal([]byte(mustRoost(t, "app", "create", "a", "--apps", f, "--signal-rate", "0.001", "--signal-burst", "2")), &a)
	json.Unmarshal([]byte(mustRoost(t, "app", "create", "b", "--apps", f)), &b)
	addr, _, _ := inProcessServe(t, "--apps", f, "--signal-rate", "0.001", "--signal-burst", "1")
	for _, c := range []struct {
		app, secret string
		burst       int
	}{{"a", a.Secret, 2}, {"b", b.Secret, 1}} {
		token, _ := proto.SignToken([]byte(c.secret), c.app, "u", time.Now().Add(time.Hour), nil)
		conn := dialOps(t, addr, "token="+token)
		for i := 0; i < c.burst; i++ {
			conn.send(`{"op":"signal","room":"r","body":1}`)
		}
		conn.send(`{"op":"ping"}`)
		conn.expect("pong") // the burst passed: no err before the pong
		conn.send(`{"op":"signal","room":"r","body":1}`)
		if fr := conn.expect("err"); fr.json["code"] != "rate_limited" {
			t.Fatalf("app %s: want rate_limited after a burst of %d, got %v", c.app, c.burst, fr.json)
		}
	}
}
