package loop

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/golang-jwt/jwt/v5"

	"github.com/roost-chat/roost/proto"
)

// idpKey is one key of the test's identity provider.
type idpKey struct {
	kid    string
	method jwt.SigningMethod
	priv   crypto.Signer
}

func newIdpKey(t testing.TB, kid, alg string) idpKey {
	t.Helper()
	var priv crypto.Signer
	var err error
	var m jwt.SigningMethod
	switch alg {
	case "RS256":
		priv, err = rsa.GenerateKey(rand.Reader, 2048)
		m = jwt.SigningMethodRS256
	case "ES256":
		priv, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		m = jwt.SigningMethodES256
	case "EdDSA":
		_, priv, err = ed25519.GenerateKey(rand.Reader)
		m = jwt.SigningMethodEdDSA
	}
	if err != nil {
		t.Fatal(err)
	}
	return idpKey{kid: kid, method: m, priv: priv}
}

// jwk is the key's public half as a JWK, with alg unless noAlg.
func (k idpKey) jwk(noAlg bool) map[string]any {
	b64 := func(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }
	j := map[string]any{"kid": k.kid, "use": "sig"}
	if !noAlg {
		j["alg"] = k.method.Alg()
	}
	switch p := k.priv.Public().(type) {
	case *rsa.PublicKey:
		j["kty"], j["n"], j["e"] = "RSA", b64(p.N.Bytes()), b64(big.NewInt(int64(p.E)).Bytes())
	case *ecdsa.PublicKey:
		pt, err := p.Bytes() // 0x04 || X || Y, 32 bytes each
		if err != nil {
			panic(err)
		}
		j["kty"], j["crv"], j["x"], j["y"] = "EC", "P-256", b64(pt[1:33]), b64(pt[33:])
	case ed25519.PublicKey:
		j["kty"], j["crv"], j["x"] = "OKP", "Ed25519", b64(p)
	}
	return j
}

func (k idpKey) pem(t testing.TB) string {
	der, err := x509.MarshalPKIXPublicKey(k.priv.Public())
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
}

// sign makes a provider's token: no app claim unless claims has one.
func (k idpKey) sign(t testing.TB, claims jwt.MapClaims) string {
	t.Helper()
	tk := jwt.NewWithClaims(k.method, claims)
	if k.kid != "" {
		tk.Header["kid"] = k.kid
	}
	s, err := tk.SignedString(k.priv)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// jwksServer is the test's identity provider: a real HTTP server whose
// key set the test changes, counting its fetches.
type jwksServer struct {
	*httptest.Server
	mu      sync.Mutex
	keys    []map[string]any
	fetches int
}

func newJWKSServer(t testing.TB, keys ...map[string]any) *jwksServer {
	s := &jwksServer{keys: keys}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		s.mu.Lock()
		b, _ := json.Marshal(map[string]any{"keys": s.keys})
		s.fetches++
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Write(b)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *jwksServer) set(keys ...map[string]any) {
	s.mu.Lock()
	s.keys = keys
	s.mu.Unlock()
}

func claims(sub string, extra ...any) jwt.MapClaims {
	c := jwt.MapClaims{"sub": sub, "exp": time.Now().Add(time.Hour).Unix()}
	for i := 0; i+1 < len(extra); i += 2 {
		c[extra[i].(string)] = extra[i+1]
	}
	return c
}

// accepted dials /ws?query and reports the refusal's body, or "".
func accepted(t *testing.T, n *node, query string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var body string
	d := ws.Dialer{OnStatusError: func(status int, reason []byte, resp io.Reader) {
		b, _ := io.ReadAll(io.LimitReader(resp, 4096))
		body = string(b)
	}}
	conn, _, _, err := d.Dial(ctx, "ws://"+n.addr+"/ws?"+query)
	if err == nil {
		conn.Close()
		return ""
	}
	return err.Error() + ": " + body
}

// waitAccepted retries until query is accepted (a JWKS fetched in the
// background) or 5 s pass.
func waitAccepted(t *testing.T, n *node, query string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		why := accepted(t, n, query)
		if why == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still refused after 5 s: %s", why)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Tokens of an identity provider whose keys the app reads from a JWKS:
// RS256, ES256 and EdDSA each; the app named by app= in the URL (or by an
// agreeing app claim); the user by sub or the app's user claim; iss and
// aud as the app expects; and every bad case refused with 401 and why.
func TestJWKSTokens(t *testing.T) {
	rs, es, ed := newIdpKey(t, "rs-1", "RS256"), newIdpKey(t, "es-1", "ES256"), newIdpKey(t, "ed-1", "EdDSA")
	idp := newJWKSServer(t, rs.jwk(false), es.jwk(false), ed.jwk(true))
	n := secureNode(t, nil, proto.App{ID: "chat", Secret: secretA, Identity: &proto.Identity{
		JWKSURL: idp.URL, Issuer: "https://idp.example/", Audience: "roost"}})
	good := func(sub string, extra ...any) jwt.MapClaims {
		return claims(sub, append([]any{"iss", "https://idp.example/", "aud", "roost"}, extra...)...)
	}
	waitAccepted(t, n, "app=chat&token="+rs.sign(t, good("alice")))
	for _, k := range []idpKey{rs, es, ed} {
		t.Run(k.method.Alg(), func(t *testing.T) {
			c := n.dialQuery(t, "app=chat&token="+k.sign(t, good("alice")))
			c.send(`{"op":"pub","room":"r","id":"1","body":1}`)
			c.expect(map[string]any{"op": "ack"})
			// An app claim that agrees with app= is fine; alone it names the app.
			if why := accepted(t, n, "app=chat&token="+k.sign(t, good("alice", "app", "chat"))); why != "" {
				t.Fatalf("agreeing app claim refused: %s", why)
			}
			if why := accepted(t, n, "token="+k.sign(t, good("alice", "app", "chat"))); why != "" {
				t.Fatalf("app claim alone refused: %s", why)
			}
		})
	}
	// Over SSE too, and a refresh (op auth) with a provider's token.
	if s := n.sse(t, "room=r&app=chat&token="+es.sign(t, good("bob"))); s.status != 200 {
		t.Fatalf("sse: %d %s", s.status, s.header.Get("X-Body"))
	}
	c := n.dialQuery(t, "app=chat&token="+ed.sign(t, good("carol")))
	later := good("carol")
	later["exp"] = time.Now().Add(2 * time.Hour).Unix()
	c.send(`{"op":"auth","token":"` + rs.sign(t, later) + `"}`)
	c.expect(map[string]any{"op": "authed"})
	c.send(`{"op":"auth","token":"` + rs.sign(t, good("mallory")) + `"}`)
	c.expect(map[string]any{"op": "err", "code": "forbidden"})

	other := newIdpKey(t, "rs-1", "RS256") // the same kid, another key
	hs := jwt.NewWithClaims(jwt.SigningMethodHS256, good("alice"))
	hs.Header["kid"] = "rs-1"
	hsTok, _ := hs.SignedString([]byte(secretA))
	// An ES256 header over a key that is RSA: kid rs-1, signed with es.
	esAsRS := idpKey{kid: "rs-1", method: jwt.SigningMethodES256, priv: es.priv}
	// ed-1 has no alg in the JWKS: only the key type binds it.
	rsAsEd := idpKey{kid: "ed-1", method: jwt.SigningMethodRS256, priv: rs.priv}
	noKid := idpKey{method: jwt.SigningMethodES256, priv: es.priv}
	for _, tc := range []struct{ name, query, want string }{
		{"no app", "token=" + rs.sign(t, good("alice")), "lacks app"},
		{"app claim and URL differ", "app=chat&token=" + rs.sign(t, good("alice", "app", "other")), "differ"},
		{"unknown app", "app=nope&token=" + rs.sign(t, good("alice")), "unknown app"},
		{"unknown kid", "app=chat&token=" + newIdpKey(t, "rs-9", "RS256").sign(t, good("alice")), `unknown kid "rs-9"`},
		{"wrong signature", "app=chat&token=" + other.sign(t, good("alice")), "signature does not match the app's public key"},
		{"alg of another key type", "app=chat&token=" + esAsRS.sign(t, good("alice")), "does not fit"},
		{"alg against an alg-less key of another type", "app=chat&token=" + rsAsEd.sign(t, good("alice")), "does not fit"},
		{"HS256 with the secret", "app=chat&token=" + hsTok, "never HS256"},
		{"none", "app=chat&token=" + rawToken(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, good("alice")), "algorithm"},
		{"RS512", "app=chat&token=" + rawToken(t, jwt.SigningMethodRS512, rs.priv, good("alice")), "algorithm"},
		{"wrong issuer", "app=chat&token=" + rs.sign(t, claims("alice", "iss", "https://evil.example/", "aud", "roost")), "not the app's issuer"},
		{"wrong audience", "app=chat&token=" + rs.sign(t, claims("alice", "iss", "https://idp.example/", "aud", "other")), "audience"},
		{"no sub", "app=chat&token=" + rs.sign(t, jwt.MapClaims{"iss": "https://idp.example/", "aud": "roost", "exp": time.Now().Add(time.Hour).Unix()}), "lacks app, sub or exp"},
		{"expired", "app=chat&token=" + rs.sign(t, good("alice", "exp", time.Now().Add(-time.Minute).Unix())), "expired"},
		{"ten years", "app=chat&token=" + rs.sign(t, good("alice", "exp", time.Now().Add(10*365*24*time.Hour).Unix())), "max token ttl"},
		{"no kid, no key for alg", "app=chat&token=" + idpKey{method: jwt.SigningMethodRS256, priv: other.priv}.sign(t, good("alice")), "signature"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := refusal(t, n, tc.query, ""); !strings.Contains(got, "401") || !strings.Contains(got, tc.want) {
				t.Fatalf("got %q, want 401 saying %q", got, tc.want)
			}
		})
	}
	// A token without kid is checked against the set's keys of its type.
	if why := accepted(t, n, "app=chat&token="+noKid.sign(t, good("alice"))); why != "" {
		t.Fatalf("token without kid refused: %s", why)
	}
}

// The provider rotates its keys: a new kid is accepted once it appears
// (the unknown kid asks for a fetch, off the loop), and the old kid is
// refused once the set no longer holds it (the periodic fetch).
func TestJWKSRotation(t *testing.T) {
	k1, k2 := newIdpKey(t, "k1", "ES256"), newIdpKey(t, "k2", "EdDSA")
	idp := newJWKSServer(t, k1.jwk(false))
	n := secureNode(t, func(c *Config) { c.JWKSRefresh = time.Second },
		proto.App{ID: "chat", Secret: secretA, Identity: &proto.Identity{JWKSURL: idp.URL, UserClaim: "email"}})
	tok1 := k1.sign(t, claims("ignored", "email", "alice@example.com"))
	waitAccepted(t, n, "app=chat&token="+tok1)
	c := n.dialQuery(t, "app=chat&token="+tok1)
	c.send(`{"op":"pub","room":"r","id":"1","body":1}`)
	if m := c.expect(map[string]any{"op": "ack"}); m == nil {
		t.Fatal("no ack")
	}
	c.send(`{"op":"join","room":"r","since":0}`)
	c.expect(map[string]any{"op": "joined"})
	c.expect(map[string]any{"op": "msg", "from": "alice@example.com"}) // the user claim names the user

	// The user claim missing: refused.
	if got := refusal(t, n, "app=chat&token="+k1.sign(t, claims("alice")), ""); !strings.Contains(got, "user claim") {
		t.Fatalf("no email claim: %q", got)
	}

	idp.set(k1.jwk(false), k2.jwk(false))
	tok2 := k2.sign(t, claims("x", "email", "bob@example.com"))
	start := time.Now()
	waitAccepted(t, n, "app=chat&token="+tok2)
	t.Logf("new kid accepted after %v", time.Since(start))

	idp.set(k2.jwk(false))
	start = time.Now()
	for accepted(t, n, "app=chat&token="+tok1) == "" {
		if time.Since(start) > 5*time.Second {
			t.Fatal("removed kid still accepted 5 s later")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := refusal(t, n, "app=chat&token="+tok1, ""); !strings.Contains(got, `unknown kid "k1"`) {
		t.Fatalf("removed kid: %q", got)
	}
	t.Logf("removed kid refused after %v", time.Since(start))
	// Random kids do not make the node hammer the provider.
	idp.mu.Lock()
	before := idp.fetches
	idp.mu.Unlock()
	for i := range 20 {
		refusal(t, n, "app=chat&token="+newIdpKey(t, "rand-"+string(rune('a'+i)), "ES256").sign(t, claims("x", "email", "e")), "")
	}
	time.Sleep(200 * time.Millisecond)
	idp.mu.Lock()
	after := idp.fetches
	idp.mu.Unlock()
	if after-before > 3 {
		t.Fatalf("20 unknown kids made %d fetches", after-before)
	}
}

// A public key set on the app (PEM) verifies tokens of its own type only.
func TestPublicKeyTokens(t *testing.T) {
	for _, alg := range []string{"RS256", "ES256", "EdDSA"} {
		t.Run(alg, func(t *testing.T) {
			k := newIdpKey(t, "", alg)
			n := secureNode(t, nil, proto.App{ID: "chat", Secret: secretA, Identity: &proto.Identity{PublicKey: k.pem(t)}})
			if why := accepted(t, n, "app=chat&token="+k.sign(t, claims("alice"))); why != "" {
				t.Fatalf("refused: %s", why)
			}
			wrong := newIdpKey(t, "", alg)
			if got := refusal(t, n, "app=chat&token="+wrong.sign(t, claims("alice")), ""); !strings.Contains(got, "signature does not match the app's public key") {
				t.Fatalf("another key: %q", got)
			}
			otherType := map[string]string{"RS256": "ES256", "ES256": "EdDSA", "EdDSA": "RS256"}[alg]
			if got := refusal(t, n, "app=chat&token="+newIdpKey(t, "", otherType).sign(t, claims("alice")), ""); !strings.Contains(got, "does not fit the app's") {
				t.Fatalf("another key type: %q", got)
			}
			if got := refusal(t, n, "app=chat&token="+tok(secretA, "chat", "alice", time.Now().Add(time.Hour)), ""); !strings.Contains(got, "never HS256") {
				t.Fatalf("HS256: %q", got)
			}
		})
	}
}
