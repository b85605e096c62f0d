//go:build !unix

package tuning

import (
	"errors"
	"fmt"
)

// RaiseNoFile reports errors.ErrUnsupported: there is no RLIMIT_NOFILE here.
func RaiseNoFile() (soft, hard uint64, err error) {
	return 0, 0, fmt.Errorf("cannot raise RLIMIT_NOFILE: %w", errors.ErrUnsupported)
}

// NoFile reports errors.ErrUnsupported: there is no RLIMIT_NOFILE here.
func NoFile() (soft, hard uint64, err error) {
	return 0, 0, fmt.Errorf("cannot read RLIMIT_NOFILE: %w", errors.ErrUnsupported)
}
