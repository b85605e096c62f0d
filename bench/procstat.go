//go:build linux

package bench

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// clockTick is USER_HZ, the unit of /proc/PID/stat times: 100 on every
// Linux architecture Go supports (sysconf(_SC_CLK_TCK) is fixed by the ABI).
const clockTick = 10 * time.Millisecond

// procCPU returns utime+stime of a process: all its threads, which is why
// /proc/PID/schedstat (main thread only) is not used.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("cannot read CPU of pid %d: %w", pid, err)
	}
	return parseStatCPU(b)
}

func parseStatCPU(b []byte) (time.Duration, error) {
	// comm may hold spaces and parentheses: fields start after the last ')'
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("cannot parse /proc stat: no comm")
	}
	f := bytes.Fields(b[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15
	if len(f) < 13 {
		return 0, fmt.Errorf("cannot parse /proc stat: %d fields", len(f))
	}
	ut, err1 := strconv.ParseUint(string(f[11]), 10, 64)
	st, err2 := strconv.ParseUint(string(f[12]), 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("cannot parse /proc stat times")
	}
	return time.Duration(ut+st) * clockTick, nil
}

func statComm(b []byte) string {
	i := bytes.IndexByte(b, '(')
	j := bytes.LastIndexByte(b, ')')
	if i < 0 || j < i {
		return ""
	}
	return string(b[i+1 : j])
}

// procRSS returns VmRSS of a process in bytes.
func procRSS(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, fmt.Errorf("cannot read RSS of pid %d: %w", pid, err)
	}
	return parseVmRSS(b)
}

func parseVmRSS(b []byte) (int64, error) {
	for _, line := range bytes.Split(b, []byte("\n")) {
		if !bytes.HasPrefix(line, []byte("VmRSS:")) {
			continue
		}
		f := bytes.Fields(line[len("VmRSS:"):])
		if len(f) < 1 {
			break
		}
		kb, err := strconv.ParseInt(string(f[0]), 10, 64)
		if err != nil {
			break
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("cannot find VmRSS")
}

// commCPU sums utime+stime of every process whose comm is name (PostgreSQL
// runs one process per connection plus its background workers). Processes
// that come and go during a window make this a lower bound. With keep, only
// the processes whose command line keep accepts.
func commCPU(name string, keep func(cmdline []byte) bool) (time.Duration, int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, 0, fmt.Errorf("cannot list /proc: %w", err)
	}
	var total time.Duration
	n := 0
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil || statComm(b) != name {
			continue
		}
		if keep != nil {
			cl, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
			if err != nil || !keep(cl) {
				continue
			}
		}
		if d, err := parseStatCPU(b); err == nil {
			total += d
			n++
		}
	}
	return total, n, nil
}

// pgProcessOf keeps the PostgreSQL processes a load on database db costs:
// the server's own (checkpointer, WAL writer, background writer: they write
// what the load committed) and the backends connected to db, leaving out the
// backends of other databases, which on a shared server are other people's
// work. A backend's title is "postgres: [CLUSTER: ]USER DB HOST(PORT) STATE"
// (or [local] for a Unix socket); a server process's has no address.
func pgProcessOf(db string) func(cmdline []byte) bool {
	return func(cl []byte) bool {
		title := strings.TrimRight(strings.ReplaceAll(string(cl), "\x00", " "), " ")
		rest, ok := strings.CutPrefix(title, "postgres: ")
		if !ok {
			return true // the postmaster
		}
		w := strings.Fields(rest)
		if len(w) > 0 && strings.HasSuffix(w[0], ":") {
			w = w[1:] // cluster_name
		}
		if len(w) < 3 || !(strings.Contains(w[2], "(") || w[2] == "[local]") {
			return true
		}
		return w[1] == db
	}
}

// selfCPU is this process's user+system CPU time so far.
func selfCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// sampler reads the CPU of the nodes and PostgreSQL at window edges.
type sampler struct {
	pids []procRef
	pg   bool
	pgDB string // with pg: only this database's backends (pgProcessOf)
}

type cpuSample struct {
	node  time.Duration   // all nodes together
	nodes []time.Duration // each node, in --pid order
	pid   []int           // the PID each was read from
	rss   []int64         // each node's RSS at the sample
	pg    time.Duration
	err   error
}

func (s sampler) sample() cpuSample {
	var c cpuSample
	for _, r := range s.pids {
		pid := r.resolve()
		var d time.Duration
		var rss int64
		if pid > 0 {
			var err error
			if d, err = procCPU(pid); err == nil {
				rss, err = procRSS(pid)
			}
			if err != nil {
				if r.file == "" {
					c.err = err
					return c
				}
				// a PID file's process may be between a kill and its
				// restart: none now
				pid, d, rss = 0, 0, 0
			}
		}
		c.node += d
		c.nodes = append(c.nodes, d)
		c.pid = append(c.pid, pid)
		c.rss = append(c.rss, rss)
	}
	if s.pg {
		var keep func([]byte) bool
		if s.pgDB != "" {
			keep = pgProcessOf(s.pgDB)
		}
		c.pg, _, c.err = commCPU("postgres", keep)
	}
	return c
}

// cpuDelta is the CPU a process spent between two samples; when its PID
// changed (a restart), the new process's whole CPU.
func cpuDelta(a, b cpuSample, i int) time.Duration {
	if a.pid[i] != b.pid[i] {
		return b.nodes[i]
	}
	return b.nodes[i] - a.nodes[i]
}

// procSample is every watched process at one step of a --series.
type procSample struct {
	pid    []int
	rss    []int64
	cpuPct []float64 // over the step before
}

// sampleSeries samples every step from start until stop is closed.
func sampleSeries(s sampler, start time.Time, step time.Duration, stop chan struct{}) []procSample {
	var out []procSample
	prev := s.sample()
	for k := 1; ; k++ {
		select {
		case <-stop:
			return out
		case <-time.After(time.Until(start.Add(time.Duration(k) * step))):
		}
		cur := s.sample()
		ps := procSample{pid: cur.pid, rss: cur.rss}
		for i := range cur.nodes {
			if i < len(prev.nodes) {
				ps.cpuPct = append(ps.cpuPct, 100*cpuDelta(prev, cur, i).Seconds()/step.Seconds())
			}
		}
		out = append(out, ps)
		prev = cur
	}
}
