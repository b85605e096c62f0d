package loop

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bytedance/sonic"

	"github.com/roost-chat/roost/proto"
)

// app is a tenant. Shared by its connections, read-only after creation.
type app struct {
	id     string
	secret []byte
	conns  atomic.Int64 // open WebSocket connections (metrics)
}

// apps is the node's app registry: configured secrets in production,
// created on first use in insecure mode. Touched on upgrade only.
type apps struct {
	insecure bool
	mu       sync.RWMutex
	byID     map[string]*app
}

func newApps(insecure bool, secrets map[string][]byte) *apps {
	a := &apps{insecure: insecure, byID: make(map[string]*app)}
	for id, sec := range secrets {
		a.byID[id] = &app{id: id, secret: sec}
	}
	return a
}

func (a *apps) get(id []byte) *app {
	a.mu.RLock()
	p := a.byID[string(id)]
	a.mu.RUnlock()
	if p != nil || !a.insecure {
		return p
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if p = a.byID[string(id)]; p == nil {
		p = &app{id: string(id)}
		a.byID[p.id] = p
	}
	return p
}

// roomClaims are the `rooms` of a token: exact names or `prefix*`.
type roomClaims struct{ patterns []string }

// allows: nil claims allow every room of the app.
func (rc *roomClaims) allows(room []byte) bool {
	if rc == nil {
		return true
	}
	for _, p := range rc.patterns {
		if strings.HasSuffix(p, "*") {
			if bytes.HasPrefix(room, []byte(p[:len(p)-1])) {
				return true
			}
		} else if string(room) == p {
			return true
		}
	}
	return false
}

var (
	errNoToken  = &proto.HTTPError{Status: 401, Reason: "missing token: connect with /ws?token=JWT"}
	errBadToken = &proto.HTTPError{Status: 401, Reason: "malformed token"}
	errBadSig   = &proto.HTTPError{Status: 401, Reason: "token signature does not match the app's secret"}
	errExpired  = &proto.HTTPError{Status: 401, Reason: "token expired"}
	errUnknown  = &proto.HTTPError{Status: 401, Reason: "unknown app"}
	errClaims   = &proto.HTTPError{Status: 401, Reason: "token lacks app, sub or exp"}
	errAlg      = &proto.HTTPError{Status: 401, Reason: "token algorithm must be HS256"}
	errNoUser   = &proto.HTTPError{Status: 400, Reason: "insecure mode needs ?user=NAME: 1 to 128 characters of UTF-8, no control characters"}
	errBadSub   = &proto.HTTPError{Status: 401, Reason: "token sub must be 1 to 128 characters of UTF-8, no control characters"}
	errBadAppID = &proto.HTTPError{Status: 400, Reason: "app must match [A-Za-z0-9_.-]{1,64}"}
)

// identify sets the connection's app and user from the query: a JWT in
// production, ?user=&app= in insecure mode.
func (c *conn) identify(query []byte) *proto.HTTPError {
	s := c.l.srv
	var buf [512]byte
	if s.cfg.Insecure {
		if tok, ok := proto.QueryValue(query, "token", buf[:0]); ok && len(tok) > 0 {
			return c.verify(tok)
		}
		user, ok := proto.QueryValue(query, "user", buf[:0])
		if !ok || !proto.ValidUser(user) {
			return errNoUser
		}
		c.user = string(user)
		appID, ok := proto.QueryValue(query, "app", buf[:0])
		if !ok || len(appID) == 0 {
			appID = []byte("demo")
		}
		if !proto.ValidAppID(appID) {
			return errBadAppID
		}
		c.app = s.apps.get(appID)
		return nil
	}
	tok, ok := proto.QueryValue(query, "token", make([]byte, 0, len(query)))
	if !ok || len(tok) == 0 {
		return errNoToken
	}
	return c.verify(tok)
}

type claims struct {
	App   string   `json:"app"`
	Sub   string   `json:"sub"`
	Exp   int64    `json:"exp"`
	Rooms []string `json:"rooms"`
}

// verify checks an HS256 JWT against its app's secret.
func (c *conn) verify(tok []byte) *proto.HTTPError {
	parts := bytes.Split(tok, []byte("."))
	if len(parts) != 3 {
		return errBadToken
	}
	enc := base64.RawURLEncoding
	head, err := enc.DecodeString(string(parts[0]))
	if err != nil {
		return errBadToken
	}
	var h struct {
		Alg string `json:"alg"`
	}
	if sonic.Unmarshal(head, &h) != nil {
		return errBadToken
	}
	if h.Alg != "HS256" {
		return errAlg
	}
	body, err := enc.DecodeString(string(parts[1]))
	if err != nil {
		return errBadToken
	}
	var cl claims
	if sonic.Unmarshal(body, &cl) != nil {
		return errBadToken
	}
	if cl.App == "" || cl.Sub == "" || cl.Exp == 0 {
		return errClaims
	}
	a := c.l.srv.apps.get([]byte(cl.App))
	if a == nil || len(a.secret) == 0 {
		return errUnknown
	}
	sig, err := enc.DecodeString(string(parts[2]))
	if err != nil {
		return errBadToken
	}
	mac := hmac.New(sha256.New, a.secret)
	mac.Write(tok[:len(parts[0])+1+len(parts[1])])
	if !hmac.Equal(sig, mac.Sum(nil)) {
		return errBadSig
	}
	if time.Now().Unix() >= cl.Exp {
		return errExpired
	}
	if !proto.ValidUser([]byte(cl.Sub)) {
		return errBadSub
	}
	c.app = a
	c.user = cl.Sub
	c.exp = cl.Exp
	if cl.Rooms != nil {
		c.rooms = &roomClaims{patterns: cl.Rooms}
	}
	return nil
}

// SignToken makes an HS256 token (for tests, the load generator and
// operators' tooling).
func SignToken(secret []byte, appID, sub string, exp time.Time, rooms []string) string {
	enc := base64.RawURLEncoding
	head := enc.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`))
	cl := claims{App: appID, Sub: sub, Exp: exp.Unix(), Rooms: rooms}
	b, _ := sonic.Marshal(&cl)
	msg := head + "." + enc.EncodeToString(b)
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(msg))
	return msg + "." + enc.EncodeToString(mac.Sum(nil))
}
