package tuning

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/golden")

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	p := "testdata/golden/" + name
	if *update {
		if err := os.WriteFile(p, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("%v (run go test ./tuning/ -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s differs from the golden file (rerun with -update after checking):\n%s", name, got)
	}
}

func hasLines(t *testing.T, out string, lines ...string) {
	t.Helper()
	have := map[string]bool{}
	for _, l := range strings.Split(out, "\n") {
		have[l] = true
	}
	for _, l := range lines {
		if !have[l] {
			t.Fatalf("output lacks the line %q:\n%s", l, out)
		}
	}
}

func TestWriteSysctl(t *testing.T) {
	target := Target{Connections: 100000, PageSize: 4096, NoFile: 1024}
	var buf bytes.Buffer
	if err := WriteSysctl(&buf, target, Check("testdata/sysctl/low", target)); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	hasLines(t, out,
		"fs.file-max = 1048576",
		"fs.nr_open = 1048576",
		"net.core.somaxconn = 8192",
		"net.ipv4.tcp_max_syn_backlog = 8192",
		"net.ipv4.ip_local_port_range = 10240 65535",
		"net.ipv4.tcp_mem = 100000 200000 300000",
		"net.ipv4.tcp_rmem = 4096 131072 6291456",
		"net.ipv4.tcp_wmem = 4096 16384 4194304",
		"# net.netfilter.nf_conntrack_max = 200000",
	)
	if strings.Contains(out, "\nRLIMIT_NOFILE") {
		t.Fatal("RLIMIT_NOFILE is not a sysctl")
	}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l != "" && !strings.HasPrefix(l, "#") && !strings.Contains(l, " = ") {
			t.Fatalf("line %q is neither a comment nor a setting", l)
		}
	}
	golden(t, "sysctl-low.conf", buf.Bytes())

	// A stock 2 GiB Debian VM; docs/tuning.md shows this file.
	buf.Reset()
	if err := WriteSysctl(&buf, target, Check("testdata/sysctl/debian-2g", target)); err != nil {
		t.Fatal(err)
	}
	hasLines(t, buf.String(), "fs.file-max = 9223372036854775807", "net.core.somaxconn = 8192", "net.ipv4.tcp_mem = 100000 200000 300000")
	golden(t, "sysctl-debian-2g.conf", buf.Bytes())

	// On a machine already above the target nothing is lowered.
	buf.Reset()
	high := Target{Connections: 100000, PageSize: 4096}
	if err := WriteSysctl(&buf, high, Check("testdata/sysctl/high", high)); err != nil {
		t.Fatal(err)
	}
	hasLines(t, buf.String(),
		"fs.file-max = 9223372036854775807",
		"net.ipv4.ip_local_port_range = 1024 65535",
		"net.netfilter.nf_conntrack_max = 1048576")
}

func TestWriteSystemd(t *testing.T) {
	var buf bytes.Buffer
	err := WriteSystemd(&buf, UnitOptions{Exec: "/usr/local/bin/roost", Args: "serve", VCPU: 0.5, Memory: 512 << 20, Connections: 100000})
	if err != nil {
		t.Fatal(err)
	}
	hasLines(t, buf.String(),
		"[Service]",
		"EnvironmentFile=/etc/roost/roost.env",
		"User=roost",
		"DynamicUser=yes",
		"StateDirectory=roost",
		"ExecStart=/usr/local/bin/roost serve",
		"LimitNOFILE=111616",
		"CPUQuota=50%",
		"CPUQuotaPeriodSec=10ms",
		"MemoryMax=512M",
		"[Install]",
		"WantedBy=multi-user.target")
	golden(t, "roost-0.5cpu-512MiB.service", buf.Bytes())

	f := func(o UnitOptions, want ...string) {
		t.Helper()
		var b bytes.Buffer
		if err := WriteSystemd(&b, o); err != nil {
			t.Fatal(err)
		}
		hasLines(t, b.String(), want...)
	}
	f(UnitOptions{Exec: "/opt/roost", VCPU: 2, Memory: 1 << 30, Connections: 1000},
		"ExecStart=/opt/roost", "CPUQuota=200%", "MemoryMax=1G", "LimitNOFILE=3072")
	f(UnitOptions{Exec: "/opt/roost", VCPU: 1.5, Memory: 300 << 20},
		"CPUQuota=150%", "MemoryMax=300M", "LimitNOFILE=111616")
	f(UnitOptions{Exec: "/opt/roost", Memory: 1e9}, "MemoryMax=1000000000")
	// % starts a systemd specifier.
	f(UnitOptions{Exec: "/opt/roost", Args: "serve --name=node%1"}, "ExecStart=/opt/roost serve --name=node%%1")

	var b bytes.Buffer
	_ = WriteSystemd(&b, UnitOptions{Exec: "/opt/roost"})
	if strings.Contains(b.String(), "CPUQuota") || strings.Contains(b.String(), "MemoryMax") {
		t.Fatalf("unconfined unit sets CPUQuota or MemoryMax:\n%s", b.String())
	}
}

func TestWriteSystemdErrors(t *testing.T) {
	f := func(o UnitOptions, want string) {
		t.Helper()
		err := WriteSystemd(&bytes.Buffer{}, o)
		if !errors.Is(err, ErrBadUnit) || !strings.Contains(err.Error(), want) {
			t.Fatalf("got %v, want ErrBadUnit mentioning %q", err, want)
		}
	}
	f(UnitOptions{Exec: "roost"}, "absolute path")
	f(UnitOptions{Exec: "/opt/roost", Args: "serve\nExecStartPre=/bin/sh"}, "line break")
	f(UnitOptions{Exec: "/opt/roost", VCPU: -1}, "negative")
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestWriteFailures(t *testing.T) {
	if err := WriteSysctl(failWriter{}, Target{}, Check("testdata/sysctl/low", Target{})); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("got %v, want the write error", err)
	}
	if err := WriteSystemd(failWriter{}, UnitOptions{Exec: "/opt/roost"}); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("got %v, want the write error", err)
	}
}

// TestDocShowsEmittedFiles keeps docs/tuning.md's copies of the emitted
// files in step with what roost tune writes.
func TestDocShowsEmittedFiles(t *testing.T) {
	doc, err := os.ReadFile("../docs/tuning.md")
	if err != nil {
		t.Skipf("no docs/tuning.md next to the package: %v", err)
	}
	for _, name := range []string{"sysctl-debian-2g.conf", "roost-0.5cpu-512MiB.service"} {
		g, err := os.ReadFile("testdata/golden/" + name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(doc, g) {
			t.Fatalf("docs/tuning.md does not show the current %s: paste testdata/golden/%s into it", name, name)
		}
	}
}

// The emitted unit passes systemd's own check, where systemd-analyze is
// installed (the binary is /bin/true: verify wants an executable).
func TestUnitVerifies(t *testing.T) {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("no systemd-analyze")
	}
	var buf bytes.Buffer
	if err := WriteSystemd(&buf, UnitOptions{Exec: "/bin/true", Args: "serve", VCPU: 1, Memory: 1 << 30, Connections: 10000}); err != nil {
		t.Fatal(err)
	}
	unit := filepath.Join(t.TempDir(), "roost.service")
	if err := os.WriteFile(unit, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(sa, "verify", unit).CombinedOutput()
	// It checks the unit's directives and its ExecStart binary (not the
	// EnvironmentFile, read at start); any complaint names the unit.
	if err != nil || strings.Contains(string(out), "roost.service:") {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}
