package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// roost app set takes the identity settings and the max token TTL, keeps
// them across other changes, clears them with none/default, refuses bad
// values before touching the registry, and lists every flag in its -h.
func TestAppSetIdentity(t *testing.T) {
	reg := []string{"--apps", filepath.Join(t.TempDir(), "apps.json")}
	with := func(args ...string) []string { return append(args, reg...) }
	mustRoost(t, with("app", "create", "idp")...)
	set := func(args ...string) appView {
		t.Helper()
		var v appView
		if err := json.Unmarshal([]byte(mustRoost(t, with(append([]string{"app", "set", "idp"}, args...)...)...)), &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	v := set("--jwks-url", "https://idp.example/jwks.json", "--issuer", "https://idp.example/", "--audience", "chat", "--user-claim", "email", "--max-token-ttl", "24h")
	if id := v.Identity; id == nil || id.JWKSURL != "https://idp.example/jwks.json" || id.Issuer != "https://idp.example/" || id.Audience != "chat" || id.UserClaim != "email" ||
		v.Limits.MaxTokenTTL == nil || time.Duration(*v.Limits.MaxTokenTTL) != 24*time.Hour {
		t.Fatalf("after set: %+v %+v", v.Identity, v.Limits)
	}
	// A key file replaces the URL; other changes keep it.
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKIXPublicKey(key.Public())
	pemFile := filepath.Join(t.TempDir(), "idp.pem")
	os.WriteFile(pemFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o644)
	set("--public-key", pemFile)
	v = set("--pub-rate", "5")
	if id := v.Identity; id == nil || id.JWKSURL != "" || !strings.Contains(id.PublicKey, "BEGIN PUBLIC KEY") || id.Issuer != "https://idp.example/" {
		t.Fatalf("after --public-key: %+v", v.Identity)
	}
	v = set("--public-key", "none", "--issuer", "none", "--audience", "none", "--user-claim", "default", "--max-token-ttl", "default")
	if v.Identity != nil || v.Limits.MaxTokenTTL != nil {
		t.Fatalf("after clearing: %+v %+v", v.Identity, v.Limits)
	}
	bad := filepath.Join(t.TempDir(), "bad.pem")
	os.WriteFile(bad, []byte("not a key"), 0o644)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--max-token-ttl", "forever"}, "invalid --max-token-ttl"},
		{[]string{"--public-key", bad}, "invalid --public-key"},
		{[]string{"--public-key", filepath.Join(t.TempDir(), "missing.pem")}, "cannot read --public-key"},
		{[]string{"--jwks-url", "ftp://idp.example/"}, "jwks url"},
		{[]string{"--jwks-url", "https://idp.example/", "--public-key", pemFile}, "not both"},
	} {
		if code, _, errs := roost(t, with(append([]string{"app", "set", "idp"}, tc.args...)...)...); code == 0 || !strings.Contains(errs, tc.want) {
			t.Errorf("set %v: exit %d %q, want %q", tc.args, code, errs, tc.want)
		}
	}

	// roost token says when its token would be refused for its lifetime.
	mustRoost(t, with("app", "set", "idp", "--max-token-ttl", "2h")...)
	if code, out, errs := roost(t, with("token", "--app", "idp", "--user", "u", "--ttl", "3h")...); code != 0 || out == "" || !strings.Contains(errs, "beyond the app's --max-token-ttl (2h0m0s)") {
		t.Errorf("token beyond the app's max ttl: exit %d, stderr %q", code, errs)
	}
	if _, _, errs := roost(t, with("token", "--app", "idp", "--user", "u", "--ttl", "1h")...); strings.Contains(errs, "warning") {
		t.Errorf("token within the max ttl warned: %q", errs)
	}

	// -h: every flag of set, in the flag list and in the usage's summary.
	_, _, help := roost(t, "app", "set", "-h")
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	var lf limitFlags
	lf.bind(fs)
	summary := help[:strings.Index(help, "Flags of roost app set")]
	fs.VisitAll(func(f *flag.Flag) {
		if !strings.Contains(help, "-"+f.Name+" ") && !strings.Contains(help, "-"+f.Name+"\n") {
			t.Errorf("roost app set -h lacks -%s", f.Name)
		}
		if !strings.Contains(summary, "--"+f.Name+" ") {
			t.Errorf("roost app's usage does not list --%s under set", f.Name)
		}
	})
}
