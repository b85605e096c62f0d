// Package redistest gives tests the machine's real Redis and, when they
// need one of their own, redis-server child processes: single servers on
// free loopback ports and three-shard Redis Clusters. Tests never mock
// Redis. Setup speaks raw RESP or runs redis-cli, so it does not depend on
// the code under test; the package must not import pubsub, whose own
// tests use it.
package redistest

import (
	"bufio"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Addr is the machine's shared Redis.
const Addr = "127.0.0.1:6379"

// skipOrFail skips a test whose service is missing, unless CI demands it.
func skipOrFail(tb testing.TB, format string, args ...any) {
	tb.Helper()
	if os.Getenv("CI") == "true" {
		tb.Fatalf(format, args...)
	}
	tb.Skipf(format, args...)
}

// Require skips tb, or fails it when CI=true, unless the shared Redis at
// Addr answers PING.
func Require(tb testing.TB) {
	tb.Helper()
	if err := Ping(Addr); err != nil {
		skipOrFail(tb, "redis at %s is not available (%v): start Redis 7 there to run this test", Addr, err)
	}
}

// RequireBinaries skips tb, or fails it when CI=true, unless redis-server
// and redis-cli are in PATH.
func RequireBinaries(tb testing.TB) {
	tb.Helper()
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			skipOrFail(tb, "%s not in PATH: install redis-server to run this test", bin)
		}
	}
}

// Ping sends PING to the Redis at addr and expects +PONG, within a second.
func Ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

// Prefix returns a random channel prefix, isolating a test's channels
// from every other test and node sharing the Redis.
func Prefix(tb testing.TB) string {
	var b [6]byte
	_, _ = crand.Read(b[:])
	return "roosttest-" + hex.EncodeToString(b[:])
}

// FreePort returns a loopback port that is free, and whose cluster bus
// port (+10000) is free too when bus is set.
func FreePort(tb testing.TB, bus bool) int {
	tb.Helper()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		if !bus {
			l.Close()
			return port
		}
		if port+10000 < 65536 {
			if l2, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port+10000)); err == nil {
				l2.Close()
				l.Close()
				return port
			}
		}
		l.Close()
	}
	tb.Fatal("no free port found")
	return 0
}

// Server is a redis-server child process owned by a test.
type Server struct {
	Port int
	args []string
	cmd  *exec.Cmd
}

// Start runs redis-server on port, without persistence, with extra
// arguments appended, waits until it answers PING and kills it when tb
// ends. Callers check RequireBinaries first.
func Start(tb testing.TB, port int, extra ...string) *Server {
	tb.Helper()
	s := &Server{Port: port, args: append([]string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize", "no",
	}, extra...)}
	s.start(tb)
	tb.Cleanup(s.Kill)
	return s
}

// Addr is where the server listens.
func (s *Server) Addr() string { return fmt.Sprintf("127.0.0.1:%d", s.Port) }

func (s *Server) start(tb testing.TB) {
	tb.Helper()
	cmd := exec.Command("redis-server", s.args...)
	cmd.SysProcAttr = dieWithParent()
	if err := cmd.Start(); err != nil {
		tb.Fatalf("cannot start redis-server: %v", err)
	}
	s.cmd = cmd
	WaitFor(tb, 5*time.Second, func() error { return Ping(s.Addr()) })
}

// Restart starts the server again on its port with its arguments, killing
// it first if it still runs, and waits until it answers PING. A cluster
// node keeps its slots through its nodes.conf.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	s.Kill()
	s.start(tb)
}

// Kill is kill -9: no shutdown, no goodbye to the clients. Killing a
// server that is not running does nothing.
func (s *Server) Kill() {
	if s.cmd != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
		s.cmd = nil
	}
}

// StartCluster starts a three-shard Redis Cluster (no replicas) of child
// processes and waits until every node reports cluster_state:ok. Without
// the Redis binaries tb is skipped, or fails when CI=true.
func StartCluster(tb testing.TB) []*Server {
	tb.Helper()
	RequireBinaries(tb)
	dir := tb.TempDir()
	var nodes []*Server
	var addrs []string
	for range 3 {
		port := FreePort(tb, true)
		n := Start(tb, port,
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, fmt.Sprintf("nodes-%d.conf", port)),
			"--dir", dir)
		nodes = append(nodes, n)
		addrs = append(addrs, n.Addr())
	}
	args := append(append([]string{"--cluster", "create"}, addrs...), "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		tb.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	WaitClusterOK(tb, nodes)
	return nodes
}

// WaitClusterOK waits until every node reports cluster_state:ok, failing
// tb after 10 seconds.
func WaitClusterOK(tb testing.TB, nodes []*Server) {
	tb.Helper()
	WaitFor(tb, 10*time.Second, func() error {
		for _, n := range nodes {
			out, err := exec.Command("redis-cli", "-p", strconv.Itoa(n.Port), "cluster", "info").Output()
			if err != nil {
				return fmt.Errorf("cluster info on %s: %v", n.Addr(), err)
			}
			if !strings.Contains(string(out), "cluster_state:ok") {
				return fmt.Errorf("cluster state on %s is not ok", n.Addr())
			}
		}
		return nil
	})
}

// CLI runs one redis-cli command against the server on port and returns
// its output, failing tb if redis-cli fails or Redis answers an error.
func CLI(tb testing.TB, port int, args ...string) string {
	tb.Helper()
	out, err := exec.Command("redis-cli", append([]string{"-h", "127.0.0.1", "-p", strconv.Itoa(port)}, args...)...).CombinedOutput()
	if err != nil || strings.HasPrefix(string(out), "ERR") {
		tb.Fatalf("redis-cli %v on port %d: %v %s", args, port, err, out)
	}
	return string(out)
}

// WaitFor polls f every 10 ms until it returns nil or d passes, then fails
// tb with f's last error. It is the bounded wait of every setup here,
// exported so that tests driving these servers wait on the same terms.
func WaitFor(tb testing.TB, d time.Duration, f func() error) {
	tb.Helper()
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("after %s: %v", d, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
