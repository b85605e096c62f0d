package proto

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"strings"
	"testing"
)

func pemOf(t *testing.T, pub any) string {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
}

// An app's public key: RSA of 2048 bits or more, ECDSA P-256, Ed25519;
// anything else is refused with what to give instead.
func TestParsePublicKey(t *testing.T) {
	rsa2048, _ := rsa.GenerateKey(rand.Reader, 2048)
	rsa1024, _ := rsa.GenerateKey(rand.Reader, 1024)
	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	edPub, _, _ := ed25519.GenerateKey(rand.Reader)
	for _, good := range []any{&rsa2048.PublicKey, &p256.PublicKey, edPub} {
		if _, err := ParsePublicKey(pemOf(t, good)); err != nil {
			t.Errorf("%T refused: %v", good, err)
		}
	}
	pkcs1 := string(pem.EncodeToMemory(&pem.Block{Type: "RSA PUBLIC KEY", Bytes: x509.MarshalPKCS1PublicKey(&rsa2048.PublicKey)}))
	if _, err := ParsePublicKey(pkcs1); err != nil {
		t.Errorf("PKCS#1 RSA key refused: %v", err)
	}
	for _, tc := range []struct{ pem, want string }{
		{pemOf(t, &rsa1024.PublicKey), "2048 or more"},
		{pemOf(t, &p384.PublicKey), "P-256"},
		{"not pem", "PEM block"},
		{string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1}})), "want PUBLIC KEY"},
		{string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: []byte{1, 2}})), "public key"},
	} {
		if _, err := ParsePublicKey(tc.pem); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%.30q: %v, want %q", tc.pem, err, tc.want)
		}
	}
	a := App{ID: "a", Secret: "secret-0123456789", Identity: &Identity{JWKSURL: "https://idp/jwks", PublicKey: pemOf(t, edPub)}}
	if err := a.Validate(); err == nil || !strings.Contains(err.Error(), "not both") {
		t.Errorf("both sources: %v", err)
	}
}
