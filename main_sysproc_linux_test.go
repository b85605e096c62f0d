//go:build linux

package main

import "syscall"

// demoAttr starts the demo's node in its own process group (the test kills
// the group) and, on Linux, has it die with the test process.
func demoAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
