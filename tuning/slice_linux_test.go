package tuning

import (
	"runtime"
	"sync"
	"testing"
	"time"
)

// TestSetSchedSlice: every thread of the process gets the slice, and so
// do threads started after it (they inherit it); a slice out of the
// kernel's bounds is refused before any thread is touched.
func TestSetSchedSlice(t *testing.T) {
	if _, ok := ThreadSlice(0); !ok {
		t.Skip("this kernel does not show a thread's slice")
	}
	if _, err := SetSchedSlice(time.Microsecond); err == nil {
		t.Fatal("a 1µs slice was accepted")
	}
	const want = 300 * time.Microsecond
	n, err := SetSchedSlice(want)
	if err != nil {
		t.Fatal(err)
	}
	if n < 1 {
		t.Fatalf("%d threads set", n)
	}
	t.Cleanup(func() {
		if _, err := SetSchedSlice(0); err != nil {
			t.Errorf("back to the kernel's slice: %v", err)
		}
	})
	// Threads the runtime starts now: locked goroutines each hold one.
	var wg sync.WaitGroup
	got := make([]time.Duration, 8)
	release := make(chan struct{})
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			got[i], _ = ThreadSlice(0)
			<-release
		}()
	}
	time.Sleep(50 * time.Millisecond)
	close(release)
	wg.Wait()
	for i, d := range got {
		if d != want {
			t.Fatalf("thread %d started after the call shows slice %v, want %v", i, d, want)
		}
	}
}
