package loop

import (
	"runtime"
	"slices"
	"testing"
	"time"
)

// The flush tick's timer fires once per reset, a reset replaces the
// deadline it was armed for, a stop keeps it from firing, and once closed
// it never fires again. On Linux it is a timerfd (a Go timer fires through
// the poller's millisecond wait); its lateness is logged, not asserted,
// since a shared machine's scheduler adds its own.
func TestFlushTimer(t *testing.T) {
	fired := make(chan time.Time, 16)
	ft := newFlushTimer(func() { fired <- time.Now() })
	defer ft.close()
	if runtime.GOOS == "linux" && ft.t != nil {
		t.Log("no timerfd here: the Go timer stands in")
	}
	none := func(d time.Duration) {
		t.Helper()
		select {
		case <-fired:
			t.Fatal("the timer fired when it should not have")
		case <-time.After(d):
		}
	}
	one := func() time.Time {
		t.Helper()
		select {
		case at := <-fired:
			return at
		case <-time.After(5 * time.Second):
			t.Fatal("the timer did not fire")
		}
		return time.Time{}
	}

	start := time.Now()
	ft.reset(2 * time.Millisecond)
	if at := one(); at.Sub(start) < 2*time.Millisecond {
		t.Fatalf("fired after %v, armed for 2ms", at.Sub(start))
	}
	none(30 * time.Millisecond)

	// A reset replaces the deadline: one firing, at the later one.
	start = time.Now()
	ft.reset(5 * time.Millisecond)
	ft.reset(40 * time.Millisecond)
	if at := one(); at.Sub(start) < 40*time.Millisecond {
		t.Fatalf("fired after %v: the first deadline was not replaced", at.Sub(start))
	}
	none(30 * time.Millisecond)

	ft.reset(10 * time.Millisecond)
	ft.stop()
	none(50 * time.Millisecond)

	var late []time.Duration
	for i := 0; i < 30; i++ {
		start = time.Now()
		ft.reset(2 * time.Millisecond)
		late = append(late, one().Sub(start)-2*time.Millisecond)
	}
	slices.Sort(late)
	t.Logf("late on a 2 ms arm: median %v, max %v", late[len(late)/2], late[len(late)-1])

	ft.close()
	ft.close()
	ft.reset(time.Millisecond)
	none(30 * time.Millisecond)
}
