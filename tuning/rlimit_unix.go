//go:build unix

package tuning

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// RaiseNoFile raises the soft RLIMIT_NOFILE to the hard limit and returns the
// resulting soft and hard limits.
//
// Go's syscall package already raises the soft limit to hard-1 at start-up
// (go.dev/issue/46279); this takes the last descriptor too and, more
// usefully, reports the limits so the node can log them and Check can
// compare them with the connection target. The hard limit is the operator's
// (LimitNOFILE= in systemd, --ulimit nofile= in docker): a process cannot
// raise it without CAP_SYS_RESOURCE, so this never tries.
func RaiseNoFile() (soft, hard uint64, err error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, 0, fmt.Errorf("cannot read RLIMIT_NOFILE: %w", err)
	}
	want := uint64(lim.Max)
	if want == ^uint64(0) { // RLIM_INFINITY
		// The kernel refuses a NOFILE limit above fs.nr_open, and an
		// unlimited hard limit only means "whatever nr_open allows".
		n, err := readNrOpen()
		if err != nil {
			return uint64(lim.Cur), uint64(lim.Max), err
		}
		want = n
	}
	if uint64(lim.Cur) >= want {
		return uint64(lim.Cur), uint64(lim.Max), nil
	}
	next := lim
	next.Cur = want
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &next); err != nil {
		return uint64(lim.Cur), uint64(lim.Max), fmt.Errorf("cannot raise RLIMIT_NOFILE from %d to %d: %w", lim.Cur, want, err)
	}
	return uint64(next.Cur), uint64(next.Max), nil
}

// NoFile returns the current soft and hard RLIMIT_NOFILE without changing them.
func NoFile() (soft, hard uint64, err error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, 0, fmt.Errorf("cannot read RLIMIT_NOFILE: %w", err)
	}
	return uint64(lim.Cur), uint64(lim.Max), nil
}

func readNrOpen() (uint64, error) {
	b, err := os.ReadFile("/proc/sys/fs/nr_open")
	if err != nil {
		return 0, fmt.Errorf("cannot read fs.nr_open: %w", err)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("cannot parse fs.nr_open %q: %w", b, ErrMalformed)
	}
	return n, nil
}
