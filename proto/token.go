package proto

import (
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// TokenClaims are the claims of a client token: an HS256 JWT signed with
// a secret of its app. `app`, `sub` and `exp` are required; `rooms` (exact
// names or `prefix*`) limits the rooms the user may join and publish to,
// absent meaning every room of the app; `nbf` and `iat`, when present, are
// checked (with the node's leeway for clock skew).
type TokenClaims struct {
	App   string   `json:"app"`
	Rooms []string `json:"rooms,omitempty"`
	jwt.RegisteredClaims
}

// SignToken makes a client token for user sub of app, valid until exp (in
// whole seconds, rounded down), signed with secret. rooms nil allows every
// room of the app. Verifiers accept fractional `exp` from other signers.
func SignToken(secret []byte, app, sub string, exp time.Time, rooms []string) (string, error) {
	now := time.Now()
	cl := TokenClaims{App: app, Rooms: rooms, RegisteredClaims: jwt.RegisteredClaims{
		Subject:   sub,
		ExpiresAt: &jwt.NumericDate{Time: exp},
		IssuedAt:  &jwt.NumericDate{Time: now.Truncate(time.Second)},
	}}
	return jwt.NewWithClaims(jwt.SigningMethodHS256, &cl).SignedString(secret)
}
