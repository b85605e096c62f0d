package tuning

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ErrBadSize means a size string is not a positive number with a known unit.
var ErrBadSize = errors.New("bad size")

var sizeUnits = map[string]float64{
	"": 1, "b": 1,
	// Single letters are binary, as in systemd (MemoryMax=512M) and docker
	// (--memory 512m), the two places these sizes end up.
	"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
	"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
	"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
}

// ParseSize parses a byte size: a number with an optional unit, case
// insensitive. K, M, G and T and the KiB, MiB, GiB, TiB forms are powers of
// 1024 (as systemd and docker read them); KB, MB, GB and TB are powers of
// 1000. "512MiB", "1GiB", "300M", "1.5G" and "65536" are all sizes.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.') {
		i++
	}
	num, unit := t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	mul, ok := sizeUnits[unit]
	if num == "" || !ok {
		return 0, fmt.Errorf("cannot parse size %q (want e.g. 512MiB, 1GiB, 300M): %w", s, ErrBadSize)
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("cannot parse size %q: %w", s, ErrBadSize)
	}
	n := v * mul
	if n < 1 || n >= math.MaxInt64 {
		return 0, fmt.Errorf("cannot use size %q: out of range: %w", s, ErrBadSize)
	}
	return int64(n), nil
}

// FormatSize writes n bytes in the largest binary unit not above it, as an
// integer when exact ("512MiB", "1GiB"), else with one decimal ("460.8MiB").
func FormatSize(n int64) string {
	units := []struct {
		name string
		size int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}}
	for _, u := range units {
		if n < u.size {
			continue
		}
		if n%u.size == 0 {
			return strconv.FormatInt(n/u.size, 10) + u.name
		}
		return strconv.FormatFloat(float64(n)/float64(u.size), 'f', 1, 64) + u.name
	}
	return strconv.FormatInt(n, 10) + "B"
}

// systemdSize writes n for systemd, which reads K, M, G, T as powers of 1024.
func systemdSize(n int64) string {
	for _, u := range []struct {
		suffix string
		size   int64
	}{{"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}} {
		if n >= u.size && n%u.size == 0 {
			return strconv.FormatInt(n/u.size, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}
