//go:build !linux

package harness

import "syscall"

// ChildAttr is nil where there is no parent-death signal: a killed test
// run may leave its nodes behind.
func ChildAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{} }
