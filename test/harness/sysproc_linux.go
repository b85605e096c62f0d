//go:build linux

package harness

import "syscall"

// ChildAttr makes a process a test starts die with the test process
// (Linux's parent-death signal), so a killed test run leaves no node behind.
func ChildAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
