// Package harness runs the real roost binary for the black-box tests of
// test/ and the scenario tests of bench/: it builds the binary of this
// module once per test process, starts `roost serve` children on free
// loopback ports with the flags a test gives, waits until each is ready,
// keeps each one's log in a file, and stops them when the test ends.
// Everything it starts listens on 127.0.0.1 and every wait is bounded.
//
// A test package that uses it removes the build in its TestMain:
//
//	func TestMain(m *testing.M) {
//		code := m.Run()
//		harness.Cleanup()
//		os.Exit(code)
//	}
package harness

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/roost-chat/roost/pubsub/redistest"
)

// Module is the module whose main package is the roost binary.
const Module = "github.com/roost-chat/roost"

var build struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

// Binary is the path of the roost binary built from this module's tree,
// built by the first call of the process; a failed build fails t.
func Binary(t testing.TB) string {
	t.Helper()
	build.once.Do(func() {
		build.dir, build.err = os.MkdirTemp("", "roost-harness-")
		if build.err != nil {
			return
		}
		build.bin = filepath.Join(build.dir, "roost")
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if out, err := exec.CommandContext(ctx, "go", "build", "-o", build.bin, Module).CombinedOutput(); err != nil {
			build.err = fmt.Errorf("cannot build roost: %v\n%s", err, out)
		}
	})
	if build.err != nil {
		t.Fatal(build.err)
	}
	return build.bin
}

// Cleanup removes the built binary; TestMain calls it after m.Run.
func Cleanup() {
	if build.dir != "" {
		os.RemoveAll(build.dir)
	}
}

// Root is the directory of this module's go.mod, for tests that read the
// tree (README.md, docs/, client/, .ci/).
func Root(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.HasPrefix(string(b), "module "+Module+"\n") {
			return dir
		}
		up := filepath.Dir(dir)
		if up == dir {
			t.Fatalf("no go.mod of %s above the working directory", Module)
		}
		dir = up
	}
}

// Env is this process's environment without ROOST_* and the URLs a node
// reads from it: only the flags a test gives configure its node.
func Env() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ROOST_") && !strings.HasPrefix(kv, "DATABASE_URL=") && !strings.HasPrefix(kv, "REDIS_URL=") {
			env = append(env, kv)
		}
	}
	return env
}

// FreeAddr is 127.0.0.1 and a port that was free a moment ago.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t, false))
}

// Spec is a node to start: `roost serve --listen Addr --admin Admin Args...`.
type Spec struct {
	Name  string   // in failures and log dumps; "node" when empty
	Addr  string   // client listener; a free loopback port when empty
	Admin string   // admin listener; a free loopback port when empty
	Args  []string // the flags after --listen and --admin; a later flag wins
	Env   []string // added to Env()
	// NoFile is the open-file limit, set by the shell that execs the
	// node so that it holds from the node's first instruction, as under
	// systemd's LimitNOFILE (0: inherited).
	NoFile int
	// CPUQuota honours ROOST_NODE_CPU_QUOTA (see cpuGroup), for figures.
	CPUQuota bool
	// NoWait returns once the process started, without waiting for
	// /readyz (a node that is expected to fail).
	NoWait bool
}

// Node is one `roost serve` child process.
type Node struct {
	Name    string
	Addr    string // client listener
	Admin   string // admin listener
	Cmd     *exec.Cmd
	LogFile string // the node's stdout and stderr
	exited  chan struct{}
}

// Start starts a node as Launch does and fails t when it cannot.
func Start(t testing.TB, s Spec) *Node {
	t.Helper()
	n, err := Launch(t, s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Launch starts a node and, unless s.NoWait, waits up to 15 s until its
// /readyz answers 200. When the harness chose the client port and it was
// taken between choosing and binding, it tries again on other ports. The
// node is stopped when t ends, and its log's tail is dumped if t failed.
// Launch does not call t.Fatal: tests may call it from other goroutines.
func Launch(t testing.TB, s Spec) (*Node, error) {
	bin := Binary(t)
	if s.Name == "" {
		s.Name = "node"
	}
	dir := t.TempDir()
	var lastErr error
	for attempt := range 3 {
		n := &Node{Name: s.Name, Addr: s.Addr, Admin: s.Admin,
			LogFile: filepath.Join(dir, fmt.Sprintf("%s-%d.log", s.Name, attempt)),
			exited:  make(chan struct{}),
		}
		if n.Addr == "" {
			n.Addr = FreeAddr(t)
		}
		if n.Admin == "" {
			n.Admin = FreeAddr(t)
		}
		if err := n.start(t, bin, s); err != nil {
			return nil, err
		}
		t.Cleanup(func() {
			n.Stop()
			if t.Failed() {
				t.Logf("--- log of %s (%s) ---\n%s", n.Name, n.Addr, n.LogTail(60))
			}
		})
		if s.NoWait {
			return n, nil
		}
		err := n.WaitReady(15 * time.Second)
		if err == nil {
			return n, nil
		}
		n.Kill()
		lastErr = fmt.Errorf("%s not ready: %w\n%s", n.Name, err, n.LogTail(40))
		if s.Addr != "" || !strings.Contains(n.LogTail(40), "address already in use") {
			return nil, lastErr
		}
	}
	return nil, lastErr
}

func (n *Node) start(t testing.TB, bin string, s Spec) error {
	args := append([]string{"serve", "--listen", n.Addr, "--admin", n.Admin}, s.Args...)
	lf, err := os.Create(n.LogFile)
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, args...)
	if s.NoFile > 0 {
		cmd = exec.Command("sh", append([]string{"-c", `ulimit -n "$1" && shift && exec "$0" "$@"`, bin, strconv.Itoa(s.NoFile)}, args...)...)
	}
	if cg := cpuGroup(t, s); cg != nil {
		// Enter the group before exec, so the node's runtime sees its
		// quota and CPU set from its first instruction.
		cmd = exec.Command("sh", append([]string{"-c", `echo $$ > "$0/cgroup.procs" && c=$1 b=$2 && shift 2 && exec taskset -c "$c" "$b" "$@"`, cg.dir, cg.cpu, cmd.Path}, cmd.Args[1:]...)...)
	}
	cmd.Env = append(Env(), s.Env...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = ChildAttr()
	if err := cmd.Start(); err != nil {
		lf.Close()
		return fmt.Errorf("cannot start %s: %w", n.Name, err)
	}
	n.Cmd = cmd
	go func() {
		_ = cmd.Wait()
		lf.Close()
		close(n.exited)
	}()
	return nil
}

// cpuShare is a node's CPU limit for figures: ROOST_NODE_CPU_QUOTA=PCT
// puts every node started with Spec.CPUQuota in a cgroup v1 cpu group of
// its own, capped at PCT% of one CPU (10 ms period, so throttling adds at
// most ~10 ms), and pins it with taskset to CPU k mod NumCPU. Unset, nodes
// run unconstrained.
type cpuShare struct{ dir, cpu string }

var cpuSeq struct {
	sync.Mutex
	n int
}

func cpuGroup(t testing.TB, s Spec) *cpuShare {
	pct, err := strconv.Atoi(os.Getenv("ROOST_NODE_CPU_QUOTA"))
	if !s.CPUQuota || err != nil || pct <= 0 {
		return nil
	}
	cpuSeq.Lock()
	k := cpuSeq.n
	cpuSeq.n++
	cpuSeq.Unlock()
	dir := fmt.Sprintf("/sys/fs/cgroup/cpu/roost-test-%d-%s-%d", os.Getpid(), s.Name, k)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("ROOST_NODE_CPU_QUOTA needs a writable cgroup v1 cpu hierarchy: %v", err)
	}
	t.Cleanup(func() { _ = os.Remove(dir) }) // after the node stopped (registered before it)
	for f, v := range map[string]int{"cpu.cfs_period_us": 10000, "cpu.cfs_quota_us": pct * 100} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(strconv.Itoa(v)), 0o644); err != nil {
			t.Fatalf("cannot set %s: %v", f, err)
		}
	}
	return &cpuShare{dir: dir, cpu: strconv.Itoa(k % runtime.NumCPU())}
}

var httpClient = &http.Client{Timeout: 2 * time.Second}

// PID is the node's process ID (under Spec.NoFile or CPUQuota, a shell
// sets the limit and execs the node in the same process).
func (n *Node) PID() int { return n.Cmd.Process.Pid }

// WaitReady waits up to d until /readyz answers 200.
func (n *Node) WaitReady(d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		select {
		case <-n.exited:
			return errors.New("process exited")
		default:
		}
		resp, err := httpClient.Get("http://" + n.Admin + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("readyz: %s", resp.Status)
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Readyz is the /readyz status (0 when the admin listener does not answer).
func (n *Node) Readyz() int {
	resp, err := httpClient.Get("http://" + n.Admin + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// Done is closed when the process has exited.
func (n *Node) Done() <-chan struct{} { return n.exited }

// Alive reports whether the process is still running.
func (n *Node) Alive() bool {
	select {
	case <-n.exited:
		return false
	default:
		return true
	}
}

// Stop is SIGTERM (the node drains), then SIGKILL if it has not exited
// within 15 s.
func (n *Node) Stop() {
	if !n.Alive() {
		return
	}
	_ = n.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.exited:
	case <-time.After(15 * time.Second):
		n.Kill()
	}
}

// Kill is SIGKILL: the node dies with whatever it had in flight.
func (n *Node) Kill() {
	_ = n.Cmd.Process.Kill()
	<-n.exited
}

// ExitCode waits up to d for the node to exit and returns its code.
func (n *Node) ExitCode(t testing.TB, d time.Duration) int {
	t.Helper()
	select {
	case <-n.exited:
		return n.Cmd.ProcessState.ExitCode()
	case <-time.After(d):
		t.Fatalf("%s still running after %s\n%s", n.Name, d, n.LogTail(30))
		return 0
	}
}

// Log is the node's whole log so far.
func (n *Node) Log() string {
	b, err := os.ReadFile(n.LogFile)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// LogTail is the last lines of the node's log.
func (n *Node) LogTail(lines int) string {
	ls := strings.Split(strings.TrimRight(n.Log(), "\n"), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n")
}

// Health is what /healthz reports.
type Health struct{ Conns, Rooms, Loops int }

// Health reads /healthz.
func (n *Node) Health(t testing.TB) Health {
	t.Helper()
	resp, err := httpClient.Get("http://" + n.Admin + "/healthz")
	if err != nil {
		t.Fatalf("%s /healthz: %v", n.Name, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var h Health
	for _, f := range strings.Fields(string(b)) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			continue
		}
		x, _ := strconv.Atoi(v)
		switch k {
		case "conns":
			h.Conns = x
		case "rooms":
			h.Rooms = x
		case "loops":
			h.Loops = x
		}
	}
	return h
}

// Metrics reads /metrics into series -> value (a series with labels is
// keyed as printed: name{label="value"}).
func (n *Node) Metrics(t testing.TB) map[string]float64 {
	t.Helper()
	resp, err := httpClient.Get("http://" + n.Admin + "/metrics")
	if err != nil {
		t.Fatalf("%s /metrics: %v", n.Name, err)
	}
	defer resp.Body.Close()
	m := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
			m[k] = f
		}
	}
	return m
}

// CPUTime is the node's user+system CPU so far (Linux /proc; 0 elsewhere).
func (n *Node) CPUTime() time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", n.PID()))
	if err != nil {
		return 0
	}
	// Fields after the parenthesised command name; utime and stime are
	// fields 14 and 15, in clock ticks (100 per second on Linux).
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+st) * 10 * time.Millisecond
}

// RSS is the node's resident set in bytes (Linux /proc).
func (n *Node) RSS(t testing.TB) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", n.PID()))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// SyncBuffer collects a node's log while it runs: the process writes it
// as the test reads it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
