package tuning

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"text/tabwriter"
)

const tuneUsage = `Usage: roost tune [flags]

Reports the cgroup limits, the open-file limit and the kernel settings that
cap a node holding --connections connections, with what to change and why.
With --emit it writes a ready file to stdout instead:

  roost tune --emit sysctl > /etc/sysctl.d/60-roost.conf && sysctl --system
  roost tune --emit systemd --vcpu 0.5 --memory 512MiB > /etc/systemd/system/roost.service

Flags:
`

// TuneMain runs `roost tune` with args (without the "tune" word) and returns
// the exit code: 0 on success, 1 when the output cannot be written, 2 for
// bad flags (with the error and the usage on stderr).
func TuneMain(args []string, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("roost tune", flag.ContinueOnError)
	fl.SetOutput(stderr)
	fl.Usage = func() {
		fmt.Fprint(stderr, tuneUsage)
		fl.PrintDefaults()
	}
	connections := fl.Int("connections", DefaultConnections, "connection target the node must hold")
	emit := fl.String("emit", "", "write a ready file instead of the report: sysctl or systemd")
	vcpu := fl.Float64("vcpu", 0, "CPU cores for the systemd unit's CPUQuota (e.g. 0.5); 0 leaves CPU unconfined")
	memory := fl.String("memory", "", "memory for the systemd unit's MemoryMax (e.g. 512MiB, 1GiB, 300M); empty leaves memory unconfined")
	execPath := fl.String("exec", "/usr/local/bin/roost", "absolute path of the roost binary in the systemd unit")
	execArgs := fl.String("args", "serve", "arguments after --exec in the systemd unit's ExecStart")
	sockBuf := fl.String("socket-buffer", "8KiB", "kernel buffer memory estimated per connection, for net.ipv4.tcp_mem")
	dialer := fl.Bool("dialer", false, "check this host as the side that opens the connections (load balancer, load generator)")
	dests := fl.Int("destinations", 1, "with --dialer: destination ip:port pairs the connections spread over")
	sysctlRoot := fl.String("sysctl-root", "/proc/sys", "directory to read kernel settings from")
	root := fl.String("root", "/", "filesystem root holding /proc/self and the cgroup mounts")

	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "roost tune: "+format+"\n", a...)
		fmt.Fprintf(stderr, "Run `roost tune -h` for the flags.\n")
		return 2
	}
	if err := fl.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2 // flag has printed the error and the usage
	}
	if fl.NArg() > 0 {
		return fail("unexpected argument %q: roost tune takes only flags", fl.Arg(0))
	}
	if *connections < 1 || *connections > 100_000_000 {
		return fail("--connections %d is out of range: give the number of client connections, 1 to 100000000", *connections)
	}
	if *dests < 1 {
		return fail("--destinations %d must be at least 1", *dests)
	}
	sb, err := ParseSize(*sockBuf)
	if err != nil {
		return fail("--socket-buffer: %v", err)
	}
	set := map[string]bool{}
	fl.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *emit != "systemd" {
		for _, name := range []string{"vcpu", "memory", "exec", "args"} {
			if set[name] {
				return fail("--%s only applies to --emit systemd", name)
			}
		}
	}
	var mem int64
	if *memory != "" {
		if mem, err = ParseSize(*memory); err != nil {
			return fail("--memory: %v", err)
		}
	}
	if *vcpu < 0 || *vcpu > 4096 || math.IsNaN(*vcpu) {
		return fail("--vcpu %v is out of range: give cores, e.g. 0.5 or 2", *vcpu)
	}

	soft, _, nfErr := NoFile()
	t := Target{Connections: *connections, SocketBuffer: sb, Dialer: *dialer, Destinations: *dests}
	if nfErr == nil {
		t.NoFile = soft
	}

	switch *emit {
	case "sysctl":
		t.NoFile = 0
		if err := WriteSysctl(stdout, t, Check(*sysctlRoot, t)); err != nil {
			fmt.Fprintf(stderr, "roost tune: %v\n", err)
			return 1
		}
		return 0
	case "systemd":
		o := UnitOptions{Exec: *execPath, Args: *execArgs, VCPU: *vcpu, Memory: mem, Connections: *connections}
		if err := WriteSystemd(stdout, o); err != nil {
			if errors.Is(err, ErrBadUnit) {
				return fail("%v", err)
			}
			fmt.Fprintf(stderr, "roost tune: %v\n", err)
			return 1
		}
		return 0
	case "":
	default:
		return fail("--emit %q: want sysctl or systemd", *emit)
	}

	if err := writeReport(stdout, *root, t, Check(*sysctlRoot, t)); err != nil {
		fmt.Fprintf(stderr, "roost tune: %v\n", err)
		return 1
	}
	return 0
}

// writeReport prints the limits found and the findings as a table.
func writeReport(w io.Writer, root string, t Target, fs []Finding) error {
	t = t.withDefaults()
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "roost tune: limits for %d connections (%d file descriptors)\n\n", t.Connections, t.FDs())

	lim, limErr := ReadLimits(os.DirFS(root))
	procs := runtime.GOMAXPROCS(0)
	if lim.CPU > 0 {
		fmt.Fprintf(tw, "cgroup CPU\t%.2f cores (%s)\tGOMAXPROCS %d at start-up\n", lim.CPU, lim.CPUSource, GoMaxProcs(lim.CPU, runtime.NumCPU()))
	} else {
		fmt.Fprintf(tw, "cgroup CPU\tno quota %s\tGOMAXPROCS %d (runtime default)\n", paren(lim.CPUSource), procs)
	}
	if lim.Memory > 0 {
		fmt.Fprintf(tw, "cgroup memory\t%s (%s)\tGOMEMLIMIT %s at start-up\n", FormatSize(lim.Memory), lim.MemorySource, FormatSize(GoMemLimit(lim.Memory, 0)))
	} else {
		fmt.Fprintf(tw, "cgroup memory\tno limit %s\tGOMEMLIMIT %s\n", paren(lim.MemorySource), memLimitString(debug.SetMemoryLimit(-1)))
	}
	if err := dropNoCgroup(limErr); err != nil {
		fmt.Fprintf(tw, "cgroup error\t%s\t\n", strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	if soft, hard, err := NoFile(); err == nil {
		fmt.Fprintf(tw, "open files\tsoft %d, hard %d\t(roost raises soft to hard at start-up)\n", soft, hard)
	}
	fmt.Fprintf(tw, "\n\tSETTING\tCURRENT\tRECOMMENDED\tWHY\n")
	low := 0
	for _, f := range fs {
		mark := "ok"
		if f.TooLow {
			mark = "LOW"
			low++
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", mark, f.Setting, f.Current, f.Recommended, f.Why)
	}
	if low > 0 {
		fmt.Fprintf(tw, "\n%d settings too low for %d connections: `roost tune --emit sysctl --connections %d` writes a sysctl.d file; LimitNOFILE is in `roost tune --emit systemd`.\n",
			low, t.Connections, t.Connections)
	} else {
		fmt.Fprintf(tw, "\nNothing too low for %d connections.\n", t.Connections)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("cannot write the report: %w", err)
	}
	return nil
}

func paren(s string) string {
	if s == "" {
		return ""
	}
	return "(" + s + ")"
}
