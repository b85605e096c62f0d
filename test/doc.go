// Package test holds roost's black-box tests, as nats-server keeps its
// own: they build the roost binary (once per test process, through
// test/harness), run and kill real `roost serve` processes, and talk to
// them only over the network, so they need nothing of package main. The
// root package keeps its in-process tests, those that call main's
// unexported functions.
package test
