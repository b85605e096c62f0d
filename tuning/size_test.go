package tuning

import (
	"errors"
	"testing"
)

func TestParseSize(t *testing.T) {
	f := func(s string, want int64) {
		t.Helper()
		got, err := ParseSize(s)
		if err != nil || got != want {
			t.Fatalf("ParseSize(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	f("512MiB", 512<<20)
	f("1GiB", 1<<30)
	f("300M", 300<<20)
	f("512m", 512<<20)
	f("1.5G", 3<<29)
	f("8KiB", 8<<10)
	f("65536", 65536)
	f("100B", 100)
	f("1GB", 1e9)
	f("300MB", 300e6)
	f(" 2 GiB ", 2<<30)
	f("1T", 1<<40)
}

func TestParseSizeErrors(t *testing.T) {
	for _, s := range []string{"", "lots", "MiB", "12XB", "-5M", "0", "0.1", "1.2.3G", "1e3M", "99999999999T"} {
		if n, err := ParseSize(s); !errors.Is(err, ErrBadSize) {
			t.Fatalf("ParseSize(%q) = %d, %v; want ErrBadSize", s, n, err)
		}
	}
}

func TestFormatSize(t *testing.T) {
	f := func(n int64, want string) {
		t.Helper()
		if got := FormatSize(n); got != want {
			t.Fatalf("FormatSize(%d) = %q, want %q", n, got, want)
		}
	}
	f(512<<20, "512MiB")
	f(1<<30, "1GiB")
	f(1<<30+1<<29, "1.5GiB")
	f(800000<<10, "781.2MiB")
	f(512<<20-(512<<20)/10, "460.8MiB")
	f(100, "100B")
	f(1536, "1.5KiB")
}
