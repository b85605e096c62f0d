package test

// The browser client's own tests, run as part of `go test ./...`: the unit
// tests of its state machine with Node's test runner, and the end-to-end
// tests in headless Chromium (playwright-core, installed by `npm ci` in
// client/) against real roost processes. Without node, chromium or
// client/node_modules they skip, and fail with CI=true.

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/roost-chat/roost/persist/pgtest"
	"github.com/roost-chat/roost/test/harness"
)

// needTool finds a program or skips (fails with CI=true).
func needTool(t testing.TB, name, hint string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		msg := name + " not installed: " + hint
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return p
}

// runNode runs `node --test` on files of client/test with env, and fails
// with the runner's output when a test fails.
func runNode(t *testing.T, timeout time.Duration, env []string, files ...string) {
	t.Helper()
	node := needTool(t, "node", "apt-get install -y nodejs (Node 20 or later)")
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	args := append([]string{"--test", "--test-reporter=spec"}, files...)
	cmd := exec.CommandContext(ctx, node, args...)
	cmd.Dir = filepath.Join("..", "client")
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("node --test %v did not finish within %s:\n%s", files, timeout, out.String())
	}
	if err != nil {
		t.Fatalf("node --test %v: %v\n%s", files, err, out.String())
	}
	t.Logf("node --test %v:\n%s", files, out.String())
}

func TestClientUnit(t *testing.T) {
	runNode(t, 2*time.Minute, nil, "test/roost.test.mjs", "test/chat.test.mjs")
}

// TestClientBrowser runs client/test/browser.test.mjs: two pages exchanging
// 1,000 messages while a PostgreSQL-backed node is killed twice, drained
// once and one page reloaded twice (once while the node is down); a page's
// outbox outliving a reload; a page behind a proxy that refuses upgrades
// listening over /sse across a kill and a drain; presence across a reload;
// a memory-store node restarted under a page;
// 200 clients reconnecting after a kill and a drain.
func TestClientBrowser(t *testing.T) {
	chromium := needTool(t, "chromium", "apt-get install -y chromium")
	if _, err := os.Stat(filepath.Join("..", "client", "node_modules", "playwright-core", "package.json")); err != nil {
		msg := "playwright-core not installed: run `npm ci` in client/"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	db := pgtest.NewDB(t)
	bin := harness.Binary(t)
	runNode(t, 6*time.Minute, []string{"ROOST_BIN=" + bin, "ROOST_DATABASE_URL=" + db, "CHROMIUM=" + chromium}, "test/browser.test.mjs")
}

// TestClientPacked runs client/test/pack.test.mjs: `npm pack` of client/
// installed into a fresh project without a registry, imported by name and
// run on Node against a real node, with the ws package's WebSocket and with
// undici's (Node 22's own).
func TestClientPacked(t *testing.T) {
	needTool(t, "npm", "apt-get install -y npm")
	for _, dep := range []string{"ws", "undici"} {
		if _, err := os.Stat(filepath.Join("..", "client", "node_modules", dep, "package.json")); err != nil {
			msg := dep + " not installed: run `npm ci` in client/"
			if os.Getenv("CI") == "true" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
	runNode(t, 3*time.Minute, []string{"ROOST_BIN=" + harness.Binary(t)}, "test/pack.test.mjs")
}
