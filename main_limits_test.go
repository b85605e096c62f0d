package main

import (
	"io"
	"log/slog"
	"strings"
	"testing"
)

func parseArgs(t *testing.T, args ...string) (config, []error) {
	t.Helper()
	var c config
	errs := parse(append([]string{"--insecure"}, args...), &c, io.Discard,
		func(string) (string, bool) { return "", false },
		func(string) ([]byte, error) { return nil, nil })
	return c, errs
}

func TestLimitFlags(t *testing.T) {
	for _, tc := range []struct {
		arg  string
		want int64
		err  string
	}{
		{"512MiB", 512 << 20, ""},
		{"0", 0, ""},
		{"2GiB", 2 << 30, ""},
		{"100k", 0, "want 0 (no budget) or at least 1MiB"},
		{"lots", 0, "invalid --memory-store-max"},
	} {
		c, errs := parseArgs(t, "--memory-store-max", tc.arg)
		switch {
		case tc.err == "" && len(errs) > 0:
			t.Errorf("--memory-store-max %s: %v", tc.arg, errs)
		case tc.err != "" && (len(errs) != 1 || !strings.Contains(errs[0].Error(), tc.err)):
			t.Errorf("--memory-store-max %s: %v, want one error with %q", tc.arg, errs, tc.err)
		case tc.err == "" && c.memStoreMaxN != tc.want:
			t.Errorf("--memory-store-max %s = %d, want %d", tc.arg, c.memStoreMaxN, tc.want)
		}
	}
	for _, args := range [][]string{{"--max-conns", "-1"}, {"--max-conns-per-ip", "-1"}, {"--max-rooms-per-app", "-1"}} {
		if _, errs := parseArgs(t, args...); len(errs) != 1 || !strings.Contains(errs[0].Error(), args[0]) {
			t.Errorf("%v: %v, want one error naming the flag", args, errs)
		}
	}
}

// The connection budget leaves the reserve free of the open-file limit,
// and the reserve grows with what the configuration opens.
func TestConnectionBudgetFromNoFile(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, errs := parseArgs(t, "--loops", "2", "--database-url", "postgres://x@127.0.0.1/db", "--publish-workers", "4",
		"--redis-url", "redis://127.0.0.1:6379,127.0.0.1:6380")
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	// 64 fixed, 3 per loop, 8 PostgreSQL (workers + 4), 16 per Redis seed,
	// 32 admin, 2 x 256 server API (held by apps, and waiting for their
	// first answer).
	want := 64 + 2*3 + 8 + 2*16 + 32 + 512
	if r := descriptorReserve(&c); r != want {
		t.Fatalf("reserve %d, want %d", r, want)
	}
	c.api = "off"
	if r := descriptorReserve(&c); r != want-512 {
		t.Fatalf("reserve with --api off %d, want %d", r, want-512)
	}
	c.api = "127.0.0.1:8090"
	if err := connBudget(&c, 1500, nil, log); err != nil || c.node.MaxConns != 1500-want {
		t.Fatalf("budget %d (%v), want %d", c.node.MaxConns, err, 1500-want)
	}
	c.node.MaxConns = 0
	if err := connBudget(&c, uint64(want), nil, log); err == nil || !strings.Contains(err.Error(), "raise it") {
		t.Fatalf("a limit no larger than the reserve: %v, want an error", err)
	}
	c.node.MaxConns = 5000 // above the safe budget: kept, with a warning
	if err := connBudget(&c, 1500, nil, log); err != nil || c.node.MaxConns != 5000 {
		t.Fatalf("explicit budget %d (%v), want 5000 kept", c.node.MaxConns, err)
	}
}
