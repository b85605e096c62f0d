//go:build !linux

package harness

import "syscall"

// ChildAttr is nil where there is no parent-death signal: a killed test
// run may leave its nodes behind.
func ChildAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{} }

// GroupAttr gives a process that starts others (a shell running a node)
// a process group of its own, which the test kills as a whole.
func GroupAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
