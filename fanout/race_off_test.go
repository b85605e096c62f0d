//go:build !race

package fanout

// raceOn: see race_on_test.go.
const raceOn = false
