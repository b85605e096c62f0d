package main

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"regexp"
	"strings"
	"testing"
)

// anyAddr is a loopback listener that says it listens on every address,
// as --admin 0.0.0.0:PORT would, without opening the node to the network.
type anyAddr struct{ net.Listener }

func (anyAddr) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4zero, Port: 6060} }

// An admin listener reachable from other hosts without --admin-token is
// logged as a warning; with a token, or on loopback, it is not.
func TestAdminExposedWarning(t *testing.T) {
	for _, tc := range []struct {
		name   string
		any    bool
		token  string
		warned bool
	}{
		{"0.0.0.0 without a token", true, "", true},
		{"0.0.0.0 with a token", true, "t0ken", false},
		{"loopback", false, "", false},
	} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		var l net.Listener = ln
		if tc.any {
			l = anyAddr{ln}
		}
		var buf bytes.Buffer
		srv, _ := newAdminServer(l, &admin{token: tc.token}, slog.New(slog.NewTextHandler(&buf, nil)))
		_ = srv.Close()
		ln.Close()
		if got := strings.Contains(buf.String(), "level=WARN") && strings.Contains(buf.String(), "--admin-token"); got != tc.warned {
			t.Errorf("%s: warned %v, want %v: %s", tc.name, got, tc.warned, buf.String())
		}
	}
}

// The admin token comes from ROOST_ADMIN_TOKEN like any setting, and
// --print-config and pprof's command line never show it.
func TestAdminTokenSetting(t *testing.T) {
	var c config
	errs := parse([]string{"--insecure"}, &c, io.Discard,
		func(k string) (string, bool) { return "s3cret-admin", k == "ROOST_ADMIN_TOKEN" },
		func(string) ([]byte, error) { return nil, nil })
	if len(errs) > 0 || c.adminToken != "s3cret-admin" {
		t.Fatalf("admin token %q, errors %v", c.adminToken, errs)
	}
	var out bytes.Buffer
	if err := printConfig(&out, &c); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "s3cret-admin") || !regexp.MustCompile(`(?m)^admin-token\s+\*\*\*\*\*\s+env ROOST_ADMIN_TOKEN$`).MatchString(out.String()) {
		t.Fatalf("print-config does not mask the admin token:\n%s", out.String())
	}
	if got := strings.Join(redactArgs([]string{"roost", "--admin-token", "s3cret-admin", "--admin-token=s3cret-admin"}), " "); strings.Contains(got, "s3cret-admin") {
		t.Fatalf("pprof's cmdline shows the admin token: %s", got)
	}
	for _, args := range [][]string{{"--api-max-conns", "1"}, {"--api-app-max-conns", "200"}, {"--api-app-inflight", "0"}} {
		if _, errs := parseArgs(t, args...); len(errs) != 1 || !strings.Contains(errs[0].Error(), args[0]) {
			t.Errorf("%v: %v, want one error naming the flag", args, errs)
		}
	}
}
