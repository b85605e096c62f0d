package tuning

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

const (
	// DefaultConnections is the connection target when none is configured.
	DefaultConnections = 100000
	// DefaultSocketBuffer estimates the kernel memory a mostly idle chat
	// connection holds at a time: a page of receive queue and a page of
	// unsent frames. Busy rooms hold more; measure with `ss -tm`.
	DefaultSocketBuffer = 8 << 10

	minBacklog = 4096
	maxBacklog = 65535 // listen(2) backlogs were 16-bit before Linux 4.1
	widePortLo = 10240 // keeps well-known and registered service ports out
	widePortHi = 65535
	minSockBuf = 4096
	minSockMax = 256 << 10
)

// Target is what the node is configured to hold; Check scales its
// recommendations with it.
type Target struct {
	// Connections is the number of concurrent client connections.
	Connections int
	// SocketBuffer is the kernel memory estimated per connection in bytes
	// (0: DefaultSocketBuffer); it sizes net.ipv4.tcp_mem.
	SocketBuffer int64
	// NoFile is the process's soft open-file limit; 0 skips that check.
	NoFile uint64
	// Dialer marks a host that opens the connections (a load balancer,
	// proxy or load generator) instead of accepting them: its ephemeral
	// port range then caps it.
	Dialer bool
	// Destinations is how many destination ip:port pairs a Dialer spreads
	// its connections over (0: 1). Each pair has its own ports.
	Destinations int
	// PageSize is the unit of net.ipv4.tcp_mem (0: os.Getpagesize()).
	PageSize int
}

func (t Target) withDefaults() Target {
	if t.Connections <= 0 {
		t.Connections = DefaultConnections
	}
	if t.SocketBuffer <= 0 {
		t.SocketBuffer = DefaultSocketBuffer
	}
	if t.Destinations <= 0 {
		t.Destinations = 1
	}
	if t.PageSize <= 0 {
		t.PageSize = os.Getpagesize()
	}
	return t
}

// FDs is the number of file descriptors a node with this target needs:
// one per connection plus a margin for listeners, the store and broker
// pools, and sockets still closing during a reconnect wave.
func (t Target) FDs() uint64 {
	t = t.withDefaults()
	n := uint64(t.Connections) + uint64(t.Connections)/10 + 1024
	return (n + 1023) &^ 1023
}

// Finding is one setting compared with what the target needs.
type Finding struct {
	Setting     string // sysctl name, or RLIMIT_NOFILE
	Current     string // as read; "unknown" or "absent" when it could not be
	Recommended string // "-" when not applicable
	Why         string
	TooLow      bool

	// value is what a sysctl.d file should set (never below the current
	// value); "" when the setting does not belong in one.
	value string
}

// Check reads the kernel settings that cap a chat node from root (a
// /proc/sys directory) and compares them with what target needs. It
// returns one finding per setting, in a fixed order; a setting that cannot
// be read is reported, not fatal.
func Check(root string, target Target) []Finding {
	t := target.withDefaults()
	c := uint64(t.Connections)
	fds := t.FDs()
	backlog := clamp(pow2ceil(c/16), minBacklog, maxBacklog)
	var out []Finding

	out = append(out, minRule(root, "fs.file-max", fds, max(2*fds, 1<<20),
		fmt.Sprintf("system-wide open files; the node alone needs %d (one per connection plus margin), every other process shares the rest", fds)))
	out = append(out, minRule(root, "fs.nr_open", fds, max(fds, 1<<20),
		fmt.Sprintf("caps any process's RLIMIT_NOFILE (LimitNOFILE=); must be at least the %d descriptors the node needs", fds)))
	out = append(out, minRule(root, "net.core.somaxconn", backlog, backlog,
		"caps the accept queue; after a node drains, its clients reconnect to the others at once and the kernel drops what does not fit"))
	out = append(out, minRule(root, "net.ipv4.tcp_max_syn_backlog", backlog, backlog,
		"half-open connections waiting for the handshake during a reconnect storm; beyond it SYNs are dropped or answered with cookies"))
	out = append(out, portRule(root, t))
	out = append(out, tcpMemRule(root, t))
	out = append(out, bufRule(root, "net.ipv4.tcp_rmem", [3]uint64{minSockBuf, 131072, 6291456}))
	out = append(out, bufRule(root, "net.ipv4.tcp_wmem", [3]uint64{minSockBuf, 16384, 4194304}))
	out = append(out, conntrackRule(root, 2*c))
	if t.NoFile > 0 {
		out = append(out, noFileFinding(t.NoFile, fds))
	}
	return out
}

// LogFindings logs one warning naming the settings that are too low for
// the target, and nothing when none is: the node's start says there is
// something to fix, `roost tune` says what and why.
func LogFindings(log *slog.Logger, fs []Finding) {
	if log == nil {
		return
	}
	var low []string
	for _, f := range fs {
		if f.TooLow {
			low = append(low, f.Setting)
		}
	}
	if len(low) == 0 {
		return
	}
	log.LogAttrs(context.Background(), slog.LevelWarn, "kernel settings too low for --conn-target connections: run `roost tune` for what to set and why (docs/tuning.md)",
		slog.String("settings", strings.Join(low, ",")))
}

// readSysctl reads a dotted sysctl name under root as unsigned fields.
func readSysctl(root, name string) ([]uint64, string, error) {
	p := filepath.Join(root, filepath.FromSlash(strings.ReplaceAll(name, ".", "/")))
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, "", fmt.Errorf("cannot read %s: %w", p, err)
	}
	raw := strings.Join(strings.Fields(string(b)), " ")
	var vals []uint64
	for _, f := range strings.Fields(raw) {
		n, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return nil, raw, fmt.Errorf("cannot parse %s %q: %w", p, raw, ErrMalformed)
		}
		vals = append(vals, n)
	}
	if len(vals) == 0 {
		return nil, raw, fmt.Errorf("cannot parse empty %s: %w", p, ErrMalformed)
	}
	return vals, raw, nil
}

// unreadable is the finding for a setting Check could not read: it cannot
// be called too low, but its recommendation still stands.
func unreadable(name, rec, why string, err error) Finding {
	cur := "unknown"
	if errors.Is(err, ErrMalformed) {
		cur = "malformed"
	}
	return Finding{Setting: name, Current: cur, Recommended: rec, Why: why + " (" + err.Error() + ")", value: rec}
}

func minRule(root, name string, need, rec uint64, why string) Finding {
	vals, raw, err := readSysctl(root, name)
	if err == nil && len(vals) != 1 {
		err = fmt.Errorf("cannot parse %s %q: want one number: %w", name, raw, ErrMalformed)
	}
	if err != nil {
		return unreadable(name, u(rec), why, err)
	}
	cur := vals[0]
	r := max(cur, rec)
	return Finding{Setting: name, Current: u(cur), Recommended: u(r), Why: why, TooLow: cur < need, value: u(r)}
}

func portRule(root string, t Target) Finding {
	const name = "net.ipv4.ip_local_port_range"
	perDest := (uint64(t.Connections) + uint64(t.Destinations) - 1) / uint64(t.Destinations)
	wideWidth := uint64(widePortHi - widePortLo + 1)
	wide := fmt.Sprintf("%d %d", widePortLo, widePortHi)
	why := "ephemeral ports for outgoing connections: one per connection per destination ip:port"
	vals, raw, err := readSysctl(root, name)
	if err == nil && (len(vals) != 2 || vals[0] > vals[1]) {
		err = fmt.Errorf("cannot parse %s %q: want two ascending ports: %w", name, raw, ErrMalformed)
	}
	if err != nil {
		return unreadable(name, wide, why, err)
	}
	width := vals[1] - vals[0] + 1
	f := Finding{Setting: name, Current: raw}
	if !t.Dialer {
		// A node only dials its store and broker; the range caps whoever
		// dials the node, which is the load balancer.
		f.Recommended, f.value = raw, raw
		if width < wideWidth {
			f.value = wide
		}
		f.Why = fmt.Sprintf("%d ports; caps outgoing connections only, so not a node's limit, but on a load balancer each destination ip:port gets at most %d connections: widen it there to %s", width, width, wide)
		return f
	}
	f.Recommended, f.value = wide, wide
	if width >= wideWidth {
		f.Recommended, f.value = raw, raw
	}
	f.Why = fmt.Sprintf("%s; %d ports for %d connections per destination", why, width, perDest)
	f.TooLow = width < perDest
	if perDest > wideWidth {
		f.Why += fmt.Sprintf("; even %s holds only %d: add source IPs or destination ports/nodes", wide, wideWidth)
	}
	return f
}

func tcpMemRule(root string, t Target) Finding {
	const name = "net.ipv4.tcp_mem"
	need := (uint64(t.Connections)*uint64(t.SocketBuffer) + uint64(t.PageSize) - 1) / uint64(t.PageSize)
	rec := [3]uint64{need / 2, need, need + need/2}
	why := fmt.Sprintf("min pressure max, in %d-byte pages, for all TCP sockets: %d connections × %s ≈ %d pages (%s) must fit below pressure, where the kernel starts shrinking buffers; the VM needs that memory besides roost's own",
		t.PageSize, t.Connections, FormatSize(t.SocketBuffer), need, FormatSize(int64(need)*int64(t.PageSize)))
	vals, raw, err := readSysctl(root, name)
	if err == nil && len(vals) != 3 {
		err = fmt.Errorf("cannot parse %s %q: want three numbers: %w", name, raw, ErrMalformed)
	}
	if err != nil {
		return unreadable(name, triple(rec), why, err)
	}
	r := [3]uint64{max(vals[0], rec[0]), max(vals[1], rec[1]), max(vals[2], rec[2])}
	return Finding{Setting: name, Current: raw, Recommended: triple(r), Why: why, TooLow: vals[1] < need, value: triple(r)}
}

func bufRule(root, name string, rec [3]uint64) Finding {
	why := "per-socket min default max bytes, charged per byte queued, so the defaults suit many idle connections; " +
		"min ≥ 4096 keeps sockets moving under tcp_mem pressure, max ≥ 256KiB lets a fan-out burst queue in the kernel"
	vals, raw, err := readSysctl(root, name)
	if err == nil && len(vals) != 3 {
		err = fmt.Errorf("cannot parse %s %q: want three numbers: %w", name, raw, ErrMalformed)
	}
	if err != nil {
		return unreadable(name, triple(rec), why, err)
	}
	r := [3]uint64{max(vals[0], rec[0]), vals[1], max(vals[2], rec[2])}
	if vals[1] < r[0] {
		r[1] = rec[1]
	}
	low := vals[0] < minSockBuf || vals[2] < minSockMax
	return Finding{Setting: name, Current: raw, Recommended: triple(r), Why: why, TooLow: low, value: triple(r)}
}

func conntrackRule(root string, need uint64) Finding {
	const name = "net.netfilter.nf_conntrack_max"
	why := "every tracked connection takes an entry; when the table is full the kernel drops new connections (\"nf_conntrack: table full\")"
	vals, raw, err := readSysctl(root, name)
	if errors.Is(err, fs.ErrNotExist) {
		// value still carries the number, for a commented line in the
		// sysctl file in case conntrack is loaded later (docker, NAT).
		return Finding{Setting: name, Current: "absent", Recommended: "-", Why: "conntrack is not loaded: not applicable", value: u(need)}
	}
	if err == nil && len(vals) != 1 {
		err = fmt.Errorf("cannot parse %s %q: want one number: %w", name, raw, ErrMalformed)
	}
	if err != nil {
		return unreadable(name, u(need), why, err)
	}
	r := max(vals[0], need)
	why += fmt.Sprintf("; %d leaves room for connections closing while clients reconnect", need)
	return Finding{Setting: name, Current: u(vals[0]), Recommended: u(r), Why: why, TooLow: vals[0] < need, value: u(r)}
}

func noFileFinding(cur, need uint64) Finding {
	c := u(cur)
	if cur == ^uint64(0) {
		c = "unlimited"
	}
	return Finding{
		Setting: "RLIMIT_NOFILE", Current: c, Recommended: u(max(cur, need)),
		Why:    "this process's open-file limit: each connection is a descriptor; raise the hard limit with LimitNOFILE= (systemd) or --ulimit nofile= (docker), at most fs.nr_open",
		TooLow: cur < need,
	}
}

func u(n uint64) string { return strconv.FormatUint(n, 10) }

func triple(v [3]uint64) string { return fmt.Sprintf("%d %d %d", v[0], v[1], v[2]) }

func clamp(n, lo, hi uint64) uint64 { return min(max(n, lo), hi) }

func pow2ceil(n uint64) uint64 {
	p := uint64(1)
	for p < n {
		p <<= 1
	}
	return p
}
