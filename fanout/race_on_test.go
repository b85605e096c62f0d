//go:build race

package fanout

// raceOn: under the race detector the publish path allocates where the
// same code built without it does not (TestPublishPoolAllocations counts
// 374 per 512 publishes under -race, 6 without: per commit, not per
// publish), so an allocation count under it says nothing of roost's.
const raceOn = true
