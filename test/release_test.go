package test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/roost-chat/roost/persist/pgtest"
	"github.com/roost-chat/roost/proto"
	"github.com/roost-chat/roost/pubsub/redistest"
	"github.com/roost-chat/roost/test/harness"
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
	build := exec.CommandContext(ctx, filepath.Join(harness.Root(t), ".ci", "release.sh"), ver, out)
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
	listen, admin := harness.FreeAddr(t), harness.FreeAddr(t)
	logs := &harness.SyncBuffer{}
	node := exec.Command(qemu, filepath.Join(out, "roost-linux-arm64"), "--listen", listen, "--admin", admin, "--api", "off", "--loops", "1")
	node.Env = []string{"PATH=" + os.Getenv("PATH")}
	node.Stdout, node.Stderr = logs, logs
	node.SysProcAttr = harness.GroupAttr()
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

	t.Run("container", func(t *testing.T) { containerImage(t, out) })
}

// containerImage builds the Dockerfile's prebuilt stage (the runtime image
// around the release binary: no Go image to pull) with Debian's podman,
// runs it, and asks it for its health and a chat. Podman here runs with
// runc and cgroupfs, and limits no higher than the sandbox's own: crun
// refuses a host with cgroup v1 and v2 both mounted, and raising
// RLIMIT_NPROC is not permitted (docs/operations.md, Packages).
func containerImage(t *testing.T, dist string) {
	podman, err := exec.LookPath("podman")
	if err == nil {
		_, err = exec.LookPath("runc")
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("podman and runc are missing (apt-get install podman runc; .ci/run does)")
		}
		t.Skip("no podman or runc")
	}
	ctxDir := t.TempDir()
	for _, f := range []string{"Dockerfile", ".dockerignore"} {
		b, err := os.ReadFile(filepath.Join(harness.Root(t), f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ctxDir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(ctxDir, "dist"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(dist, "roost-linux-amd64"), filepath.Join(ctxDir, "dist", "roost-linux-amd64")); err != nil {
		t.Fatal(err)
	}
	name := "roost-test-" + strings.ToLower(strconv.FormatInt(time.Now().UnixNano(), 36))
	image := "localhost/" + name
	pm := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		b, err := exec.CommandContext(ctx, podman, append([]string{"--runtime", "runc", "--cgroup-manager", "cgroupfs"}, args...)...).CombinedOutput()
		return string(b), err
	}
	if out, err := pm("build", "--format", "docker", "--target", "prebuilt", "-t", image, ctxDir); err != nil {
		t.Fatalf("podman build: %v\n%s", err, out)
	}
	t.Cleanup(func() { _, _ = pm("rmi", "-f", image) })
	port := harness.FreeAddr(t)
	const secret = "container-test-secret-0123456789ab"
	if out, err := pm("run", "-d", "--name", name, "--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096",
		"-e", "ROOST_APP_SECRET=chat="+secret, "-p", port+":8080", image); err != nil {
		t.Fatalf("podman run: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if out, err := pm("stop", "-t", "15", name); err != nil {
			t.Errorf("podman stop: %v\n%s", err, out)
		}
		if logs, _ := pm("logs", name); !strings.Contains(logs, `"msg":"stopped"`) {
			t.Errorf("the container did not drain and stop:\n%s", logs)
		}
		_, _ = pm("rm", "-f", name)
	})
	var health string
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := pm("healthcheck", "run", name)
		if err == nil {
			break
		}
		health = out
		if time.Now().After(deadline) {
			logs, _ := pm("logs", name)
			t.Fatalf("the container's HEALTHCHECK (roost health) never passed: %s\n%s", health, logs)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if user, _ := pm("inspect", "--format", "{{.Config.User}}", name); strings.TrimSpace(user) != "65532:65532" {
		t.Errorf("the container runs as %q, want 65532:65532 (not root)", user)
	}
	tok, err := proto.SignToken([]byte(secret), "chat", "alice", time.Now().Add(time.Hour), nil)
	if err != nil {
		t.Fatal(err)
	}
	c := dialOps(t, port, "token="+tok)
	defer c.Close()
	c.send(`{"op":"join","room":"lobby"}`)
	c.expect("joined")
	c.send(`{"op":"pub","room":"lobby","id":"box-1","body":"hello from a container"}`)
	c.expect("msg")
	if ack := c.expect("ack"); ack.json["id"] != "box-1" {
		t.Fatalf("ack %v", ack.json)
	}

	t.Run("compose", func(t *testing.T) { composeTopology(t, image, pm) })
}

// composeTopology runs what compose.yaml runs, with this machine's
// PostgreSQL and Redis in place of their images (no registry here) and the
// host's network in place of compose's: the image's migrate, then two
// nodes on the database and Redis, an app made with the image's roost, and
// a message from a client of one node to a client of the other.
func composeTopology(t *testing.T, image string, pm func(...string) (string, error)) {
	redistest.Require(t)
	db := pgtest.NewDB(t)
	// podman run with the host's network and the sandbox's limits; the
	// image's arguments follow the image.
	podRun := func(opts []string, args ...string) (string, error) {
		a := append([]string{"run", "--network", "host", "--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096", "-e", "ROOST_DATABASE_URL=" + db}, opts...)
		return pm(append(append(a, image), args...)...)
	}
	out, err := podRun([]string{"--rm", "--no-healthcheck"}, "migrate")
	if err != nil || !strings.Contains(out, "roost migrate: applied 0001_") {
		t.Fatalf("the migrate step (it lists what it applied): %v\n%s", err, out)
	}
	out, err = podRun([]string{"--rm", "--no-healthcheck"}, "app", "create", "chat")
	var created struct{ Secret string }
	if i := strings.IndexByte(out, '{'); err != nil || i < 0 || json.NewDecoder(strings.NewReader(out[i:])).Decode(&created) != nil || created.Secret == "" {
		t.Fatalf("app create: %v %q", err, out)
	}
	redisURL := "redis://" + redistest.Addr + "?prefix=" + redistest.Prefix(t)
	var addrs []string
	for i := range 2 {
		name := fmt.Sprintf("%s-node%d", strings.TrimPrefix(image, "localhost/"), i+1)
		listen, admin := harness.FreeAddr(t), harness.FreeAddr(t)
		if out, err := podRun([]string{"-d", "--name", name, "-e", "ROOST_REDIS_URL=" + redisURL, "-e", "ROOST_NODE_ID=" + name,
			"-e", "ROOST_LISTEN=" + listen, "-e", "ROOST_ADMIN=" + admin, "-e", "ROOST_API=off"}); err != nil {
			t.Fatalf("podman run %s: %v\n%s", name, err, out)
		}
		t.Cleanup(func() {
			if t.Failed() {
				logs, _ := pm("logs", name)
				t.Logf("--- log of %s ---\n%s", name, logs)
			}
			_, _ = pm("stop", "-t", "15", name)
			_, _ = pm("rm", "-f", name)
		})
		waitPort(t, listen, &harness.SyncBuffer{})
		addrs = append(addrs, listen)
	}
	token := func(user string) string {
		tok, err := proto.SignToken([]byte(created.Secret), "chat", user, time.Now().Add(time.Hour), nil)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	a := dialOps(t, addrs[0], "token="+token("alice"))
	defer a.Close()
	b := dialOps(t, addrs[1], "token="+token("bob"))
	defer b.Close()
	a.send(`{"op":"join","room":"lobby"}`)
	a.expect("joined")
	b.send(`{"op":"join","room":"lobby"}`)
	b.expect("joined")
	b.send(`{"op":"pub","room":"lobby","id":"n2-1","body":"from node2"}`)
	// The ack and the publisher's own copy (through Redis) come in either
	// order.
	seen := map[string]bool{}
	for len(seen) < 2 {
		// b's frames go to its channel (dialOps' OnFrame): prototest's
		// Next would never see one.
		f := b.expectAny(5 * time.Second)
		for _, op := range []string{"ack", "msg"} {
			if strings.Contains(string(f.data), `"op":"`+op+`"`) {
				seen[op] = true
			}
		}
	}
	if m := a.expect("msg"); m.json["id"] != "n2-1" || m.json["from"] != "bob" {
		t.Fatalf("node1's client got %v", m.json)
	}
}
