//go:build linux

package loop

import (
	"errors"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// flushTimer is the loop's flush tick. A Go timer fires through the
// runtime's poller, whose wait is in whole milliseconds: the tick came
// 0.5–0.7 ms late on a 2 ms period, a quarter of a period that exists to
// bound latency. A timerfd is read through the same poller but wakes it
// at the nanosecond it expires. One goroutine per loop reads it and
// pushes the tick; arming it is a timerfd_settime(2) from the loop, at
// most once per tick. Where no timerfd can be had, a Go timer does.
type flushTimer struct {
	t    *time.Timer
	fd   int
	f    *os.File
	fire func()
	done bool // closed
}

func newFlushTimer(fire func()) *flushTimer {
	ft := &flushTimer{fd: -1, fire: fire}
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		ft.t = time.AfterFunc(time.Hour, fire)
		ft.t.Stop()
		return ft
	}
	ft.fd = fd
	// A non-blocking descriptor: os.NewFile registers it with the
	// runtime's poller, so the read below parks its goroutine, not a
	// thread.
	ft.f = os.NewFile(uintptr(fd), "flush-tick")
	go ft.run(ft.f)
	return ft
}

func (ft *flushTimer) run(f *os.File) {
	var buf [8]byte // the expiry count, which a tick does not need
	for {
		if _, err := f.Read(buf[:]); err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			continue // EINTR and the like: the timer is still there
		}
		ft.fire()
	}
}

// reset arms the timer to fire once, d from now; an expiry not read yet
// is cleared with it (settime resets the count), so a reset replaces the
// tick it was armed for, as a Go timer's Reset after Stop does.
func (ft *flushTimer) reset(d time.Duration) {
	if ft.done {
		return
	}
	if ft.t != nil {
		ft.t.Reset(d)
		return
	}
	d = max(d, 1) // a zero value disarms
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(d))}
	_ = unix.TimerfdSettime(ft.fd, 0, &spec, nil)
}

// stop disarms it; a tick already read and pushed still comes.
func (ft *flushTimer) stop() {
	if ft.t != nil {
		ft.t.Stop()
		return
	}
	if !ft.done {
		_ = unix.TimerfdSettime(ft.fd, 0, &unix.ItimerSpec{}, nil)
	}
}

// close stops it for good and ends its goroutine.
func (ft *flushTimer) close() {
	if ft.done {
		return
	}
	ft.stop()
	ft.done = true
	if ft.t != nil {
		return
	}
	// The descriptor's number may be reused once closed: the timer
	// forgets it first.
	ft.fd = -1
	_ = ft.f.Close()
}
