package main

import (
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/roost-chat/roost/persist"
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
