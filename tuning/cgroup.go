package tuning

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"path"
	"strconv"
	"strings"
)

var (
	// ErrNoCgroup means the process's cgroup for a controller could not be
	// found: no /proc/self/cgroup (not Linux, or /proc not mounted) or no
	// cgroup filesystem mounted for that controller. Apply treats it as "no
	// limit", which is what it means for the process.
	ErrNoCgroup = errors.New("no cgroup found for this process")

	// ErrMalformed means a cgroup, mountinfo or sysctl file does not have
	// the format the kernel documents. It is always wrapped with the file's
	// path and contents.
	ErrMalformed = errors.New("malformed file")
)

// v1Unlimited is the smallest value treated as "no limit" in cgroup v1
// memory.limit_in_bytes. The kernel reports no limit as PAGE_COUNTER_MAX
// rounded to a page (9223372036854771712 with 4 KiB pages, a little less with
// 64 KiB pages), never as -1, so any value this large means unlimited.
const v1Unlimited = 1 << 62

// Limits are the cgroup limits that apply to this process. The effective
// limit is the smallest one on the path from the process's cgroup up to the
// top of the mounted hierarchy, as the kernel enforces every ancestor.
type Limits struct {
	// CPU is the quota in cores (quota/period); 0 means no quota.
	CPU float64
	// CPUSource names the file that set CPU, or the cgroup directory
	// searched when there is no quota, prefixed with the cgroup version.
	CPUSource string
	// Memory is the limit in bytes; 0 means no limit.
	Memory int64
	// MemorySource is like CPUSource, for Memory.
	MemorySource string
}

// ReadLimits reads the CPU quota and the memory limit of the process whose
// /proc/self lives in fsys (os.DirFS("/") for this process). A controller
// that cannot be read is reported in the joined error and left at 0 (no
// limit) in the result, so the other one still counts.
func ReadLimits(fsys fs.FS) (Limits, error) {
	var l Limits
	var errCPU, errMem error
	l.CPU, l.CPUSource, errCPU = ReadCPUQuota(fsys)
	l.Memory, l.MemorySource, errMem = ReadMemoryLimit(fsys)
	return l, errors.Join(errCPU, errMem)
}

// ReadCPUQuota returns the CPU quota in cores (0: none) of the process's
// cgroup in fsys, and the file it came from. cgroup v1 (cpu.cfs_quota_us /
// cpu.cfs_period_us) is preferred over v2 (cpu.max) when the cpu controller
// is mounted on v1, which is where a hybrid system keeps it.
func ReadCPUQuota(fsys fs.FS) (cores float64, source string, err error) {
	cg, err := locate(fsys, "cpu")
	if err != nil {
		return 0, "", fmt.Errorf("cannot find the cpu cgroup: %w", err)
	}
	source = cg.describe(cg.leaf)
	read := readCPUv2
	if cg.version == 1 {
		read = readCPUv1
	}
	best := math.Inf(1)
	for _, dir := range cg.levels() {
		q, ok, err := read(fsys, dir)
		if err != nil {
			return 0, source, err
		}
		if ok && q < best {
			best = q
			source = cg.describe(dir)
		}
	}
	if math.IsInf(best, 1) {
		return 0, source, nil
	}
	return best, source, nil
}

// ReadMemoryLimit returns the memory limit in bytes (0: none) of the
// process's cgroup in fsys, and the file it came from: v1
// memory.limit_in_bytes (and hierarchical_memory_limit in memory.stat, which
// sees ancestors hidden from a container) or v2 memory.max.
func ReadMemoryLimit(fsys fs.FS) (bytes int64, source string, err error) {
	cg, err := locate(fsys, "memory")
	if err != nil {
		return 0, "", fmt.Errorf("cannot find the memory cgroup: %w", err)
	}
	source = cg.describe(cg.leaf)
	read := readMemV2
	if cg.version == 1 {
		read = readMemV1
	}
	var best int64
	for i, dir := range cg.levels() {
		n, ok, err := read(fsys, dir, i == 0)
		if err != nil {
			return 0, source, err
		}
		if ok && (best == 0 || n < best) {
			best = n
			source = cg.describe(dir)
		}
	}
	return best, source, nil
}

// cgroupDir is the process's cgroup for one controller: leaf is its
// directory and top the mount point of its hierarchy, both as fs.FS paths.
type cgroupDir struct {
	version   int
	leaf, top string
}

// levels lists leaf and each ancestor up to and including top.
func (c cgroupDir) levels() []string {
	dirs := []string{c.leaf}
	for d := c.leaf; d != c.top && d != "." && d != "/"; {
		d = path.Dir(d)
		dirs = append(dirs, d)
	}
	if dirs[len(dirs)-1] != c.top {
		// leaf is not under top (should not happen): trust only leaf.
		return dirs[:1]
	}
	return dirs
}

func (c cgroupDir) describe(dir string) string {
	return fmt.Sprintf("cgroup v%d /%s", c.version, strings.TrimPrefix(dir, "."))
}

// locate finds the process's cgroup directory for controller, preferring a
// v1 hierarchy that carries it over the v2 unified hierarchy.
func locate(fsys fs.FS, controller string) (cgroupDir, error) {
	cgData, err := fs.ReadFile(fsys, "proc/self/cgroup")
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return cgroupDir{}, fmt.Errorf("cannot read /proc/self/cgroup: %w", ErrNoCgroup)
		}
		return cgroupDir{}, fmt.Errorf("cannot read /proc/self/cgroup: %w", err)
	}
	lines, err := parseProcCgroup(string(cgData))
	if err != nil {
		return cgroupDir{}, err
	}
	miData, err := fs.ReadFile(fsys, "proc/self/mountinfo")
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return cgroupDir{}, fmt.Errorf("cannot read /proc/self/mountinfo: %w", ErrNoCgroup)
		}
		return cgroupDir{}, fmt.Errorf("cannot read /proc/self/mountinfo: %w", err)
	}
	mounts, err := parseMountinfo(string(miData))
	if err != nil {
		return cgroupDir{}, err
	}
	for _, l := range lines {
		if !contains(l.controllers, controller) {
			continue
		}
		for _, m := range mounts {
			if m.fstype == "cgroup" && contains(m.superOpts, controller) {
				return resolve(1, m, l.path), nil
			}
		}
	}
	for _, l := range lines {
		if l.id != "0" || len(l.controllers) != 0 {
			continue
		}
		var first *mountInfo
		for i := range mounts {
			m := &mounts[i]
			if m.fstype != "cgroup2" {
				continue
			}
			if first == nil {
				first = m
			}
			if _, ok := relativeTo(m.root, l.path); ok {
				return resolve(2, *m, l.path), nil
			}
		}
		if first != nil {
			return resolve(2, *first, l.path), nil
		}
	}
	return cgroupDir{}, fmt.Errorf("no %s controller in /proc/self/cgroup and /proc/self/mountinfo: %w", controller, ErrNoCgroup)
}

// resolve maps the cgroup path from /proc/self/cgroup onto the mount.
func resolve(version int, m mountInfo, cgPath string) cgroupDir {
	top := fsPath(m.point)
	rel, ok := relativeTo(m.root, cgPath)
	if !ok {
		// Our cgroup is outside the mount's root (a cgroup namespace seen
		// from outside, or a bind mount of a sub-tree): the mount point is
		// the closest directory we can see.
		rel = ""
	}
	return cgroupDir{version: version, leaf: fsPath(path.Join(m.point, rel)), top: top}
}

// relativeTo returns p relative to root when p is root or below it.
func relativeTo(root, p string) (string, bool) {
	if root == "/" {
		return p, true
	}
	if p == root {
		return "", true
	}
	if strings.HasPrefix(p, root+"/") {
		return p[len(root):], true
	}
	return "", false
}

// fsPath turns an absolute path into an fs.FS path.
func fsPath(p string) string {
	p = strings.TrimPrefix(path.Clean("/"+p), "/")
	if p == "" {
		return "."
	}
	return p
}

type cgroupLine struct {
	id          string
	controllers []string
	path        string
}

// parseProcCgroup parses /proc/self/cgroup: "hierarchy-ID:controllers:path"
// per line; v2 is "0::/path".
func parseProcCgroup(data string) ([]cgroupLine, error) {
	var out []cgroupLine
	for _, line := range strings.Split(data, "\n") {
		if line == "" {
			continue
		}
		id, rest, ok1 := strings.Cut(line, ":")
		ctrls, p, ok2 := strings.Cut(rest, ":")
		if !ok1 || !ok2 || !strings.HasPrefix(p, "/") {
			return nil, fmt.Errorf("cannot parse /proc/self/cgroup line %q: %w", line, ErrMalformed)
		}
		l := cgroupLine{id: id, path: strings.TrimSuffix(p, " (deleted)")}
		if ctrls != "" {
			l.controllers = strings.Split(ctrls, ",")
		}
		out = append(out, l)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("cannot parse empty /proc/self/cgroup: %w", ErrMalformed)
	}
	return out, nil
}

type mountInfo struct {
	root, point, fstype string
	superOpts           []string
}

// parseMountinfo keeps the cgroup mounts of /proc/self/mountinfo:
// "id parent major:minor root mountpoint opts [optional...] - fstype source superopts".
func parseMountinfo(data string) ([]mountInfo, error) {
	var out []mountInfo
	for _, line := range strings.Split(data, "\n") {
		if line == "" {
			continue
		}
		fields := strings.Fields(line)
		sep := -1
		for i := 6; i < len(fields); i++ {
			if fields[i] == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+1 >= len(fields) {
			return nil, fmt.Errorf("cannot parse /proc/self/mountinfo line %q: %w", line, ErrMalformed)
		}
		fstype := fields[sep+1]
		if fstype != "cgroup" && fstype != "cgroup2" {
			continue
		}
		m := mountInfo{root: unescapeMount(fields[3]), point: unescapeMount(fields[4]), fstype: fstype}
		if sep+3 < len(fields) {
			m.superOpts = strings.Split(fields[sep+3], ",")
		}
		out = append(out, m)
	}
	return out, nil
}

// unescapeMount undoes the kernel's octal escapes (\040 for a space) in
// mountinfo paths.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// readOptional reads dir/name; ok is false when the file does not exist,
// which is normal for the root cgroup and for ancestors without a limit.
func readOptional(fsys fs.FS, dir, name string) (string, bool, error) {
	p := path.Join(dir, name)
	b, err := fs.ReadFile(fsys, p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", false, nil
		}
		return "", false, fmt.Errorf("cannot read /%s: %w", p, err)
	}
	return strings.TrimSpace(string(b)), true, nil
}

func malformed(dir, name, data string) error {
	return fmt.Errorf("cannot parse /%s %q: %w", path.Join(dir, name), data, ErrMalformed)
}

// readCPUv2 reads cpu.max: "max 100000" (no quota) or "50000 100000".
func readCPUv2(fsys fs.FS, dir string) (float64, bool, error) {
	data, ok, err := readOptional(fsys, dir, "cpu.max")
	if !ok || err != nil {
		return 0, false, err
	}
	q, p, ok := parseCPUMax(data)
	if !ok {
		return 0, false, malformed(dir, "cpu.max", data)
	}
	if q < 0 {
		return 0, false, nil
	}
	return q / p, true, nil
}

// parseCPUMax returns quota -1 for "max".
func parseCPUMax(data string) (quota, period float64, ok bool) {
	f := strings.Fields(data)
	if len(f) == 0 || len(f) > 2 {
		return 0, 0, false
	}
	period = 100000 // the kernel default, for a bare "max" or quota
	if len(f) == 2 {
		n, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil || n == 0 {
			return 0, 0, false
		}
		period = float64(n)
	}
	if f[0] == "max" {
		return -1, period, true
	}
	n, err := strconv.ParseUint(f[0], 10, 64)
	if err != nil || n == 0 {
		return 0, 0, false
	}
	return float64(n), period, true
}

// readCPUv1 reads cpu.cfs_quota_us (-1: no quota) and cpu.cfs_period_us.
func readCPUv1(fsys fs.FS, dir string) (float64, bool, error) {
	qs, ok, err := readOptional(fsys, dir, "cpu.cfs_quota_us")
	if !ok || err != nil {
		return 0, false, err
	}
	q, err := strconv.ParseInt(qs, 10, 64)
	if err != nil || q == 0 || q < -1 {
		return 0, false, malformed(dir, "cpu.cfs_quota_us", qs)
	}
	if q == -1 {
		return 0, false, nil
	}
	ps, ok, err := readOptional(fsys, dir, "cpu.cfs_period_us")
	if err != nil {
		return 0, false, err
	}
	if !ok {
		return 0, false, malformed(dir, "cpu.cfs_period_us", "(missing next to cpu.cfs_quota_us)")
	}
	p, err := strconv.ParseUint(ps, 10, 64)
	if err != nil || p == 0 {
		return 0, false, malformed(dir, "cpu.cfs_period_us", ps)
	}
	return float64(q) / float64(p), true, nil
}

// readMemV2 reads memory.max: "max" or bytes.
func readMemV2(fsys fs.FS, dir string, _ bool) (int64, bool, error) {
	data, ok, err := readOptional(fsys, dir, "memory.max")
	if !ok || err != nil {
		return 0, false, err
	}
	if data == "max" {
		return 0, false, nil
	}
	n, err := strconv.ParseInt(data, 10, 64)
	if err != nil || n < 0 {
		return 0, false, malformed(dir, "memory.max", data)
	}
	return n, true, nil
}

// readMemV1 reads memory.limit_in_bytes and, at the leaf, the
// hierarchical_memory_limit of memory.stat, which includes ancestors a
// container cannot see.
func readMemV1(fsys fs.FS, dir string, leaf bool) (int64, bool, error) {
	var best int64
	data, ok, err := readOptional(fsys, dir, "memory.limit_in_bytes")
	if err != nil {
		return 0, false, err
	}
	if ok {
		n, ok, err := parseV1Bytes(data)
		if err != nil {
			return 0, false, malformed(dir, "memory.limit_in_bytes", data)
		}
		if ok {
			best = n
		}
	}
	if leaf {
		stat, ok, err := readOptional(fsys, dir, "memory.stat")
		if err != nil {
			return 0, false, err
		}
		if ok {
			for _, line := range strings.Split(stat, "\n") {
				v, found := strings.CutPrefix(line, "hierarchical_memory_limit ")
				if !found {
					continue
				}
				n, ok, err := parseV1Bytes(strings.TrimSpace(v))
				if err != nil {
					return 0, false, malformed(dir, "memory.stat", line)
				}
				if ok && (best == 0 || n < best) {
					best = n
				}
			}
		}
	}
	return best, best > 0, nil
}

func parseV1Bytes(s string) (int64, bool, error) {
	if s == "-1" {
		return 0, false, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, false, err
	}
	if n >= v1Unlimited {
		return 0, false, nil
	}
	return int64(n), n > 0, nil
}
