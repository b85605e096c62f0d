// Package pgtest gives tests a database of their own on the machine's real
// PostgreSQL: created empty, dropped when the test ends, and benchmarks
// the CPU its backends spent. Tests never mock PostgreSQL.
package pgtest

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// AdminURL is where test databases are created: ROOST_TEST_DATABASE_URL,
// or the machine's PostgreSQL with trust auth.
func AdminURL() string {
	if u := os.Getenv("ROOST_TEST_DATABASE_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// NewDB creates an empty database roost_test_<random> for tb, drops it when
// tb ends, and returns its URL. Without a reachable PostgreSQL the test is
// skipped, or fails when CI=true.
func NewDB(tb testing.TB) string {
	tb.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("PostgreSQL at %s: %v", AdminURL(), err)
		}
		tb.Skipf("PostgreSQL not reachable at %s (set ROOST_TEST_DATABASE_URL): %v", AdminURL(), err)
	}
	var b [6]byte
	_, _ = crand.Read(b[:])
	name := "roost_test_" + hex.EncodeToString(b[:])
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		admin.Close(ctx)
		tb.Fatalf("cannot create database: %v", err)
	}
	admin.Close(ctx)
	tb.Cleanup(func() {
		admin, err := pgx.Connect(ctx, AdminURL())
		if err != nil {
			tb.Errorf("cannot drop database %s: %v", name, err)
			return
		}
		defer admin.Close(ctx)
		if _, err := admin.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			tb.Errorf("cannot drop database %s: %v", name, err)
		}
	})
	return dbURL(tb, name)
}

// dbURL is AdminURL naming database name instead. A URL's path is
// replaced whole: matching "/db?" in the text left a URL with no query
// (ROOST_TEST_DATABASE_URL=postgres://…/test) naming the admin database,
// so every test migrated and filled it instead of its own.
func dbURL(tb testing.TB, name string) string {
	u, err := url.Parse(AdminURL())
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		tb.Fatalf("ROOST_TEST_DATABASE_URL must be a postgres:// URL: %q", AdminURL())
	}
	u.Path, u.RawPath = "/"+name, ""
	return u.String()
}

// Terminate ends every backend connected to the database of url, as a
// PostgreSQL restart or an operator's pg_terminate_backend would, and
// returns how many it ended.
func Terminate(tb testing.TB, url string) int {
	tb.Helper()
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		tb.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		tb.Fatal(err)
	}
	defer admin.Close(ctx)
	var n int
	err = admin.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, cfg.Database).Scan(&n)
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

// BackendPIDs lists the PostgreSQL backends serving url's database,
// besides the one it asks on.
func BackendPIDs(tb testing.TB, url string) []int {
	tb.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close(ctx)
	rows, err := c.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`)
	if err != nil {
		tb.Fatal(err)
	}
	defer rows.Close()
	var pids []int
	for rows.Next() {
		var pid int
		_ = rows.Scan(&pid)
		pids = append(pids, pid)
	}
	return pids
}

// CPU returns the CPU time (user+system) spent so far by the given
// processes, or by every process named postgres when pids is nil.
func CPU(pids []int) time.Duration {
	if pids == nil {
		matches, _ := filepath.Glob("/proc/[0-9]*/stat")
		for _, m := range matches {
			pid, _ := strconv.Atoi(strings.Split(m, "/")[2])
			pids = append(pids, pid)
		}
	}
	var ticks int64
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(b)
		open, close := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || close < 0 || s[open+1:close] != "postgres" {
			continue
		}
		f := strings.Fields(s[close+2:])
		// Fields after the command: state is f[0]; utime and stime are
		// fields 14 and 15 of the whole line, f[11] and f[12] here.
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += ut + st
	}
	return time.Duration(ticks) * 10 * time.Millisecond // USER_HZ is 100 on Linux
}
