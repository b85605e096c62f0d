package tuning

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"runtime"
	"runtime/debug"
)

const (
	// minHeadroom is the least memory kept between GOMEMLIMIT and the cgroup
	// limit: the Go limit covers only the Go heap, stacks and runtime; the
	// kernel also charges the cgroup for page cache, socket buffers of
	// other cgroups' making, and memory outside the Go runtime.
	minHeadroom = 32 << 20
	// headroomDiv keeps 1/10 of the limit free by default.
	headroomDiv = 10
)

// ApplyOptions configure Apply. The zero value reads the real cgroup and
// uses the default headroom.
type ApplyOptions struct {
	// FS holds /proc/self and the cgroup mounts; nil means os.DirFS("/").
	FS fs.FS
	// MemLimit, when positive, is the Go memory limit in bytes, used
	// instead of the cgroup limit minus Headroom (the GOMEMLIMIT
	// environment variable still wins).
	MemLimit int64
	// Headroom, when positive, is kept between the cgroup memory limit and
	// the Go memory limit instead of the default (10% of the limit, at
	// least 32 MiB). The Go limit never goes below half the cgroup limit.
	Headroom int64
	// KeepNoFile leaves RLIMIT_NOFILE alone (it is still reported).
	KeepNoFile bool

	// Hooks so tests decide without changing the test process.
	getenv      func(string) string
	numCPU      int
	setMaxProcs func(int) int
	setMemLimit func(int64) int64
	raiseNoFile func() (uint64, uint64, error)
}

// Report says what Apply found and did; log it with slog (it is a
// slog.LogValuer) or print it.
type Report struct {
	Limits    Limits
	LimitsErr error // the cgroup could not be read (ErrNoCgroup is not reported)

	GOMAXPROCS        int    // in effect after Apply
	GOMAXPROCSFrom    string // why it has that value
	GOMAXPROCSChanged bool

	MemLimit        int64 // Go memory limit after Apply; math.MaxInt64 means none
	MemLimitFrom    string
	MemLimitChanged bool

	NoFileSoft, NoFileHard uint64
	NoFileErr              error
}

// LogValue groups the report for one structured log line.
func (r Report) LogValue() slog.Value {
	attrs := []slog.Attr{
		slog.Int("gomaxprocs", r.GOMAXPROCS),
		slog.String("gomaxprocs_from", r.GOMAXPROCSFrom),
		slog.String("gomemlimit", memLimitString(r.MemLimit)),
		slog.String("gomemlimit_from", r.MemLimitFrom),
		slog.Float64("cgroup_cpu", r.Limits.CPU),
		slog.String("cgroup_memory", memLimitString(r.Limits.Memory)),
	}
	if r.NoFileErr == nil {
		attrs = append(attrs, slog.Uint64("nofile_soft", r.NoFileSoft), slog.Uint64("nofile_hard", r.NoFileHard))
	}
	return slog.GroupValue(attrs...)
}

func memLimitString(n int64) string {
	if n <= 0 || n == math.MaxInt64 {
		return "none"
	}
	return FormatSize(n)
}

// DefaultHeadroom is the memory Apply keeps free below a cgroup limit of
// limit bytes: 10% of it, at least 32 MiB.
func DefaultHeadroom(limit int64) int64 {
	return max(limit/headroomDiv, minHeadroom)
}

// GoMemLimit is the Go memory limit Apply derives from a cgroup memory
// limit: limit minus headroom (DefaultHeadroom when headroom <= 0), never
// below half the limit so that a large headroom on a small VM does not
// starve the heap.
func GoMemLimit(limit, headroom int64) int64 {
	if headroom <= 0 {
		headroom = DefaultHeadroom(limit)
	}
	return max(limit-headroom, limit/2)
}

// GoMaxProcs is the GOMAXPROCS Apply derives from a CPU quota in cores:
// rounded up, at least 1, at most numCPU. Go's own default (Go 1.25+) rounds
// a quota below 2 up to 2; on a 0.5 vCPU VM that lets two threads, the
// garbage collector's included, spend the period's quota in half the
// period and then stall, so one P is the better fit for an event-loop node.
func GoMaxProcs(quota float64, numCPU int) int {
	// The epsilon absorbs quota/period float noise: 200000/100000 is 2, not 3.
	n := int(math.Ceil(quota - 1e-9))
	n = max(n, 1)
	if numCPU > 0 {
		n = min(n, numCPU)
	}
	return n
}

// Apply fits the Go runtime to the cgroup the process runs in: GOMAXPROCS
// from the CPU quota unless the GOMAXPROCS environment variable is set, the
// Go memory limit from the memory limit minus a headroom (or
// opts.MemLimit) unless GOMEMLIMIT is set, and the open-file soft limit
// raised to the hard limit. It logs one line with what it did (and a
// warning per thing it could not read) when log is not nil. Call it once,
// first thing in main.
func Apply(opts ApplyOptions, log *slog.Logger) Report {
	opts.defaults()
	var r Report

	r.Limits, r.LimitsErr = ReadLimits(opts.FS)
	// No cgroup is the normal case off Linux or without /proc: no limits.
	r.LimitsErr = dropNoCgroup(r.LimitsErr)

	cur := opts.setMaxProcs(0)
	switch {
	case opts.getenv("GOMAXPROCS") != "":
		r.GOMAXPROCS, r.GOMAXPROCSFrom = cur, "GOMAXPROCS environment variable"
	case r.Limits.CPU > 0:
		n := GoMaxProcs(r.Limits.CPU, opts.numCPU)
		r.GOMAXPROCS, r.GOMAXPROCSFrom = n, fmt.Sprintf("CPU quota %.2f cores (%s)", r.Limits.CPU, r.Limits.CPUSource)
		if n != cur {
			opts.setMaxProcs(n)
			r.GOMAXPROCSChanged = true
		}
	default:
		r.GOMAXPROCS, r.GOMAXPROCSFrom = cur, "runtime default (no CPU quota)"
	}

	curMem := opts.setMemLimit(-1)
	var want int64
	switch {
	case opts.getenv("GOMEMLIMIT") != "":
		r.MemLimit, r.MemLimitFrom = curMem, "GOMEMLIMIT environment variable"
	case opts.MemLimit > 0:
		want, r.MemLimitFrom = opts.MemLimit, "configured memory limit"
	case r.Limits.Memory > 0:
		want = GoMemLimit(r.Limits.Memory, opts.Headroom)
		r.MemLimitFrom = fmt.Sprintf("cgroup limit %s minus headroom %s (%s)",
			FormatSize(r.Limits.Memory), FormatSize(r.Limits.Memory-want), r.Limits.MemorySource)
	default:
		r.MemLimit, r.MemLimitFrom = curMem, "none (no cgroup memory limit)"
	}
	if want > 0 {
		r.MemLimit = want
		if want != curMem {
			opts.setMemLimit(want)
			r.MemLimitChanged = true
		}
	}

	if opts.KeepNoFile {
		r.NoFileSoft, r.NoFileHard, r.NoFileErr = NoFile()
	} else {
		r.NoFileSoft, r.NoFileHard, r.NoFileErr = opts.raiseNoFile()
	}

	if log != nil {
		ctx := context.Background()
		if r.LimitsErr != nil {
			log.LogAttrs(ctx, slog.LevelWarn, "cannot read cgroup limits; GOMAXPROCS and GOMEMLIMIT keep their defaults for what failed",
				slog.Any("err", r.LimitsErr))
		}
		if r.NoFileErr != nil {
			log.LogAttrs(ctx, slog.LevelWarn, "cannot raise the open-file limit", slog.Any("err", r.NoFileErr))
		}
		log.LogAttrs(ctx, slog.LevelInfo, "tuned the runtime to its cgroup", slog.Any("tuning", r))
	}
	return r
}

func (o *ApplyOptions) defaults() {
	if o.FS == nil {
		o.FS = os.DirFS("/")
	}
	if o.getenv == nil {
		o.getenv = os.Getenv
	}
	if o.numCPU == 0 {
		o.numCPU = runtime.NumCPU()
	}
	if o.setMaxProcs == nil {
		o.setMaxProcs = runtime.GOMAXPROCS
	}
	if o.setMemLimit == nil {
		o.setMemLimit = debug.SetMemoryLimit
	}
	if o.raiseNoFile == nil {
		o.raiseNoFile = RaiseNoFile
	}
}

// dropNoCgroup removes the ErrNoCgroup parts of a joined error: a missing
// cgroup means "no limit", which is not worth a warning.
func dropNoCgroup(err error) error {
	if err == nil {
		return nil
	}
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	var keep []error
	for _, e := range errs {
		if !errors.Is(e, ErrNoCgroup) {
			keep = append(keep, e)
		}
	}
	return errors.Join(keep...)
}
