//go:build linux

package bench

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// The receive loop makes one recvmsg(2) per node write per socket: ~75,000 a
// second in the 300-member room at 1,000 msg/s. Through the syscall package each
// also ran the scheduler's entersyscall/exitsyscall, and sysmon, seeing a
// P in syscalls all the time, woke every 20 µs to retake it: 9% of the
// bench's CPU at that load was sysmon alone. The sockets are non-blocking,
// so these calls never block and can go straight to the kernel, as gnet's
// own poller does; only an epoll_wait that may sleep goes through the
// scheduler.

func rawWrite(fd int, p []byte) (int, error) {
	r, _, e := unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// epollWait polls without sleeping first, straight to the kernel; only when
// nothing is ready does it block, through the scheduler so the P is handed
// to other goroutines meanwhile.
func epollWait(epfd int, events []unix.EpollEvent, msec int) (int, error) {
	r, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), 0, 0, 0)
	if e == 0 && r > 0 {
		return int(r), nil
	}
	return unix.EpollWait(epfd, events, msec)
}

// rx reads with recvmsg(2) on sockets opened with SO_TIMESTAMPNS, so each
// read also says when the kernel queued the newest bytes it returns: the
// receipt time of a frame no longer depends on when the bench got round to
// reading its socket. That lets a loop wake once per tick for every socket
// that became ready, rather than once per socket (see loop.run), without
// adding its own delay to the latencies it reports.
type rx struct {
	iov unix.Iovec
	msg unix.Msghdr
	ctl [64]byte
}

// recv reads into p. ts is the kernel's receive time of the last segment
// read (Unix ns), 0 when the read carried none.
func (x *rx) recv(fd int, p []byte) (n int, ts int64, err error) {
	x.iov.Base = unsafe.SliceData(p)
	x.iov.SetLen(len(p))
	x.msg.Iov = &x.iov
	x.msg.Iovlen = 1
	x.msg.Control = &x.ctl[0]
	x.msg.SetControllen(len(x.ctl))
	r, _, e := unix.RawSyscall(unix.SYS_RECVMSG, uintptr(fd), uintptr(unsafe.Pointer(&x.msg)), 0)
	if e != 0 {
		return 0, 0, e
	}
	return int(r), x.stamp(), nil
}

func (x *rx) stamp() int64 {
	const hdr = unix.SizeofCmsghdr
	ctl := x.ctl[:min(int(x.msg.Controllen), len(x.ctl))]
	for len(ctl) >= hdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&ctl[0]))
		l := int(h.Len)
		if l < hdr || l > len(ctl) {
			return 0
		}
		if h.Level == unix.SOL_SOCKET && h.Type == unix.SCM_TIMESTAMPNS && l >= hdr+int(unsafe.Sizeof(unix.Timespec{})) {
			ts := (*unix.Timespec)(unsafe.Pointer(&ctl[hdr]))
			return ts.Nano()
		}
		a := (l + 7) &^ 7 // cmsg alignment on 64-bit
		if a >= len(ctl) {
			return 0
		}
		ctl = ctl[a:]
	}
	return 0
}

// nanosleep sleeps without telling the scheduler: the loop's thread keeps
// its P for a sleep of at most a tick, which costs less than a hand-off.
func nanosleep(ns int64) {
	ts := unix.NsecToTimespec(ns)
	_, _, _ = unix.RawSyscall(unix.SYS_NANOSLEEP, uintptr(unsafe.Pointer(&ts)), 0, 0)
}
