package proto

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"time"
)

// Identity is how an app's client tokens are checked beyond its secret
// (docs/protocol.md, "Identity from a provider"). With JWKSURL or
// PublicKey set, tokens are verified with that public key (RS256, ES256 or
// EdDSA, the algorithm bound to the key's type) instead of the secret; the
// secret stays the API's and the hooks'. Issuer, Audience and UserClaim
// apply to every token of the app.
type Identity struct {
	// JWKSURL is an identity provider's key set, fetched and refreshed
	// by each node in the background.
	JWKSURL string `json:"jwks_url,omitempty"`
	// PublicKey is one PEM public key (PKIX): RSA, ECDSA P-256 or Ed25519.
	PublicKey string `json:"public_key,omitempty"`
	// Issuer and Audience, when set, must be the token's iss and one of
	// its aud.
	Issuer   string `json:"issuer,omitempty"`
	Audience string `json:"audience,omitempty"`
	// UserClaim names the claim holding the user ("": sub).
	UserClaim string `json:"user_claim,omitempty"`
}

// DefaultMaxTokenTTL bounds how far ahead a token's exp may lie unless
// the node or the app says otherwise: a leaked token without a bound
// would be good for years.
const DefaultMaxTokenTTL = 7 * 24 * time.Hour

// HasKey reports whether the app's tokens are checked with a public key.
func (id *Identity) HasKey() bool { return id != nil && (id.JWKSURL != "" || id.PublicKey != "") }

// ParsePublicKey reads one PEM public key an app may verify tokens with:
// RSA (at least 2048 bits), ECDSA on P-256, or Ed25519.
func ParsePublicKey(pemText string) (any, error) {
	b, _ := pem.Decode([]byte(pemText))
	if b == nil {
		return nil, errors.New("public key: want a PEM block (-----BEGIN PUBLIC KEY-----)")
	}
	var k any
	var err error
	switch b.Type {
	case "PUBLIC KEY":
		k, err = x509.ParsePKIXPublicKey(b.Bytes)
	case "RSA PUBLIC KEY":
		k, err = x509.ParsePKCS1PublicKey(b.Bytes)
	default:
		return nil, fmt.Errorf("public key: PEM block %q: want PUBLIC KEY", b.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("public key: %w", err)
	}
	switch k := k.(type) {
	case *rsa.PublicKey:
		if k.N.BitLen() < 2048 {
			return nil, fmt.Errorf("public key: RSA key of %d bits: want 2048 or more", k.N.BitLen())
		}
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() {
			return nil, fmt.Errorf("public key: ECDSA on %s: want P-256 (ES256)", k.Curve.Params().Name)
		}
	case ed25519.PublicKey:
	default:
		return nil, fmt.Errorf("public key: %T: want RSA, ECDSA P-256 or Ed25519", k)
	}
	return k, nil
}

func (id *Identity) validate() error {
	if id.JWKSURL != "" && id.PublicKey != "" {
		return errors.New("identity: give a JWKS URL or a public key, not both")
	}
	if id.JWKSURL != "" {
		u, err := url.Parse(id.JWKSURL)
		if err != nil || u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
			return fmt.Errorf("jwks url %q: want an http:// or https:// URL", id.JWKSURL)
		}
	}
	if id.PublicKey != "" {
		if _, err := ParsePublicKey(id.PublicKey); err != nil {
			return err
		}
	}
	if len(id.UserClaim) > 64 || len(id.Issuer) > 1024 || len(id.Audience) > 1024 {
		return errors.New("identity: user claim longer than 64 bytes, or issuer or audience longer than 1024")
	}
	return nil
}
