//go:build linux

package harness

import "syscall"

// ChildAttr makes a process a test starts die with the test process
// (Linux's parent-death signal), so a killed test run leaves no node behind.
func ChildAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// GroupAttr is ChildAttr for a process that starts others (a shell
// running a node): it gets a process group of its own, which the test
// kills as a whole.
func GroupAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
