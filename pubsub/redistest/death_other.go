//go:build !linux

package redistest

import "syscall"

// dieWithParent: only Linux has a parent-death signal; elsewhere the
// test's cleanup is what stops the server.
func dieWithParent() *syscall.SysProcAttr { return nil }
