package tuning

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Scheduler slices (Linux 6.12 and later, the EEVDF scheduler).
//
// A node pinned to one CPU, or confined to a fraction of one, runs its
// event loop and the goroutines it hands work to (the publish pool's
// commits, the broker, the proxy hooks' workers, Go's own netpoller) on
// threads that take turns on that CPU. When one of them wakes while the
// loop's thread runs, EEVDF lets the running thread finish its slice
// first unless the woken one asked for a shorter slice: 0.7 ms times
// 1 + log2 of the CPUs (1.4 ms on two) by default, which every hand-off
// between the loop and a goroutine may wait. Asking every thread of the
// process for a short slice bounds that wait by the short slice instead
// (docs/benchmarks.md, "Scheduler slices"). Older kernels accept the
// request and ignore it.

// MinSchedSlice and MaxSchedSlice bound a requested slice, as the kernel
// does (0.1 ms to 100 ms).
const (
	MinSchedSlice = 100 * time.Microsecond
	MaxSchedSlice = 100 * time.Millisecond
)

// SetSchedSlice asks the kernel for a slice of d for every thread of the
// process (0: the kernel's default again); threads started later inherit
// it from the thread that starts them. Threads not of SCHED_OTHER (a real-time one an operator set) are
// left alone. It returns how many threads it set.
func SetSchedSlice(d time.Duration) (int, error) {
	if d != 0 && (d < MinSchedSlice || d > MaxSchedSlice) {
		return 0, fmt.Errorf("scheduler slice %v: want %v to %v", d, MinSchedSlice, MaxSchedSlice)
	}
	// Twice: a thread the runtime started during the first walk, from a
	// thread not yet set, is seen by the second.
	set := map[int]bool{}
	for range 2 {
		ents, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return len(set), err
		}
		for _, e := range ents {
			tid, err := strconv.Atoi(e.Name())
			if err != nil || set[tid] {
				continue
			}
			if err := setThreadSlice(tid, d); err != nil {
				if err == unix.ESRCH {
					continue // the thread has gone
				}
				return len(set), fmt.Errorf("thread %d: %w", tid, err)
			}
			set[tid] = true
		}
	}
	return len(set), nil
}

// SetThreadSlice asks the kernel for a slice of d for the calling thread
// only (runtime.LockOSThread first; 0: the kernel's default).
func SetThreadSlice(d time.Duration) error {
	if d != 0 && (d < MinSchedSlice || d > MaxSchedSlice) {
		return fmt.Errorf("scheduler slice %v: want %v to %v", d, MinSchedSlice, MaxSchedSlice)
	}
	return setThreadSlice(0, d)
}

func setThreadSlice(tid int, d time.Duration) error {
	a, err := unix.SchedGetAttr(tid, 0)
	if err != nil {
		return err
	}
	if a.Policy != unix.SCHED_NORMAL && a.Policy != unix.SCHED_BATCH {
		return nil
	}
	a.Size = unix.SizeofSchedAttr
	a.Runtime = uint64(d)
	return unix.SchedSetAttr(tid, a, 0)
}

// ThreadSlice is the slice the kernel shows for thread tid (0: the
// calling thread), from /proc's sched file; ok is false where the kernel
// does not show one.
func ThreadSlice(tid int) (d time.Duration, ok bool) {
	path := "/proc/thread-self/sched"
	if tid != 0 {
		path = "/proc/self/task/" + strconv.Itoa(tid) + "/sched"
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, found := strings.Cut(line, ":"); found && strings.TrimSpace(k) == "se.slice" {
			ns, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return time.Duration(ns), err == nil
		}
	}
	return 0, false
}
