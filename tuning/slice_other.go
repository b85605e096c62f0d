//go:build !linux

package tuning

import (
	"errors"
	"fmt"
	"time"
)

// MinSchedSlice and MaxSchedSlice bound a requested slice (Linux only).
const (
	MinSchedSlice = 100 * time.Microsecond
	MaxSchedSlice = 100 * time.Millisecond
)

// SetSchedSlice reports errors.ErrUnsupported: scheduler slices are Linux's.
func SetSchedSlice(time.Duration) (int, error) {
	return 0, fmt.Errorf("scheduler slices: %w", errors.ErrUnsupported)
}

// SetThreadSlice reports errors.ErrUnsupported: scheduler slices are Linux's.
func SetThreadSlice(time.Duration) error {
	return fmt.Errorf("scheduler slices: %w", errors.ErrUnsupported)
}

// ThreadSlice reports no slice: scheduler slices are Linux's.
func ThreadSlice(int) (time.Duration, bool) { return 0, false }
