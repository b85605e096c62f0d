package test

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/roost-chat/roost/test/harness"
)

// readmeBlock is a fenced sh block of README.md marked for this test:
//
//	<!-- readme-test -->             run it; it must exit 0
//	<!-- readme-test: background --> a node: start it, wait for its port;
//	                                 it runs until the next background
//	                                 block starts (a user's Ctrl-C) or the end
type readmeBlock struct {
	background bool
	text       string
}

var readmeMark = regexp.MustCompile("(?m)^<!-- readme-test(: background)? -->\n```sh\n((?:.*\n)*?)```")

func readmeBlocks(t *testing.T) []readmeBlock {
	b, err := os.ReadFile(filepath.Join(harness.Root(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var out []readmeBlock
	for _, m := range readmeMark.FindAllStringSubmatch(string(b), -1) {
		out = append(out, readmeBlock{background: m[1] != "", text: m[2]})
	}
	return out
}

// The README's first screen works as printed on a fresh machine: its
// marked blocks run in order, with the binary the README builds, in an
// empty directory. The only rewrites are the ports (free loopback ports
// for 8080, 8090 and the admin's 6060, so that the test runs beside other
// nodes) and /var/lib/roost, which becomes a directory under the test's
// own temporary one that does not exist yet (as on a fresh machine).
// "Run, test" is not marked: its `go test` is this run, and its `go run .`
// is the `./roost` of "A first chat" (the same node, built by go run).
// `go install ...@latest` needs the module on the network and is not run.
func TestREADMECommands(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs nodes")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("curl is needed to run the README's commands")
		}
		t.Skip("no curl")
	}
	blocks := readmeBlocks(t)
	if len(blocks) < 6 {
		t.Fatalf("README.md has %d blocks marked readme-test, want the first screen's 6 or more", len(blocks))
	}
	repo := harness.Root(t)
	dir := t.TempDir()
	listen, api, admin := harness.FreeAddr(t), harness.FreeAddr(t), harness.FreeAddr(t)
	rewrite := strings.NewReplacer(
		"127.0.0.1:8080", listen, "0.0.0.0:8080", listen,
		"127.0.0.1:8090", api,
		"/var/lib/roost", filepath.Join(dir, "var", "lib", "roost"))
	// A clean environment: no ROOST_ setting of this process's reaches the
	// commands; the admin listener goes to a free port like the others.
	env := []string{"PATH=" + dir + string(os.PathListSeparator) + os.Getenv("PATH"), "ROOST_LISTEN=" + listen, "ROOST_ADMIN=" + admin, "ROOST_API=" + api}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ROOST_") && !strings.HasPrefix(kv, "DATABASE_URL=") && !strings.HasPrefix(kv, "REDIS_URL=") && !strings.HasPrefix(kv, "PATH=") {
			env = append(env, kv)
		}
	}

	var node *exec.Cmd
	var nodeLog *harness.SyncBuffer
	stopNode := func() {
		if node == nil {
			return
		}
		if strings.Contains(nodeLog.String(), "development mode") {
			// After the README's own calls, which the banner's repeats.
			devBannerWorks(t, dir, env, nodeLog)
		}
		_ = syscall.Kill(-node.Process.Pid, syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = node.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = syscall.Kill(-node.Process.Pid, syscall.SIGKILL)
			<-done
			t.Errorf("the README's node did not stop on SIGTERM\n%s", nodeLog)
		}
		node = nil
	}
	t.Cleanup(stopNode)

	var ran []string
	for i, b := range blocks {
		text := rewrite.Replace(b.text)
		cwd := dir
		build := strings.Contains(text, "go build -o roost .")
		if build {
			// The README builds in the clone; the binary then moves to the
			// empty directory the other blocks run in.
			cwd = repo
		}
		if b.background {
			stopNode()
			nodeLog = &harness.SyncBuffer{}
			node = exec.Command("bash", "-euo", "pipefail", "-c", text)
			node.Dir, node.Env, node.Stdout, node.Stderr = cwd, env, nodeLog, nodeLog
			node.SysProcAttr = harness.GroupAttr() // its own group, which stopNode kills
			if err := node.Start(); err != nil {
				t.Fatal(err)
			}
			waitPort(t, listen, nodeLog)
			ran = append(ran, "background: "+strings.TrimSpace(text))
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", text)
		cmd.Dir, cmd.Env = cwd, env
		var stderr harness.SyncBuffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		cancel()
		if err != nil {
			t.Fatalf("README block %d failed: %v\n%s\nstdout:\n%s\nstderr:\n%s\nnode:\n%v", i+1, err, text, out, &stderr, nodeLog)
		}
		ran = append(ran, strings.TrimSpace(text))
		t.Logf("block %d:\n%s-> %s", i+1, text, out)
		switch {
		case build:
			if err := os.Rename(filepath.Join(repo, "roost"), filepath.Join(dir, "roost")); err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(string(out), "roost ") {
				t.Errorf("./roost version printed %q", out)
			}
		case strings.Contains(text, "/messages?after=0"):
			if !strings.Contains(string(out), `{"room":"lobby","seq":1,"id":"k-1"}`) || !strings.Contains(string(out), `"body":"hi"`) {
				t.Errorf("the first chat's publish and history: %s", out)
			}
		case strings.Contains(text, "roost app create chat"):
			var created struct{ App, Secret string }
			if err := json.Unmarshal(out, &created); err != nil || created.App != "chat" || len(created.Secret) < 32 {
				t.Errorf("roost app create printed %q", out)
			}
		case strings.Contains(text, "roost token --app chat"):
			// The token is good: a client connects with it.
			c := dialOps(t, listen, "token="+strings.TrimSpace(string(out)))
			c.send(`{"op":"join","room":"lobby"}`)
			c.expect("joined")
			c.Close()
		}
	}
	stopNode()
	if len(ran) < 6 || !strings.Contains(ran[0], "go build -o roost .") {
		t.Fatalf("the README's first screen is not what this test expects; ran:\n%s", strings.Join(ran, "\n"))
	}
}

// devBannerWorks runs the server API call the development node printed,
// as printed.
func devBannerWorks(t *testing.T, dir string, env []string, log *harness.SyncBuffer) {
	t.Helper()
	var curl string
	deadline := time.Now().Add(5 * time.Second)
	for curl == "" {
		sc := bufio.NewScanner(strings.NewReader(log.String()))
		for sc.Scan() {
			if _, c, ok := strings.Cut(sc.Text(), "server API  "); ok && strings.HasPrefix(c, "curl ") {
				curl = c
			}
		}
		if curl == "" && time.Now().After(deadline) {
			t.Fatalf("the development node printed no server API call:\n%s", log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(log.String(), "demo page   http://") {
		t.Errorf("the development node printed no demo URL:\n%s", log)
	}
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", curl+" --fail --silent --show-error")
	cmd.Dir, cmd.Env = dir, env
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), `"seq":`) {
		t.Fatalf("the printed call %s: %v %s", curl, err, out)
	}
}

func waitPort(t *testing.T, addr string, log *harness.SyncBuffer) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the README's node does not listen on %s:\n%s", addr, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
