package fanout

import "testing"

// leastAllocs is testing.AllocsPerRun(runs, f), the lowest of a few rounds:
// AllocsPerRun counts every goroutine of the process (presence tickers and
// timers of the tests before), which allocate now and then, while a path
// that allocates does so in every round.
func leastAllocs(runs int, f func()) float64 {
	n := testing.AllocsPerRun(runs, f)
	for i := 1; i < 5 && n > 0; i++ {
		n = min(n, testing.AllocsPerRun(runs, f))
	}
	return n
}
