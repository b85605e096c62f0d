package tuning

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

func findingsBySetting(fs []Finding) map[string]Finding {
	m := make(map[string]Finding, len(fs))
	for _, f := range fs {
		m[f.Setting] = f
	}
	return m
}

type wantFinding struct {
	current, recommended string
	tooLow               bool
}

func checkFindings(t *testing.T, fs []Finding, want map[string]wantFinding) {
	t.Helper()
	got := findingsBySetting(fs)
	if len(got) != len(want) {
		t.Fatalf("got %d findings, want %d: %+v", len(got), len(want), fs)
	}
	for name, w := range want {
		f, ok := got[name]
		if !ok {
			t.Fatalf("no finding for %s", name)
		}
		if f.Current != w.current || f.Recommended != w.recommended || f.TooLow != w.tooLow {
			t.Fatalf("%s: got current %q recommended %q low %v; want %q %q %v (why: %s)",
				name, f.Current, f.Recommended, f.TooLow, w.current, w.recommended, w.tooLow, f.Why)
		}
		if f.Why == "" {
			t.Fatalf("%s: no why", name)
		}
	}
}

func TestCheckLow(t *testing.T) {
	fs := Check("testdata/sysctl/low", Target{Connections: 100000, PageSize: 4096, NoFile: 1024})
	checkFindings(t, fs, map[string]wantFinding{
		"fs.file-max":                    {"50000", "1048576", true},
		"fs.nr_open":                     {"65536", "1048576", true},
		"net.core.somaxconn":             {"128", "8192", true},
		"net.ipv4.tcp_max_syn_backlog":   {"512", "8192", true},
		"net.ipv4.ip_local_port_range":   {"32768 60999", "32768 60999", false},
		"net.ipv4.tcp_mem":               {"5727 7638 11454", "100000 200000 300000", true},
		"net.ipv4.tcp_rmem":              {"4096 131072 6291456", "4096 131072 6291456", false},
		"net.ipv4.tcp_wmem":              {"4096 16384 4194304", "4096 16384 4194304", false},
		"net.netfilter.nf_conntrack_max": {"absent", "-", false},
		"RLIMIT_NOFILE":                  {"1024", "111616", true},
	})
	if w := findingsBySetting(fs)["net.ipv4.ip_local_port_range"].Why; !strings.Contains(w, "28232") {
		t.Fatalf("port range why %q does not give the port count", w)
	}
}

func TestCheckHigh(t *testing.T) {
	fs := Check("testdata/sysctl/high", Target{Connections: 100000, PageSize: 4096, NoFile: 1 << 20})
	checkFindings(t, fs, map[string]wantFinding{
		// Never recommend lowering what is already there.
		"fs.file-max":                    {"9223372036854775807", "9223372036854775807", false},
		"fs.nr_open":                     {"2097152", "2097152", false},
		"net.core.somaxconn":             {"65535", "65535", false},
		"net.ipv4.tcp_max_syn_backlog":   {"65535", "65535", false},
		"net.ipv4.ip_local_port_range":   {"1024 65535", "1024 65535", false},
		"net.ipv4.tcp_mem":               {"1000000 2000000 3000000", "1000000 2000000 3000000", false},
		"net.ipv4.tcp_rmem":              {"4096 131072 6291456", "4096 131072 6291456", false},
		"net.ipv4.tcp_wmem":              {"4096 16384 4194304", "4096 16384 4194304", false},
		"net.netfilter.nf_conntrack_max": {"1048576", "1048576", false},
		"RLIMIT_NOFILE":                  {"1048576", "1048576", false},
	})
}

func TestCheckScalesWithTarget(t *testing.T) {
	small := findingsBySetting(Check("testdata/sysctl/low", Target{Connections: 1000, PageSize: 4096}))
	if small["fs.file-max"].TooLow || small["fs.nr_open"].TooLow || small["net.ipv4.tcp_mem"].TooLow {
		t.Fatalf("1000 connections fit the low fixture's descriptors and tcp_mem: %+v", small)
	}
	if !small["net.core.somaxconn"].TooLow || small["net.core.somaxconn"].Recommended != "4096" {
		t.Fatalf("somaxconn 128 is too low at any size, want 4096: %+v", small["net.core.somaxconn"])
	}
	if _, ok := small["RLIMIT_NOFILE"]; ok {
		t.Fatal("RLIMIT_NOFILE checked without Target.NoFile")
	}
	big := findingsBySetting(Check("testdata/sysctl/high", Target{Connections: 2_000_000, PageSize: 4096}))
	for _, name := range []string{"fs.nr_open", "net.netfilter.nf_conntrack_max", "net.ipv4.tcp_mem"} {
		if !big[name].TooLow {
			t.Fatalf("%s should be too low for 2M connections: %+v", name, big[name])
		}
	}
	if got := big["net.core.somaxconn"].Recommended; got != "65535" {
		t.Fatalf("somaxconn recommendation %s, want the 65535 cap", got)
	}
	if got := big["net.netfilter.nf_conntrack_max"].Recommended; got != "4000000" {
		t.Fatalf("conntrack recommendation %s, want 2x the target", got)
	}
}

func TestCheckDialer(t *testing.T) {
	f := func(root string, conns, dests int, wantRec string, wantLow bool, wantWhy string) {
		t.Helper()
		p := findingsBySetting(Check(root, Target{Connections: conns, Dialer: true, Destinations: dests}))["net.ipv4.ip_local_port_range"]
		if p.Recommended != wantRec || p.TooLow != wantLow || !strings.Contains(p.Why, wantWhy) {
			t.Fatalf("%s %d/%d: got %+v; want recommended %q low %v why ~%q", root, conns, dests, p, wantRec, wantLow, wantWhy)
		}
	}
	// The LB wall of docs/tuning.md: 84,000 connections through one LB address
	// to 3 nodes is 28,000 per node, right at the default range's 28,232.
	f("testdata/sysctl/low", 84000, 3, "10240 65535", false, "28232 ports for 28000 connections")
	f("testdata/sysctl/low", 90000, 3, "10240 65535", true, "28232 ports for 30000 connections")
	f("testdata/sysctl/low", 100000, 1, "10240 65535", true, "add source IPs")
	f("testdata/sysctl/high", 100000, 1, "1024 65535", true, "add source IPs")
	f("testdata/sysctl/high", 100000, 2, "1024 65535", false, "64512 ports for 50000")
}

func TestCheckMalformed(t *testing.T) {
	got := findingsBySetting(Check("testdata/sysctl/malformed", Target{Connections: 100000, PageSize: 4096}))
	f := func(name, current, rec string) {
		t.Helper()
		g := got[name]
		if g.Current != current || g.Recommended != rec || g.TooLow {
			t.Fatalf("%s: got %+v, want current %q recommended %q and not too low", name, g, current, rec)
		}
	}
	f("fs.file-max", "malformed", "1048576")
	f("fs.nr_open", "unknown", "1048576")
	f("net.core.somaxconn", "malformed", "8192")
	f("net.ipv4.ip_local_port_range", "malformed", "10240 65535")
	f("net.ipv4.tcp_mem", "malformed", "100000 200000 300000")
	f("net.ipv4.tcp_rmem", "malformed", "4096 131072 6291456")
	f("net.ipv4.tcp_wmem", "unknown", "4096 16384 4194304")
	f("net.netfilter.nf_conntrack_max", "malformed", "200000")
	if w := got["net.ipv4.ip_local_port_range"].Why; !strings.Contains(w, "two ascending ports") {
		t.Fatalf("why %q does not say what is wrong", w)
	}
}

func TestLogFindings(t *testing.T) {
	var buf bytes.Buffer
	LogFindings(slog.New(slog.NewTextHandler(&buf, nil)), Check("testdata/sysctl/low", Target{Connections: 100000, PageSize: 4096, NoFile: 1024}))
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("got %d log lines, want one naming every too-low setting:\n%s", len(lines), buf.String())
	}
	if l := lines[0]; !strings.Contains(l, "level=WARN") || !strings.Contains(l, "`roost tune`") || strings.Count(strings.SplitN(l, "settings=", 2)[1], ",") != 5 {
		t.Fatalf("line %q is not one warning pointing at roost tune and naming the 6 settings", l)
	}
	buf.Reset()
	LogFindings(slog.New(slog.NewTextHandler(&buf, nil)), Check("testdata/sysctl/high", Target{Connections: 100000}))
	if buf.Len() != 0 {
		t.Fatalf("warnings for a machine that is fine: %s", buf.String())
	}
	LogFindings(nil, nil) // a nil logger is allowed
}

func TestTargetFDs(t *testing.T) {
	f := func(conns int, want uint64) {
		t.Helper()
		if got := (Target{Connections: conns}).FDs(); got != want {
			t.Fatalf("FDs(%d) = %d, want %d", conns, got, want)
		}
	}
	f(100000, 111616)
	f(0, 111616) // the default target
	f(1, 2048)
	f(1_000_000, 1101824)
}
