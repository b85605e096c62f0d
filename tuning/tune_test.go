package tuning

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
)

func runTune(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = TuneMain(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestTuneMainBadFlags(t *testing.T) {
	f := func(wantStderr string, args ...string) {
		t.Helper()
		code, out, errs := runTune(args...)
		if code != 2 {
			t.Fatalf("%q: exit code %d, want 2", args, code)
		}
		if out != "" {
			t.Fatalf("%q: wrote %q to stdout on a usage error", args, out)
		}
		if !strings.Contains(errs, wantStderr) {
			t.Fatalf("%q: stderr %q does not contain %q", args, errs, wantStderr)
		}
	}
	f("flag provided but not defined: -bogus", "--bogus")
	f(`invalid value "abc" for flag -connections`, "--connections", "abc")
	f("--connections 0 is out of range", "--connections", "0")
	f("--connections -5 is out of range", "--connections=-5")
	f(`--emit "yaml": want sysctl or systemd`, "--emit", "yaml")
	f("--vcpu only applies to --emit systemd", "--vcpu", "0.5")
	f("--memory only applies to --emit systemd", "--emit", "sysctl", "--memory", "1GiB")
	f("--memory: cannot parse size \"lots\"", "--emit", "systemd", "--memory", "lots")
	f("--vcpu -1 is out of range", "--emit", "systemd", "--vcpu", "-1")
	f("systemd needs an absolute path", "--emit", "systemd", "--exec", "roost")
	f("--socket-buffer: cannot parse size", "--socket-buffer", "big")
	f("--destinations 0 must be at least 1", "--dialer", "--destinations", "0")
	f(`unexpected argument "serve"`, "serve")
	f("flag needs an argument: -emit", "--emit")
}

func TestTuneMainHelp(t *testing.T) {
	code, out, errs := runTune("-h")
	if code != 0 || out != "" || !strings.Contains(errs, "Usage: roost tune") || !strings.Contains(errs, "-connections") {
		t.Fatalf("-h: code %d, stdout %q, stderr %q", code, out, errs)
	}
}

func TestTuneMainEmitSysctl(t *testing.T) {
	code, out, errs := runTune("--emit", "sysctl", "--connections", "100000", "--sysctl-root", "testdata/sysctl/low")
	if code != 0 || errs != "" {
		t.Fatalf("code %d, stderr %q", code, errs)
	}
	hasLines(t, out, "fs.nr_open = 1048576", "net.core.somaxconn = 8192", "net.ipv4.ip_local_port_range = 10240 65535")
	if strings.Contains(out, "\nRLIMIT_NOFILE") {
		t.Fatal("sysctl file sets RLIMIT_NOFILE")
	}
}

func TestTuneMainEmitSystemd(t *testing.T) {
	code, out, errs := runTune("--emit", "systemd", "--vcpu", "0.5", "--memory", "512MiB",
		"--exec", "/usr/local/bin/roost", "--args", "serve --listen :8080", "--connections", "50000")
	if code != 0 || errs != "" {
		t.Fatalf("code %d, stderr %q", code, errs)
	}
	hasLines(t, out, "ExecStart=/usr/local/bin/roost serve --listen :8080", "LimitNOFILE=56320",
		"CPUQuota=50%", "MemoryMax=512M")
}

func TestTuneMainReport(t *testing.T) {
	code, out, errs := runTune("--root", "testdata/cgroup/v2-limits", "--sysctl-root", "testdata/sysctl/low")
	if code != 0 || errs != "" {
		t.Fatalf("code %d, stderr %q", code, errs)
	}
	for _, re := range []string{
		`limits for 100000 connections \(111616 file descriptors\)`,
		`cgroup CPU\s+0\.50 cores \(cgroup v2 /sys/fs/cgroup/system\.slice/roost\.service\)\s+GOMAXPROCS 1 at start-up`,
		`cgroup memory\s+512MiB \(cgroup v2 [^)]+\)\s+GOMEMLIMIT 460\.8MiB at start-up`,
		`open files\s+soft \d+, hard \d+`,
		`\s+SETTING\s+CURRENT\s+RECOMMENDED\s+WHY`,
		`LOW\s+net\.core\.somaxconn\s+128\s+8192\s+caps the accept queue`,
		`ok\s+net\.ipv4\.tcp_wmem\s+4096 16384 4194304`,
		`ok\s+net\.netfilter\.nf_conntrack_max\s+absent\s+-\s+conntrack is not loaded`,
		`\d+ settings too low for 100000 connections`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Fatalf("report lacks %s:\n%s", re, out)
		}
	}

	code, out, _ = runTune("--root", "testdata/cgroup/v2-malformed", "--sysctl-root", "testdata/sysctl/high", "--connections", "1000")
	if code != 0 {
		t.Fatalf("code %d", code)
	}
	for _, want := range []string{"cgroup error", "malformed file", "GOMAXPROCS"} {
		if !strings.Contains(out, want) {
			t.Fatalf("report lacks %q:\n%s", want, out)
		}
	}
}

func TestTuneMainWriteError(t *testing.T) {
	var errb bytes.Buffer
	if code := TuneMain([]string{"--emit", "sysctl", "--sysctl-root", "testdata/sysctl/low"}, failWriter{}, &errb); code != 1 {
		t.Fatalf("exit code %d on a failed write, want 1", code)
	}
	if !strings.Contains(errb.String(), "cannot write the sysctl file: disk full") {
		t.Fatalf("stderr %q", errb.String())
	}
	errb.Reset()
	if code := TuneMain([]string{"--sysctl-root", "testdata/sysctl/low"}, failWriter{}, &errb); code != 1 {
		t.Fatalf("exit code %d on a failed report, want 1", code)
	}
}
