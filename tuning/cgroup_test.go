package tuning

import (
	"errors"
	"os"
	"runtime"
	"strings"
	"testing"
	"testing/fstest"
)

func TestReadCPUQuota(t *testing.T) {
	f := func(dir string, want float64, wantSource string) {
		t.Helper()
		got, source, err := ReadCPUQuota(os.DirFS("testdata/cgroup/" + dir))
		if err != nil {
			t.Fatalf("%s: unexpected error: %v", dir, err)
		}
		if got != want {
			t.Fatalf("%s: got %v cores, want %v", dir, got, want)
		}
		if source != wantSource {
			t.Fatalf("%s: got source %q, want %q", dir, source, wantSource)
		}
	}
	f("v2-limits", 0.5, "cgroup v2 /sys/fs/cgroup/system.slice/roost.service")
	f("v2-nolimits", 0, "cgroup v2 /sys/fs/cgroup/user.slice/user-1000.slice/session-2.scope")
	// The parent slice's 1.5 is tighter than the service's own 2.
	f("v2-nested", 1.5, "cgroup v2 /sys/fs/cgroup/vm.slice/roost.slice")
	f("v2-container", 0.25, "cgroup v2 /sys/fs/cgroup")
	f("v1-docker", 1.5, "cgroup v1 /sys/fs/cgroup/cpu,cpuacct")
	f("v1-hybrid-unlimited", 0, "cgroup v1 /sys/fs/cgroup/cpu")
	f("v1-hierarchical", 0.5, "cgroup v1 /sys/fs/cgroup/cpu,cpuacct")
}

func TestReadMemoryLimit(t *testing.T) {
	f := func(dir string, want int64, wantSource string) {
		t.Helper()
		got, source, err := ReadMemoryLimit(os.DirFS("testdata/cgroup/" + dir))
		if err != nil {
			t.Fatalf("%s: unexpected error: %v", dir, err)
		}
		if got != want {
			t.Fatalf("%s: got %d bytes, want %d", dir, got, want)
		}
		if source != wantSource {
			t.Fatalf("%s: got source %q, want %q", dir, source, wantSource)
		}
	}
	f("v2-limits", 512<<20, "cgroup v2 /sys/fs/cgroup/system.slice/roost.service")
	f("v2-nolimits", 0, "cgroup v2 /sys/fs/cgroup/user.slice/user-1000.slice/session-2.scope")
	f("v2-nested", 256<<20, "cgroup v2 /sys/fs/cgroup/vm.slice")
	f("v2-container", 1<<30, "cgroup v2 /sys/fs/cgroup")
	f("v1-docker", 256<<20, "cgroup v1 /sys/fs/cgroup/memory")
	// 9223372036854771712 is v1's "unlimited", not 8 EiB.
	f("v1-hybrid-unlimited", 0, "cgroup v1 /sys/fs/cgroup/memory/process_api/86d81e41")
	// Only memory.stat's hierarchical_memory_limit sees the pod's limit.
	f("v1-hierarchical", 128<<20, "cgroup v1 /sys/fs/cgroup/memory")
}

func TestReadLimitsErrors(t *testing.T) {
	f := func(dir string, want error, wantText string) {
		t.Helper()
		l, err := ReadLimits(os.DirFS("testdata/cgroup/" + dir))
		if !errors.Is(err, want) {
			t.Fatalf("%s: got error %v, want %v", dir, err, want)
		}
		if !strings.Contains(err.Error(), wantText) {
			t.Fatalf("%s: error %q does not mention %q", dir, err, wantText)
		}
		if l.CPU != 0 || l.Memory != 0 {
			t.Fatalf("%s: got limits %+v with an error, want none", dir, l)
		}
	}
	f("v2-malformed", ErrMalformed, `/sys/fs/cgroup/bad.service/cpu.max "fifty 100000"`)
	f("v2-malformed", ErrMalformed, `/sys/fs/cgroup/bad.service/memory.max "lots"`)
	f("v1-malformed", ErrMalformed, "cpu.cfs_period_us")
	f("v1-malformed", ErrMalformed, `memory.limit_in_bytes "12abc"`)
	f("bad-proc-cgroup", ErrMalformed, "/proc/self/cgroup line")
	f("bad-mountinfo", ErrMalformed, "/proc/self/mountinfo line")
	f("no-proc", ErrNoCgroup, "cannot find the cpu cgroup")
}

func TestLocateWithoutMount(t *testing.T) {
	fsys := fstest.MapFS{
		"proc/self/cgroup":    {Data: []byte("0::/a\n")},
		"proc/self/mountinfo": {Data: []byte("22 1 8:1 / / rw - ext4 /dev/sda1 rw\n")},
	}
	if _, _, err := ReadCPUQuota(fsys); !errors.Is(err, ErrNoCgroup) {
		t.Fatalf("got %v, want ErrNoCgroup for a cgroup that is not mounted", err)
	}
}

func TestLocateEscapedMountPoint(t *testing.T) {
	fsys := fstest.MapFS{
		"proc/self/cgroup":                  {Data: []byte("0::/x\n")},
		"proc/self/mountinfo":               {Data: []byte(`40 1 0:38 / /my\040cgroups rw - cgroup2 cgroup2 rw` + "\n")},
		"my cgroups/x/cpu.max":              {Data: []byte("300000 100000\n")},
		"my cgroups/x/memory.max":           {Data: []byte("1048576\n")},
		"my cgroups/x/cgroup.controllers":   {Data: []byte("cpu memory\n")},
		"my cgroups/cgroup.subtree_control": {Data: []byte("cpu memory\n")},
	}
	l, err := ReadLimits(fsys)
	if err != nil {
		t.Fatal(err)
	}
	if l.CPU != 3 || l.Memory != 1<<20 {
		t.Fatalf("got %+v, want 3 cores and 1MiB", l)
	}
}

func TestParseCPUMax(t *testing.T) {
	f := func(data string, wantQuota, wantPeriod float64, wantOK bool) {
		t.Helper()
		q, p, ok := parseCPUMax(data)
		if ok != wantOK || (ok && (q != wantQuota || p != wantPeriod)) {
			t.Fatalf("parseCPUMax(%q) = %v, %v, %v; want %v, %v, %v", data, q, p, ok, wantQuota, wantPeriod, wantOK)
		}
	}
	f("max 100000", -1, 100000, true)
	f("max", -1, 100000, true)
	f("50000 100000", 50000, 100000, true)
	f("2000 10000", 2000, 10000, true)
	f("", 0, 0, false)
	f("50000 0", 0, 0, false)
	f("0 100000", 0, 0, false)
	f("-5 100000", 0, 0, false)
	f("1 2 3", 0, 0, false)
	f("max abc", 0, 0, false)
}

func TestUnescapeMount(t *testing.T) {
	f := func(in, want string) {
		t.Helper()
		if got := unescapeMount(in); got != want {
			t.Fatalf("unescapeMount(%q) = %q, want %q", in, got, want)
		}
	}
	f("/sys/fs/cgroup", "/sys/fs/cgroup")
	f(`/a\040b`, "/a b")
	f(`/tab\011x\134y`, "/tab\tx\\y")
	f(`/trailing\04`, `/trailing\04`)
	f(`/bad\9zz`, `/bad\9zz`)
}

func TestReadLimitsThisMachine(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("cgroups are Linux only")
	}
	// Whatever this machine has, the real files must parse.
	if _, err := ReadLimits(os.DirFS("/")); err != nil && !errors.Is(err, ErrNoCgroup) {
		t.Fatalf("cannot read this machine's cgroup: %v", err)
	}
}

func FuzzParseCgroupFiles(f *testing.F) {
	f.Add("0::/system.slice/roost.service\n", "25 30 0:23 / /sys/fs/cgroup rw shared:4 - cgroup2 cgroup2 rw\n", "50000 100000")
	f.Fuzz(func(t *testing.T, cg, mi, cpuMax string) {
		lines, err := parseProcCgroup(cg)
		if err == nil && len(lines) == 0 {
			t.Fatal("no lines and no error")
		}
		mounts, err := parseMountinfo(mi)
		if err == nil {
			for _, m := range mounts {
				if m.fstype != "cgroup" && m.fstype != "cgroup2" {
					t.Fatalf("kept a %q mount", m.fstype)
				}
			}
		}
		if q, p, ok := parseCPUMax(cpuMax); ok && (p <= 0 || q == 0) {
			t.Fatalf("parseCPUMax(%q) accepted quota %v period %v", cpuMax, q, p)
		}
		for _, l := range lines {
			for _, m := range mounts {
				c := resolve(2, m, l.path)
				if len(c.levels()) == 0 {
					t.Fatal("no levels")
				}
			}
		}
	})
}
