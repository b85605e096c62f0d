package main

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// .ci/release.sh builds static linux/amd64 and linux/arm64 binaries with
// their checksums; each names the release version, and the arm64 one
// serves a chat (start, connect over WebSocket, join, publish, ack) under
// Debian's qemu-user-static.
func TestReleaseBinaries(t *testing.T) {
	if testing.Short() {
		t.Skip("cross-builds two binaries")
	}
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		t.Skip("the release is built and smoke-tested from linux/amd64")
	}
	qemu, err := exec.LookPath("qemu-aarch64-static")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("qemu-aarch64-static is missing (apt-get install qemu-user-static; .ci/run does)")
		}
		t.Skip("no qemu-aarch64-static: apt-get install qemu-user-static")
	}
	out := t.TempDir()
	const ver = "v0.0.0-releasetest"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, "./.ci/release.sh", ver, out)
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf(".ci/release.sh: %v\n%s", err, b)
	}
	sum := exec.Command("sha256sum", "-c", "SHA256SUMS")
	sum.Dir = out
	if b, err := sum.CombinedOutput(); err != nil || strings.Count(string(b), ": OK") != 2 {
		t.Fatalf("checksums: %v\n%s", err, b)
	}
	for arch, cmd := range map[string][]string{
		"amd64": {filepath.Join(out, "roost-linux-amd64"), "version"},
		"arm64": {qemu, filepath.Join(out, "roost-linux-arm64"), "version"},
	} {
		b, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput()
		if err != nil || !strings.HasPrefix(string(b), "roost "+ver+" (revision ") || !strings.Contains(string(b), " linux/"+arch+"\n") {
			t.Errorf("%s: roost version: %v %q", arch, err, b)
		}
		if b, err := exec.Command("file", cmd[len(cmd)-2]).Output(); err == nil && !strings.Contains(string(b), "statically linked") {
			t.Errorf("%s is not static: %s", arch, b)
		}
	}

	// The arm64 smoke test: a node under emulation, a chat through it.
	listen, admin := freeLoopback(t), freeLoopback(t)
	logs := &syncBuffer{}
	node := exec.Command(qemu, filepath.Join(out, "roost-linux-arm64"), "--listen", listen, "--admin", admin, "--api", "off", "--loops", "1")
	node.Env = []string{"PATH=" + os.Getenv("PATH")}
	node.Stdout, node.Stderr = logs, logs
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = node.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- node.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("the arm64 node exited badly: %v\n%s", err, logs)
			}
		case <-time.After(20 * time.Second):
			_ = node.Process.Kill()
			t.Errorf("the arm64 node did not stop on SIGTERM\n%s", logs)
		}
	})
	waitPort(t, listen, logs)
	c := dialOps(t, listen, "user=alice&app=demo")
	defer c.Close()
	c.send(`{"op":"join","room":"lobby"}`)
	c.expect("joined")
	c.send(`{"op":"pub","room":"lobby","id":"arm-1","body":{"text":"hello from arm64"}}`)
	c.expect("msg")
	if ack := c.expect("ack"); ack.json["id"] != "arm-1" || ack.json["seq"] != float64(1) {
		t.Fatalf("ack %v", ack.json)
	}
	resp, err := http.Get("http://" + admin + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("arm64 /healthz: %s", resp.Status)
	}
}
