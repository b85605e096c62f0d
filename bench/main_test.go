//go:build linux

package bench

import (
	"os"
	"testing"

	"github.com/roost-chat/roost/test/harness"
)

func TestMain(m *testing.M) {
	// --procs re-executes the running binary as a worker: in tests that is
	// this test binary, invoked as `<bin> bench __worker ...`.
	if os.Getenv(WorkerEnv) == "1" && len(os.Args) > 2 && os.Args[1] == "bench" {
		os.Exit(Main(os.Args[2:], os.Stdout, os.Stderr))
	}
	code := m.Run()
	harness.Cleanup()
	os.Exit(code)
}
