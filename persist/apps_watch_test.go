package persist

// How a registry change reaches a running node, one path at a time: each
// watcher below is given an interval far longer than the test, unless the
// periodic re-read is the path under test, so that what delivers the change
// is the path named and not the safety net.

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/roost-chat/roost/persist/pgtest"
	"github.com/roost-chat/roost/proto"
)

// watched collects what a WatchApps calls back with.
type watched chan []proto.App

func watch(t *testing.T, r Registry, every time.Duration) watched {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ch := make(watched, 256)
	r.WatchApps(ctx, every, func(apps []proto.App) {
		select {
		case ch <- apps:
		default: // a test that stops reading does not block the watcher
		}
	}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	return ch
}

// until waits for a registry that satisfies ok, and fails after within.
func (w watched) until(t *testing.T, within time.Duration, what string, ok func([]proto.App) bool) {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case apps := <-w:
			if ok(apps) {
				return
			}
		case <-deadline:
			t.Fatalf("%s: not seen within %v", what, within)
		}
	}
}

// seenWithin reports whether a registry satisfying ok arrives within d.
func (w watched) seenWithin(d time.Duration, ok func([]proto.App) bool) bool {
	deadline := time.After(d)
	for {
		select {
		case apps := <-w:
			if ok(apps) {
				return true
			}
		case <-deadline:
			return false
		}
	}
}

func has(id string) func([]proto.App) bool {
	return func(apps []proto.App) bool {
		for _, a := range apps {
			if a.ID == id {
				return true
			}
		}
		return false
	}
}

func disabled(id string) func([]proto.App) bool {
	return func(apps []proto.App) bool {
		for _, a := range apps {
			if a.ID == id {
				return a.Disabled
			}
		}
		return false
	}
}

func secretIs(id, secret string) func([]proto.App) bool {
	return func(apps []proto.App) bool {
		for _, a := range apps {
			if a.ID == id {
				return a.Secret == secret
			}
		}
		return false
	}
}

const within = 2 * time.Second // the promise: every node sees a change within 2 s

// PostgreSQL: NOTIFY delivers a change at once; a change whose
// notification never came is delivered by the periodic re-read; a watcher
// whose LISTEN connection died makes a new one, catches up, and hears the
// next change.
func TestPostgresWatchAppsPaths(t *testing.T) {
	url := pgtest.NewDB(t)
	p := openTestPG(t, url, PGConfig{})
	t.Cleanup(p.Close)
	ctx := context.Background()
	notified := watch(t, p, time.Hour)
	polled := watch(t, p, 500*time.Millisecond)
	time.Sleep(300 * time.Millisecond) // both have read once and listen

	if err := p.CreateApp(ctx, proto.App{ID: "a", Secret: "secret-of-a-0123456789"}); err != nil {
		t.Fatal(err)
	}
	notified.until(t, within, "NOTIFY of a new app", has("a"))

	// A change that sends no notification (triggers off for this session,
	// as a restore or a replica's apply would): only the re-read sees it.
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `SET session_replication_role = replica`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `UPDATE apps SET disabled = true WHERE id = 'a'`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `RESET session_replication_role`); err != nil {
		t.Fatal(err)
	}
	conn.Release()
	polled.until(t, within, "periodic re-read of a change without NOTIFY", disabled("a"))
	if notified.seenWithin(500*time.Millisecond, disabled("a")) {
		t.Fatal("the change sent a notification after all: the periodic re-read was not what delivered it")
	}

	// The listener's connection dies (a PostgreSQL restart, an operator's
	// pg_terminate_backend): the watcher reconnects and re-reads, so the
	// change made meanwhile arrives, and so does the next one, by NOTIFY.
	if n := pgtest.Terminate(t, url); n < 2 {
		t.Fatalf("terminated %d backends, want the two listeners and more", n)
	}
	notified.until(t, within, "the re-read after the listener reconnected", disabled("a"))
	deadline := time.Now().Add(within)
	for {
		// The pool's first use after the termination may meet a dead connection.
		err := p.CreateApp(ctx, proto.App{ID: "b", Secret: "secret-of-b-0123456789"})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("create after the termination: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	notified.until(t, within, "NOTIFY on the new listener", has("b"))
}

// The file: a writer's rename (roost app) and an in-place rewrite are seen
// by the file's mtime, size or inode; a change the stamp cannot show (same
// size, the old mtime put back) is seen on Reload, which SIGHUP calls.
func TestAppFileWatchPaths(t *testing.T) {
	path := filepath.Join(t.TempDir(), "apps.json")
	f := OpenAppFile(path)
	w := watch(t, f, time.Hour)
	ctx := context.Background()

	if err := f.CreateApp(ctx, proto.App{ID: "a", Secret: "secret-of-a-0123456789"}); err != nil {
		t.Fatal(err)
	}
	w.until(t, within, "a new app written by rename", has("a"))

	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	edited := []byte(replaceLast(string(b), "}\n  ]\n}\n", `,"disabled":true}]}`+"\n"))
	if err := os.WriteFile(path, edited, 0o600); err != nil { // same inode: only mtime and size change
		t.Fatal(err)
	}
	w.until(t, within, "an in-place edit", disabled("a"))

	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	cur, _ := os.ReadFile(path)
	same := []byte(replaceLast(string(cur), "secret-of-a-0123456789", "secret-of-a-9876543210"))
	if len(same) != len(cur) {
		t.Fatal("BUG: the edit must keep the size")
	}
	if err := os.WriteFile(path, same, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	if w.seenWithin(1200*time.Millisecond, secretIs("a", "secret-of-a-9876543210")) {
		t.Fatal("a change with the stamp unchanged was seen without Reload: this does not test Reload")
	}
	f.Reload()
	w.until(t, within, "Reload", secretIs("a", "secret-of-a-9876543210"))

	// A file that does not parse (an editor's half-saved write) is not
	// handed on: the node keeps the last good registry until it parses.
	if err := os.WriteFile(path, []byte(`{"apps":[{"id":"a",`), 0o600); err != nil {
		t.Fatal(err)
	}
	f.Reload()
	if w.seenWithin(1200*time.Millisecond, func([]proto.App) bool { return true }) {
		t.Fatal("a registry that does not parse was handed on")
	}
	if err := os.WriteFile(path, same, 0o600); err != nil {
		t.Fatal(err)
	}
	w.until(t, within, "the file parsing again", secretIs("a", "secret-of-a-9876543210"))
}

func replaceLast(s, old, new string) string {
	for i := len(s) - len(old); i >= 0; i-- {
		if s[i:i+len(old)] == old {
			return s[:i] + new + s[i+len(old):]
		}
	}
	return s
}

// The backoff after failed registry reads starts at retryAppsRead, grows to
// the interval and stays there however long PostgreSQL is away: a wait
// that doubled past the largest Duration would turn negative and make the
// watcher read (and dial) in a busy loop.
func TestAppsReadWaitBounded(t *testing.T) {
	retry := retryAppsRead
	every := time.Second
	if d := appsReadWait(true, &retry, every); d != retryAppsRead {
		t.Fatalf("first retry after %v, want %v", d, retryAppsRead)
	}
	for i := 0; i < 1000; i++ {
		if d := appsReadWait(true, &retry, every); d <= 0 || d > every {
			t.Fatalf("failed read %d: wait %v, want (0, %v]", i+2, d, every)
		}
	}
	if d := appsReadWait(false, &retry, every); d != every || retry != retryAppsRead {
		t.Fatalf("after a good read: wait %v retry %v", d, retry)
	}
}
