package loop

import (
	"crypto/ed25519"
	"crypto/x509"
	"encoding/pem"
	"testing"

	"github.com/golang-jwt/jwt/v5"

	"github.com/roost-chat/roost/fanout/tenancy"
	"github.com/roost-chat/roost/proto"
)

// fuzzKey is a fixed Ed25519 key, so the committed corpus holds tokens
// that verify (Ed25519 signatures are deterministic).
var fuzzKey = ed25519.NewKeyFromSeed([]byte("roost-fuzz-token-key-0123456789!"))

// fuzzSecret signs the corpus's HS256 tokens for app "s".
const fuzzSecret = "secret-of-fuzz-app-0123456789"

// fuzzServer is the part of a Server that verify reads: app "s" checks
// tokens with its secret, app "k" with fuzzKey's public half and the user
// claim "email"; no max token TTL, so the corpus's tokens stay good.
func fuzzServer(t testing.TB) *Server {
	der, err := x509.MarshalPKIXPublicKey(fuzzKey.Public())
	if err != nil {
		t.Fatal(err)
	}
	cfg := Defaults()
	cfg.Limits.MaxTokenTTL = 0
	s := &Server{cfg: cfg, jwt: newTokenParser(cfg.Leeway), apps: newApps(&cfg, nil)}
	s.apps.set(tenancy.NewSnapshot(cfg.Limits, cfg.Apps, []proto.App{
		{ID: "s", Secret: fuzzSecret},
		{ID: "k", Secret: fuzzSecret, Identity: &proto.Identity{PublicKey: string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})), UserClaim: "email"}},
	}))
	return s
}

// FuzzVerifyToken: whatever the token and the app named in the URL,
// verify answers without panicking, refuses with a 401 (or 403) and a
// reason, and what it accepts names a known app and a valid user, and was
// signed by that app's own key: never HS256 for the key app, never `none`.
// The seed corpus is in testdata/fuzz/FuzzVerifyToken: good tokens of
// both apps (exp in 2100), HS512, `none`, HS256 for the key app, an app
// claim that differs from the URL's.
func FuzzVerifyToken(f *testing.F) {
	s := fuzzServer(f)
	f.Fuzz(func(t *testing.T, tok, appID string, agree bool) {
		if !proto.ValidAppID([]byte(appID)) {
			appID = ""
		}
		v, he := s.verify([]byte(tok), appID, agree)
		if he != nil {
			if he.Status != 401 && he.Status != 403 || he.Reason == "" {
				t.Fatalf("refusal %d %q", he.Status, he.Reason)
			}
			return
		}
		if v.app == nil || !proto.ValidUser([]byte(v.sub)) || v.rooms == nil {
			t.Fatalf("accepted without app or user: %+v", v)
		}
		alg, _ := mustHeader(tok)["alg"].(string)
		switch v.app.id {
		case "s":
			if alg != "HS256" || v.rooms.signer == nil {
				t.Fatalf("app s accepted alg %q", alg)
			}
		case "k":
			if alg != "EdDSA" || v.rooms.signer != nil {
				t.Fatalf("app k accepted alg %q", alg)
			}
		default:
			t.Fatalf("accepted for app %q", v.app.id)
		}
	})
}

func mustHeader(tok string) map[string]any {
	t, _, err := jwt.NewParser().ParseUnverified(tok, jwt.MapClaims{})
	if err != nil {
		return nil
	}
	return t.Header
}
