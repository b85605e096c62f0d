package main

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/persist/pgtest"
	"github.com/roost-chat/roost/pubsub/redistest"
	"github.com/roost-chat/roost/test/harness"
)

// /healthz counts the loops the node runs, not the ones that happen to
// have had a connection: an idle node with --loops 2 says loops=2.
func TestHealthzCountsLoops(t *testing.T) {
	_, admin := inProcessNode(t, "--loops", "2")
	resp, err := http.Get("http://" + admin + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), " conns=0 ") || !strings.Contains(string(b), " loops=2\n") {
		t.Fatalf("/healthz of an idle node with 2 loops: %d %q", resp.StatusCode, b)
	}
}

// Each registry change a node applies is logged once, naming the app and
// what changed, without secrets or URLs; a re-read that changes nothing
// logs nothing.
func TestRegistryChangesLogged(t *testing.T) {
	f := filepath.Join(t.TempDir(), "apps.json")
	mustRoost(t, "app", "create", "chat", "--apps", f)
	logs := serveAppsFile(t, f)

	const hook = "https://hooks.example.com/roost?token=hush"
	steps := []struct {
		args []string
		want string
	}{
		{[]string{"app", "disable", "chat"}, `"app":"chat","change":"disabled"`},
		{[]string{"app", "enable", "chat"}, `"app":"chat","change":"enabled"`},
		{[]string{"app", "set", "chat", "--webhook-url", hook}, `"app":"chat","change":"webhook.url set"`},
		{[]string{"app", "set", "chat", "--max-presence", "5", "--max-conns", "100"}, `"app":"chat","change":"limits.max_conns set to 100, limits.max_presence set to 5"`},
		{[]string{"app", "set", "chat", "--max-conns", "200"}, `"app":"chat","change":"limits.max_conns 100 -> 200"`},
		{[]string{"app", "rotate", "chat"}, `"app":"chat","change":"previous_secret set, previous_until set to`},
		{[]string{"app", "create", "other"}, `"app":"other","change":"created"`},
	}
	for _, s := range steps {
		mustRoost(t, append(s.args, "--apps", f)...)
		waitLog(t, logs, s.want)
	}
	// The periodic re-read (every second) finds nothing new.
	time.Sleep(1500 * time.Millisecond)
	l := logs.String()
	for _, s := range steps {
		if n := strings.Count(l, s.want); n != 1 {
			t.Errorf("%q logged %d times, want once", s.want, n)
		}
	}
	if !strings.Contains(l, "secret rotated") {
		t.Errorf("the rotation's log line does not say the secret changed:\n%s", l)
	}
	if strings.Contains(l, "hush") || strings.Contains(l, "hooks.example.com") {
		t.Errorf("the webhook URL (which may hold a credential) reached the log:\n%s", l)
	}
}

// roost migrate lists the files it applied, then says there is nothing
// left to apply.
func TestMigrateListsWhatItApplied(t *testing.T) {
	url := pgtest.NewDB(t)
	code, _, errs := roost(t, "migrate", "--database-url", url)
	if code != 0 {
		t.Fatalf("roost migrate: exit %d\n%s", code, errs)
	}
	latest := persist.LatestSchema()
	if !strings.Contains(errs, "roost migrate: applied 0001_") || !strings.Contains(errs, "from version 0 to "+strconv.Itoa(latest)) {
		t.Fatalf("first migrate does not list what it applied:\n%s", errs)
	}
	// Versions may skip numbers (branches take numbers apart): count the files.
	files, err := filepath.Glob("persist/migrations/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("migration files: %v %v", files, err)
	}
	if n := strings.Count(errs, "roost migrate: applied "); n != len(files) {
		t.Errorf("%d files listed, want %d:\n%s", n, len(files), errs)
	}
	code, _, errs = roost(t, "migrate", "--database-url", url)
	if code != 0 || strings.Contains(errs, "applied") || !strings.Contains(errs, "nothing to apply: the schema is at version "+strconv.Itoa(latest)) {
		t.Fatalf("second migrate: exit %d\n%s", code, errs)
	}
}

// Every flag `roost app set` takes is named in `roost app -h`.
func TestAppHelpNamesEverySetFlag(t *testing.T) {
	_, _, help := roost(t, "app", "-h")
	_, _, setHelp := roost(t, "app", "set", "x", "-h")
	_, flags, ok := strings.Cut(setHelp, "Flags of roost app set:")
	if !ok {
		t.Fatalf("roost app set -h has no flag list:\n%s", setHelp)
	}
	names := regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`).FindAllStringSubmatch(flags, -1)
	if len(names) < 20 {
		t.Fatalf("only %d flags found in roost app set -h:\n%s", len(names), flags)
	}
	for _, m := range names {
		if !strings.Contains(help, "--"+m[1]+" ") && !strings.Contains(help, "--"+m[1]+"\n") {
			t.Errorf("roost app -h does not name --%s", m[1])
		}
	}
	if !strings.Contains(help, "--max-presence") {
		t.Errorf("roost app -h omits --max-presence:\n%s", help)
	}
}

// roost health (a container's HEALTHCHECK) answers 0 for a live node, 1
// for none.
func TestHealthCommand(t *testing.T) {
	_, admin := inProcessNode(t)
	for _, args := range [][]string{{"health", "--admin", admin}, {"health", "--ready", "--admin", admin}} {
		if code, out, errs := roost(t, args...); code != 0 || !strings.Contains(out, "ok") && !strings.Contains(out, "ready") {
			t.Errorf("roost %v: exit %d %q %s", args, code, out, errs)
		}
	}
	if code, _, errs := roost(t, "health", "--admin", freeLoopback(t), "--timeout", "1s"); code != 1 || !strings.Contains(errs, "roost health:") {
		t.Errorf("roost health with no node: exit %d %s", code, errs)
	}
}

// serveAppsFile runs a node on the registry file f until the test ends and
// returns its (JSON) log once it serves.
func serveAppsFile(t *testing.T, f string) *harness.SyncBuffer {
	t.Helper()
	logs := &harness.SyncBuffer{}
	sig := make(chan os.Signal, 1)
	done := make(chan int, 1)
	go func() {
		done <- serve([]string{"--apps", f, "--listen", "127.0.0.1:0", "--admin", "off", "--api", "off", "--log-format", "json"}, io.Discard, logs, sig)
	}()
	t.Cleanup(func() { sig <- syscall.SIGTERM; <-done })
	waitLog(t, logs, "roost serving")
	return logs
}

// With JSON logs, the development banner is one log record (a plain line
// would break a JSON reader); its server API call is absent when the API
// is not on loopback (secret-less calls are refused there).
func TestDevBannerJSON(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	devBanner(&buf, log, true, "127.0.0.1:8080", "127.0.0.1:8090", true)
	var rec map[string]string
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("not one JSON record: %v\n%s", err, buf.String())
	}
	if rec["demo"] != "http://127.0.0.1:8080/" || !strings.Contains(rec["server_api"], "http://127.0.0.1:8090/v1/apps/demo/rooms/lobby/messages") {
		t.Fatalf("banner record %v", rec)
	}
	buf.Reset()
	devBanner(&buf, log, false, "127.0.0.1:8080", "10.0.0.1:8090", false)
	if strings.Contains(buf.String(), "curl") || !strings.Contains(buf.String(), "demo page   http://127.0.0.1:8080/") {
		t.Fatalf("banner without a loopback API:\n%s", buf.String())
	}
}

// freeLoopback is a loopback address with a port free a moment ago.
func freeLoopback(t *testing.T) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(redistest.FreePort(t, false)))
}
