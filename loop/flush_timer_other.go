//go:build !linux

package loop

import "time"

// flushTimer is a Go timer where there is no timerfd (flush_timer_linux.go).
type flushTimer struct {
	t      *time.Timer
	closed bool
}

func newFlushTimer(fire func()) *flushTimer {
	ft := &flushTimer{t: time.AfterFunc(time.Hour, fire)}
	ft.t.Stop()
	return ft
}

func (ft *flushTimer) reset(d time.Duration) {
	if !ft.closed {
		ft.t.Reset(d)
	}
}
func (ft *flushTimer) stop()  { ft.t.Stop() }
func (ft *flushTimer) close() { ft.closed = true; ft.t.Stop() }
