package tuning

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"path"
	"strconv"
	"strings"
)

// ErrBadUnit means UnitOptions cannot make a valid systemd unit.
var ErrBadUnit = errors.New("bad unit options")

// WriteSysctl writes a sysctl.d file setting every kernel setting in fs (as
// returned by Check for t) to its recommended value, each with a comment
// saying why. Values never go below what the checked machine already had.
func WriteSysctl(w io.Writer, t Target, fs []Finding) error {
	t = t.withDefaults()
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "# /etc/sysctl.d/60-roost.conf: kernel settings for a roost node holding %d connections.\n", t.Connections)
	fmt.Fprintf(bw, "# Written by `roost tune --emit sysctl --connections %d`; values never lower what the\n", t.Connections)
	fmt.Fprintf(bw, "# machine it ran on already had. Apply with `sysctl --system`; see docs/tuning.md.\n")
	for _, f := range fs {
		if f.value == "" {
			continue // not a sysctl (RLIMIT_NOFILE goes in the systemd unit)
		}
		fmt.Fprintf(bw, "\n")
		writeComment(bw, f.Setting+": "+f.Why)
		if f.Current == "absent" {
			fmt.Fprintf(bw, "# Not present on this machine; uncomment if conntrack gets loaded (docker, iptables NAT).\n")
			fmt.Fprintf(bw, "# %s = %s\n", f.Setting, f.value)
			continue
		}
		fmt.Fprintf(bw, "%s = %s\n", f.Setting, f.value)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("cannot write the sysctl file: %w", err)
	}
	return nil
}

// writeComment wraps text at about 78 columns as "# " lines.
func writeComment(w io.Writer, text string) {
	line := "#"
	for _, word := range strings.Fields(text) {
		if len(line)+1+len(word) > 78 && line != "#" {
			fmt.Fprintln(w, line)
			line = "#"
		}
		line += " " + word
	}
	fmt.Fprintln(w, line)
}

// UnitOptions describe the systemd unit WriteSystemd writes.
type UnitOptions struct {
	// Exec is the absolute path of the roost binary.
	Exec string
	// Args follow Exec on the ExecStart line, e.g. "serve --listen :8080".
	Args string
	// VCPU is the CPU quota in cores (0.5 is half a core); 0 leaves CPU
	// unconfined.
	VCPU float64
	// Memory is MemoryMax in bytes; 0 leaves memory unconfined.
	Memory int64
	// Connections is the connection target; it sizes LimitNOFILE.
	Connections int
}

// EnvironmentFile is where the unit reads the node's settings and secrets.
const EnvironmentFile = "/etc/roost/roost.env"

// quotaPeriodMS is the CPUQuotaPeriodSec the unit sets: short enough that a
// throttled node stalls for milliseconds, not the default 100 ms period's
// tens of milliseconds.
const quotaPeriodMS = 10

// WriteSystemd writes a systemd service unit that runs roost with
// LimitNOFILE for the connection target and, when given, CPUQuota and
// MemoryMax for the VM size.
func WriteSystemd(w io.Writer, o UnitOptions) error {
	if !path.IsAbs(o.Exec) {
		return fmt.Errorf("cannot use --exec %q: systemd needs an absolute path: %w", o.Exec, ErrBadUnit)
	}
	if strings.ContainsAny(o.Exec+o.Args, "\n\r") {
		return fmt.Errorf("cannot put a line break in ExecStart: %w", ErrBadUnit)
	}
	if o.VCPU < 0 || math.IsNaN(o.VCPU) || math.IsInf(o.VCPU, 0) || o.Memory < 0 {
		return fmt.Errorf("cannot use a negative --vcpu or --memory: %w", ErrBadUnit)
	}
	fds := Target{Connections: o.Connections}.FDs()
	conns := Target{Connections: o.Connections}.withDefaults().Connections

	bw := bufio.NewWriter(w)
	size := []string{fmt.Sprintf("%d connections", conns)}
	if o.VCPU > 0 {
		size = append(size, fmt.Sprintf("%s vCPU", fmtCores(o.VCPU)))
	}
	if o.Memory > 0 {
		size = append(size, FormatSize(o.Memory))
	}
	fmt.Fprintf(bw, "# roost.service: a roost chat node for %s.\n", strings.Join(size, ", "))
	fmt.Fprintf(bw, "# Written by `roost tune --emit systemd`. Install as /etc/systemd/system/roost.service,\n")
	fmt.Fprintf(bw, "# write the node's settings to %s (mode 0600), then\n", EnvironmentFile)
	fmt.Fprintf(bw, "# `systemctl daemon-reload && systemctl enable --now roost`. See docs/tuning.md and README.md.\n")
	fmt.Fprintf(bw, "\n[Unit]\nDescription=roost chat node\nAfter=network-online.target\nWants=network-online.target\n\n")
	fmt.Fprintf(bw, "[Service]\nType=exec\n")
	writeComment(bw, "The listener, the database, Redis and the secrets come from the environment (ROOST_LISTEN, ROOST_DATABASE_URL, ROOST_APP_SECRET...; roost serve -h): never on ExecStart, which every user of the machine can read. systemd reads the file as root, so it can stay 0600.")
	fmt.Fprintf(bw, "EnvironmentFile=%s\n", EnvironmentFile)
	writeComment(bw, "A user of its own, made by systemd (no useradd needed); /var/lib/roost is its writable state directory (an --apps registry file can live there).")
	fmt.Fprintf(bw, "User=roost\nGroup=roost\nDynamicUser=yes\nStateDirectory=roost\n")
	execLine := escapeSpecifiers(o.Exec)
	if a := strings.TrimSpace(o.Args); a != "" {
		execLine += " " + escapeSpecifiers(a)
	}
	fmt.Fprintf(bw, "ExecStart=%s\n", execLine)
	fmt.Fprintf(bw, "# SIGTERM drains: readiness goes false and members are closed with a retry hint.\n")
	fmt.Fprintf(bw, "KillSignal=SIGTERM\nTimeoutStopSec=60\nRestart=on-failure\nRestartSec=2s\n")
	writeComment(bw, "One descriptor per connection plus margin. It must not exceed fs.nr_open, or the unit fails to start.")
	fmt.Fprintf(bw, "LimitNOFILE=%d\n", fds)
	if o.VCPU > 0 {
		procs := GoMaxProcs(o.VCPU, 0)
		stall := quotaPeriodMS * (1 - o.VCPU/float64(procs))
		if stall >= 0.05 {
			writeComment(bw, fmt.Sprintf("%s vCPU; roost reads the quota and runs %s itself (GOMAXPROCS=%d: one more P for Go's netpoller, idle nearly always). The %d ms period bounds a throttling stall to about %.1f ms (the default 100 ms period: %.0f ms).",
				fmtCores(o.VCPU), loopsText(procs), procs+1, quotaPeriodMS, stall, stall*100/quotaPeriodMS))
		} else {
			writeComment(bw, fmt.Sprintf("%s vCPU; roost reads the quota and runs %s itself (GOMAXPROCS=%d: one more P for Go's netpoller, idle nearly always), so Go rarely exceeds the quota; the %d ms period keeps a stall short when it does (the default period is 100 ms).",
				fmtCores(o.VCPU), loopsText(procs), procs+1, quotaPeriodMS))
		}
		fmt.Fprintf(bw, "CPUQuota=%s%%\n", fmtCores(o.VCPU*100))
		fmt.Fprintf(bw, "CPUQuotaPeriodSec=%dms\n", quotaPeriodMS)
	}
	if o.Memory > 0 {
		writeComment(bw, fmt.Sprintf("roost sets its Go memory limit (GOMEMLIMIT) to %s, this minus headroom, itself. Swap would turn memory pressure into seconds of latency: better killed and restarted.",
			FormatSize(GoMemLimit(o.Memory, 0))))
		fmt.Fprintf(bw, "MemoryMax=%s\nMemorySwapMax=0\n", systemdSize(o.Memory))
	}
	fmt.Fprintf(bw, "NoNewPrivileges=yes\nProtectSystem=strict\nProtectHome=yes\nPrivateTmp=yes\n\n")
	fmt.Fprintf(bw, "[Install]\nWantedBy=multi-user.target\n")
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("cannot write the systemd unit: %w", err)
	}
	return nil
}

// escapeSpecifiers doubles % so systemd does not read %n, %h... in ExecStart.
func escapeSpecifiers(s string) string { return strings.ReplaceAll(s, "%", "%%") }

func fmtCores(v float64) string {
	s := fmt.Sprintf("%.2f", v)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s
}

// loopsText is "1 event loop" or "N event loops".
func loopsText(n int) string {
	if n == 1 {
		return "1 event loop"
	}
	return strconv.Itoa(n) + " event loops"
}
