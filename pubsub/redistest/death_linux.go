//go:build linux

package redistest

import "syscall"

// dieWithParent: the server dies with the test binary even if cleanup
// never runs.
func dieWithParent() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
