package main

import (
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/persist/pgtest"
	"github.com/roost-chat/roost/proto"
)

// The retention settings parse into a policy; bad entries name the flag.
func TestRetentionConfig(t *testing.T) {
	var c config
	errs := parse([]string{"--insecure", "--retention-max-age", "48h", "--retention-max-count", "500",
		"--app-retention", "chat=720h/0, audit=0/100000"}, &c, io.Discard, func(string) (string, bool) { return "", false }, nil)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	want := persist.RetentionPolicy{
		Default: persist.Retention{MaxAge: 48 * time.Hour, MaxCount: 500},
		Apps:    map[string]persist.Retention{"chat": {MaxAge: 720 * time.Hour}, "audit": {MaxCount: 100000}},
	}
	if fmt.Sprint(c.retention) != fmt.Sprint(want) {
		t.Fatalf("policy %+v, want %+v", c.retention, want)
	}
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"--app-retention", "chat=720h"}, `invalid --app-retention entry "chat=720h": want APP=MAXAGE/MAXCOUNT`},
		{[]string{"--app-retention", "chat=1ms/0"}, `max age "1ms"`},
		{[]string{"--app-retention", "chat=0/-1"}, `max count "-1"`},
		{[]string{"--app-retention", "a b=0/1"}, `APP matching`},
		{[]string{"--app-retention", "x=0/1,x=0/2"}, `app "x" given twice`},
		{[]string{"--retention-max-age", "10ms"}, `invalid --retention-max-age 10ms`},
		{[]string{"--retention-max-count", "-3"}, `invalid --retention-max-count -3`},
	} {
		var c config
		errs := parse(append([]string{"--insecure"}, bad.args...), &c, io.Discard, func(string) (string, bool) { return "", false }, nil)
		if len(errs) != 1 || !strings.Contains(errs[0].Error(), bad.want) {
			t.Errorf("%v: errors %v, want one containing %q", bad.args, errs, bad.want)
		}
	}
}

// --keep is the memory store's retention, and what it pushes out shows in
// roost_retention_deleted_total.
func TestRetentionMetrics(t *testing.T) {
	addr, admin := inProcessNode(t, "--keep", "5")
	c := dialOps(t, addr, "user=u&app=ret")
	for i := 1; i <= 8; i++ {
		if err := c.send(fmt.Sprintf(`{"op":"pub","room":"r","id":"m%d","body":%d}`, i, i)); err != nil {
			t.Fatal(err)
		}
		c.expect("ack")
	}
	m := scrape(t, admin)
	if m[`roost_retention_deleted_total{rule="count"}`] != 3 || m[`roost_retention_deleted_total{rule="age"}`] != 0 {
		t.Fatalf("retention metrics: count %v, age %v", m[`roost_retention_deleted_total{rule="count"}`], m[`roost_retention_deleted_total{rule="age"}`])
	}
}

// An app's retention in a registry file (roost app create/set --keep-count)
// reaches a running node's store: the memory store trims the app's rooms
// when it changes, and a PostgreSQL store's retention uses the file's
// values rather than the apps table's (which only a registry in
// PostgreSQL writes).
func TestRegistryFileRetention(t *testing.T) {
	counted := func(t *testing.T, admin string, want float64) {
		t.Helper()
		deadline := time.Now().Add(4 * time.Second)
		for {
			got := scrape(t, admin)[`roost_retention_deleted_total{rule="count"}`]
			if got == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("deleted by count %v, want %v", got, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	publish := func(t *testing.T, addr, secret string, n int) {
		t.Helper()
		token, err := proto.SignToken([]byte(secret), "kept", "u", time.Now().Add(time.Hour), nil)
		if err != nil {
			t.Fatal(err)
		}
		c := dialOps(t, addr, "token="+token)
		for i := 1; i <= n; i++ {
			if err := c.send(fmt.Sprintf(`{"op":"pub","room":"r","id":"m%d","body":%d}`, i, i)); err != nil {
				t.Fatal(err)
			}
			c.expect("ack")
		}
	}
	create := func(t *testing.T, f string) string {
		var created struct{ Secret string }
		if err := json.Unmarshal([]byte(mustRoost(t, "app", "create", "kept", "--keep-count", "4", "--apps", f)), &created); err != nil {
			t.Fatal(err)
		}
		return created.Secret
	}
	t.Run("memory", func(t *testing.T) {
		f := filepath.Join(t.TempDir(), "apps.json")
		secret := create(t, f)
		addr, admin, _ := inProcessServe(t, "--apps", f)
		publish(t, addr, secret, 6)
		counted(t, admin, 2) // 4 kept of 6
		mustRoost(t, "app", "set", "kept", "--keep-count", "1", "--apps", f)
		counted(t, admin, 5) // the change trims the room to its newest
	})
	t.Run("postgres", func(t *testing.T) {
		url := pgtest.NewDB(t)
		f := filepath.Join(t.TempDir(), "apps.json")
		secret := create(t, f)
		addr, admin, _ := inProcessServe(t, "--apps", f, "--database-url", url, "--migrate", "--retention-interval", "1s")
		publish(t, addr, secret, 6)
		counted(t, admin, 2)
	})
}
