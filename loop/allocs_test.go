package loop

import "testing"

// leastAllocs is testing.AllocsPerRun(runs, f) at its lowest over a few
// rounds. AllocsPerRun counts the whole process, and goroutines a test
// cannot hold still (timers, the presence ticker, the inbox's waker, what
// earlier tests left running) allocate now and then: a path that allocates
// does so in every round, that noise does not, so the lowest count is the
// path's own. A clean first round is the answer at once.
func leastAllocs(runs int, f func()) float64 {
	n := testing.AllocsPerRun(runs, f)
	for i := 1; i < 5 && n > 0; i++ {
		n = min(n, testing.AllocsPerRun(runs, f))
	}
	return n
}
