package persist

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/roost-chat/roost/persist/pgtest"
	"github.com/roost-chat/roost/proto"
)

// An app's identity settings and max token TTL survive both registries:
// created, read back, changed, cleared.
func TestRegistryKeepsIdentity(t *testing.T) {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	pemKey := string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
	for _, tc := range []struct {
		name string
		open func(t *testing.T) Registry
	}{
		{"file", func(t *testing.T) Registry { return OpenAppFile(filepath.Join(t.TempDir(), "apps.json")) }},
		{"postgres", func(t *testing.T) Registry {
			p := openTestPG(t, pgtest.NewDB(t), PGConfig{})
			t.Cleanup(p.Close)
			return p
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := tc.open(t)
			ctx := context.Background()
			ttl := proto.Duration(time.Hour)
			a := proto.App{ID: "idp", Secret: "secret-of-idp-0123456789",
				Identity: &proto.Identity{JWKSURL: "https://idp.example/.well-known/jwks.json", Issuer: "https://idp.example/", Audience: "chat", UserClaim: "email"}}
			a.Limits.MaxTokenTTL = &ttl
			if err := reg.CreateApp(ctx, a); err != nil {
				t.Fatal(err)
			}
			read := func() proto.App {
				t.Helper()
				apps, err := reg.Apps(ctx)
				if err != nil || len(apps) != 1 {
					t.Fatalf("apps %v, %v", apps, err)
				}
				return apps[0]
			}
			got := read()
			if !reflect.DeepEqual(got.Identity, a.Identity) || got.Limits.MaxTokenTTL == nil || *got.Limits.MaxTokenTTL != ttl {
				t.Fatalf("read back %+v (limits %+v), want %+v", got.Identity, got.Limits, a.Identity)
			}
			if _, err := reg.UpdateApp(ctx, "idp", func(a *proto.App) error {
				a.Identity = &proto.Identity{PublicKey: pemKey}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if got := read(); got.Identity == nil || got.Identity.PublicKey != pemKey || got.Identity.JWKSURL != "" {
				t.Fatalf("after set: %+v", got.Identity)
			}
			if _, err := reg.UpdateApp(ctx, "idp", func(a *proto.App) error {
				a.Identity = &proto.Identity{PublicKey: "not a key"}
				return nil
			}); err == nil {
				t.Fatal("a public key that does not parse was stored")
			}
			if _, err := reg.UpdateApp(ctx, "idp", func(a *proto.App) error {
				a.Identity = nil
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if got := read(); got.Identity != nil {
				t.Fatalf("identity not cleared: %+v", got.Identity)
			}
		})
	}
}
