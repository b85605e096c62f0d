//go:build linux

package test

import "syscall"

// childAttr makes a node started by a test die with the test process
// (Linux's parent-death signal), so a killed test run leaves no node behind.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
