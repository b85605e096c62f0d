package tuning

import (
	"bytes"
	"errors"
	"log/slog"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestApplyDecisions(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		name     string
		dir      string
		env      map[string]string
		opts     ApplyOptions
		numCPU   int
		start    int   // GOMAXPROCS before (0: 4)
		procs    int   // GOMAXPROCS after
		changed  bool  // GOMAXPROCS set
		mem      int64 // Go memory limit after
		memSet   bool
		from     string // substring of MemLimitFrom
		limitErr error
	}{
		{name: "v2 half core 512MiB", dir: "v2-limits", numCPU: 8, procs: 1, changed: true,
			mem: 512*mib - 512*mib/10, memSet: true, from: "cgroup limit 512MiB minus headroom 51.2MiB"},
		{name: "GOMAXPROCS env wins", dir: "v2-limits", numCPU: 8, env: map[string]string{"GOMAXPROCS": "3"},
			procs: 4, mem: 512*mib - 512*mib/10, memSet: true, from: "cgroup limit"},
		{name: "GOMEMLIMIT env wins", dir: "v2-limits", numCPU: 8, env: map[string]string{"GOMEMLIMIT": "1GiB"},
			procs: 1, changed: true, mem: math.MaxInt64, from: "GOMEMLIMIT environment variable"},
		{name: "GOMEMLIMIT env beats MemLimit", dir: "v2-limits", numCPU: 8, env: map[string]string{"GOMEMLIMIT": "1GiB"},
			opts: ApplyOptions{MemLimit: 100 * mib}, procs: 1, changed: true, mem: math.MaxInt64, from: "GOMEMLIMIT environment variable"},
		{name: "MemLimit option", dir: "v2-limits", numCPU: 8, opts: ApplyOptions{MemLimit: 100 * mib},
			procs: 1, changed: true, mem: 100 * mib, memSet: true, from: "configured memory limit"},
		{name: "Headroom option", dir: "v2-limits", numCPU: 8, opts: ApplyOptions{Headroom: 100 * mib},
			procs: 1, changed: true, mem: 412 * mib, memSet: true, from: "minus headroom 100MiB"},
		{name: "Headroom beyond half", dir: "v2-limits", numCPU: 8, opts: ApplyOptions{Headroom: 400 * mib},
			procs: 1, changed: true, mem: 256 * mib, memSet: true, from: "minus headroom 256MiB"},
		{name: "MemLimit without cgroup", dir: "v2-nolimits", numCPU: 8, opts: ApplyOptions{MemLimit: 64 * mib},
			procs: 4, mem: 64 * mib, memSet: true, from: "configured memory limit"},
		{name: "no limits", dir: "v2-nolimits", numCPU: 8, procs: 4, mem: math.MaxInt64, from: "none"},
		{name: "nested 1.5 cores rounds up", dir: "v2-nested", numCPU: 8, procs: 2, changed: true,
			mem: 256*mib - 32*mib, memSet: true, from: "minus headroom 32MiB"},
		{name: "quota above the machine", dir: "v2-nested", numCPU: 1, procs: 1, changed: true,
			mem: 224 * mib, memSet: true, from: "vm.slice"},
		{name: "quota equal to current", dir: "v2-container", numCPU: 8, start: 1, procs: 1,
			mem: 1024*mib - 1024*mib/10, memSet: true, from: "1GiB"},
		{name: "v1 pod 128MiB", dir: "v1-hierarchical", numCPU: 4, procs: 1, changed: true,
			mem: 96 * mib, memSet: true, from: "minus headroom 32MiB"},
		{name: "v1 unlimited", dir: "v1-hybrid-unlimited", numCPU: 4, procs: 4, mem: math.MaxInt64, from: "none"},
		{name: "no /proc", dir: "no-proc", numCPU: 4, procs: 4, mem: math.MaxInt64, from: "none"},
		{name: "malformed", dir: "v2-malformed", numCPU: 4, procs: 4, mem: math.MaxInt64, from: "none", limitErr: ErrMalformed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			procs, mem := 4, int64(math.MaxInt64)
			var procCalls, memCalls int
			opts := tc.opts
			opts.FS = os.DirFS("testdata/cgroup/" + tc.dir)
			opts.getenv = func(k string) string { return tc.env[k] }
			opts.numCPU = tc.numCPU
			opts.setMaxProcs = func(n int) int {
				prev := procs
				if n > 0 {
					procs = n
					procCalls++
				}
				return prev
			}
			opts.setMemLimit = func(n int64) int64 {
				prev := mem
				if n >= 0 {
					mem = n
					memCalls++
				}
				return prev
			}
			opts.raiseNoFile = func() (uint64, uint64, error) { return 4096, 4096, nil }
			if tc.start > 0 {
				procs = tc.start
			}

			r := Apply(opts, nil)

			if !errors.Is(r.LimitsErr, tc.limitErr) || (tc.limitErr == nil && r.LimitsErr != nil) {
				t.Fatalf("LimitsErr = %v, want %v", r.LimitsErr, tc.limitErr)
			}
			if procs != tc.procs || r.GOMAXPROCS != tc.procs {
				t.Fatalf("GOMAXPROCS = %d (report %d), want %d", procs, r.GOMAXPROCS, tc.procs)
			}
			if r.GOMAXPROCSChanged != tc.changed || (procCalls > 0) != tc.changed {
				t.Fatalf("GOMAXPROCS changed = %v with %d calls, want %v", r.GOMAXPROCSChanged, procCalls, tc.changed)
			}
			if mem != tc.mem || r.MemLimit != tc.mem {
				t.Fatalf("memory limit = %d (report %d), want %d", mem, r.MemLimit, tc.mem)
			}
			if r.MemLimitChanged != tc.memSet || (memCalls > 0) != tc.memSet {
				t.Fatalf("memory limit changed = %v with %d calls, want %v", r.MemLimitChanged, memCalls, tc.memSet)
			}
			if !strings.Contains(r.MemLimitFrom, tc.from) {
				t.Fatalf("MemLimitFrom = %q, want it to mention %q", r.MemLimitFrom, tc.from)
			}
			if r.NoFileSoft != 4096 || r.NoFileHard != 4096 {
				t.Fatalf("nofile = %d/%d, want the hook's 4096/4096", r.NoFileSoft, r.NoFileHard)
			}
		})
	}
}

func TestGoMemLimit(t *testing.T) {
	f := func(limit, headroom, want int64) {
		t.Helper()
		if got := GoMemLimit(limit, headroom); got != want {
			t.Fatalf("GoMemLimit(%d, %d) = %d, want %d", limit, headroom, got, want)
		}
	}
	f(1<<30, 0, 1<<30-(1<<30)/10)
	f(256<<20, 0, 224<<20) // 10% is 25.6MiB: the 32MiB floor applies
	f(48<<20, 0, 24<<20)   // never below half
	f(1<<30, 1<<20, 1<<30-1<<20)
}

func TestGoMaxProcs(t *testing.T) {
	f := func(quota float64, numCPU, want int) {
		t.Helper()
		if got := GoMaxProcs(quota, numCPU); got != want {
			t.Fatalf("GoMaxProcs(%v, %d) = %d, want %d", quota, numCPU, got, want)
		}
	}
	f(0.2, 8, 1)
	f(0.5, 8, 1)
	f(1, 8, 1)
	f(200000.0/100000.0, 8, 2)
	f(1.01, 8, 2)
	f(3.5, 2, 2)
	f(4, 0, 4)
}

// TestApplyRealRuntime runs Apply without hooks on a fixture and checks the
// runtime really changed, then puts the test process back as it was.
func TestApplyRealRuntime(t *testing.T) {
	for _, k := range []string{"GOMAXPROCS", "GOMEMLIMIT"} {
		if os.Getenv(k) != "" {
			t.Skipf("%s is set in the environment: Apply would rightly leave it alone", k)
		}
	}
	prevProcs := runtime.GOMAXPROCS(0)
	prevMem := debug.SetMemoryLimit(-1)
	t.Cleanup(func() {
		runtime.GOMAXPROCS(prevProcs)
		debug.SetMemoryLimit(prevMem)
	})
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))

	r := Apply(ApplyOptions{FS: os.DirFS("testdata/cgroup/v2-limits"), KeepNoFile: true}, log)

	if got := runtime.GOMAXPROCS(0); got != 1 || r.GOMAXPROCS != 1 {
		t.Fatalf("GOMAXPROCS = %d (report %d), want 1 for a 0.5 core quota", got, r.GOMAXPROCS)
	}
	want := int64(512<<20 - (512<<20)/10)
	if got := debug.SetMemoryLimit(-1); got != want {
		t.Fatalf("memory limit = %d, want %d", got, want)
	}
	out := logs.String()
	for _, s := range []string{"tuned the runtime", "tuning.gomaxprocs=1", "tuning.gomemlimit=460.8MiB", "tuning.cgroup_cpu=0.5"} {
		if !strings.Contains(out, s) {
			t.Fatalf("log %q does not contain %q", out, s)
		}
	}
}

func TestApplyLogsUnreadableCgroup(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	opts := ApplyOptions{FS: os.DirFS("testdata/cgroup/v2-malformed"), KeepNoFile: true,
		setMaxProcs: func(int) int { return 2 }, setMemLimit: func(int64) int64 { return math.MaxInt64 }}
	Apply(opts, log)
	if !strings.Contains(logs.String(), "level=WARN msg=\"cannot read cgroup limits") {
		t.Fatalf("no warning for a malformed cgroup in %q", logs.String())
	}
}

func TestRaiseNoFile(t *testing.T) {
	if runtime.GOOS == "windows" || runtime.GOOS == "plan9" {
		t.Skip("no RLIMIT_NOFILE")
	}
	soft, hard, err := RaiseNoFile()
	if err != nil {
		t.Fatal(err)
	}
	if soft == 0 || (soft != hard && hard != ^uint64(0)) {
		t.Fatalf("soft %d, hard %d: want soft raised to hard", soft, hard)
	}
	s2, h2, err := NoFile()
	if err != nil || s2 != soft || h2 != hard {
		t.Fatalf("NoFile() = %d, %d, %v; want %d, %d", s2, h2, err, soft, hard)
	}
}
