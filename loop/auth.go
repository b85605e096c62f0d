package loop

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/roost-chat/roost/fanout/proxy"
	"github.com/roost-chat/roost/fanout/tenancy"
	"github.com/roost-chat/roost/proto"
)

// Refusal reasons counted per app (AppStats).
const (
	RefusedConnLimit     = iota // the app's connections, cluster-wide
	RefusedUserConnLimit        // the user's connections
	RefusedUserRate             // publishes of one user
	RefusedAppRate              // publishes of the app
	RefusedTooLarge             // message body over MaxMsg
	RefusedRoomLimit            // rooms per connection
	RefusedAuth                 // a token of this app that did not verify, or a refused refresh
	RefusedDisabled             // connection attempts of a disabled app, and connections closed by disable
	RefusedProxy                // connections and publishes the app's proxy hooks refused (or failed closed)
	RefusedPresenceLimit        // joins with presence in a room with the app's maximum of presence subscribers
	RefusedSignalRate           // signals over a connection's signal rate
	RefusedReadRate             // read, unread and receipts requests over a connection's read rate
	numRefusals
)

// RefusalNames label the refusal counters in metrics.
var RefusalNames = [numRefusals]string{"conn_limit", "user_conn_limit", "user_rate", "app_rate", "too_large", "room_limit", "auth", "disabled", "proxy", "presence_limit", "signal_rate", "read_rate"}

// app is a tenant on this node. It lives as long as the node (the map only
// grows: registered apps, bounded first-use apps in insecure mode); its
// configuration is swapped whole when the registry changes.
type app struct {
	id  string
	cfg atomic.Pointer[appConfig] // nil: not registered (unknown to token checks)

	conns  atomic.Int64   // open WebSocket connections of this node (admitted)
	remote atomic.Int64   // the app's connections on the other nodes (shared through Redis)
	pub    tenancy.Bucket // the app's publishes on this node

	mu    sync.Mutex
	users map[string]*appUser // users with a connection on this node, or a spent bucket
	// more: the WebSocket connections past the first (appUser.ws) of the
	// users with more than one; nil while there is none.
	more map[*appUser][]*conn
	// spent: users whose last connection ended with their bucket spent,
	// kept until it refills; pruneUsers visits these only, not every user
	// (15,000 idle users cost a map walk a second otherwise).
	spent []string

	refused [numRefusals]atomic.Uint64

	reg *apps // for its online hook; nil in tests that make an app alone
}

// appUser is one user of an app on this node: its connections (under
// app.mu) and its publish bucket, shared by its connections on every loop.
type appUser struct {
	conns int32
	spent bool // in app.spent
	// online: counted in the app's presence (apps.online): the app wants
	// connection events.
	online bool
	pub    tenancy.Bucket
	// ws is the user's first open WebSocket connection on this node (any
	// loop; under app.mu), the others in app.more: the index a read
	// position reaches the user's connections by (loopState.membersOf).
	// It lives here, in the record every admitted connection has anyway,
	// so that an idle connection costs no per-loop map entry of its user
	// (density: docs/bench-notes/2026-12-06.md, "Density"); the others,
	// rare, live in the app so that the struct is 24 bytes, not 32
	// ("density2").
	ws *conn
}

// appConfig is an app's view (tenancy.View, the same the server API reads)
// with what only the client edges use. Immutable once stored.
type appConfig struct {
	*tenancy.View
	maxRooms int
	// The app's proxy hooks; nil: not asked (proxy.go).
	connectProxy, publishProxy *proxy.Target
	// keys: the app verifies its tokens with a public key (idkeys.go);
	// nil: with its secrets.
	keys *idKeys
}

// resolve is a's configuration with a view of its own: an app the
// registry does not hold (made on first use in insecure mode).
func resolve(lim tenancy.Limits, maxRooms int, a *proto.App) *appConfig {
	return withView(tenancy.Resolve(lim, a), maxRooms, a)
}

// withView is a's configuration around its view v (built from a).
func withView(v *tenancy.View, maxRooms int, a *proto.App) *appConfig {
	c := &appConfig{View: v, maxRooms: appMaxRooms(a.Limits.MaxRooms, maxRooms)}
	if p := a.Proxy; p != nil {
		// The secrets as stored, not as valid now: the pool drops the
		// previous one at PreviousUntil itself, with no registry change.
		t := proxy.Target{Timeout: time.Duration(p.Timeout), FailOpen: p.FailOpen, InFlight: p.InFlight,
			Secret: a.Secret, PreviousSecret: a.PreviousSecret, PreviousUntil: a.PreviousUntil}
		if t.Timeout <= 0 {
			t.Timeout = proto.DefaultProxyTimeout
		}
		if p.Connect != "" {
			ct := t
			ct.URL = p.Connect
			c.connectProxy = &ct
		}
		if p.Publish != "" {
			pt := t
			pt.URL = p.Publish
			c.publishProxy = &pt
		}
	}
	return c
}

// appMaxRooms is an app's rooms per connection: its override can only lower
// the node's --max-rooms, the ceiling fanout holds every connection to, so
// 0 (off) or a higher value leaves the ceiling. SSE checks its rooms
// against this before it answers, and must not accept what fanout refuses.
func appMaxRooms(override *int64, node int) int {
	if override == nil || *override <= 0 || *override > int64(node) {
		return node
	}
	return int(*override)
}

// apps is the node's app registry: the configured and registered apps,
// and in insecure mode the apps made on first use, at most maxFirstUse of
// them so that a client cannot grow the map or the metric series without
// bound. Touched on upgrade and on registry changes only.
type apps struct {
	insecure    bool
	maxFirstUse int
	lim         tenancy.Limits // of the apps made on first use
	maxRooms    int
	jwks        *jwksSources

	mu       sync.RWMutex
	byID     map[string]*app
	firstUse int
	pruned   atomic.Int64 // Unix ms of the last pruneUsers

	// online counts a user's first connection to an app on this node
	// (on) and the end of its last one, for apps whose webhook wants
	// connection events (fanout.Node.Online). Set once, before the loops
	// run; called under app.mu (it takes a presence shard lock, a leaf).
	online func(app, user string, on bool)
}

func newApps(cfg *Config, log *slog.Logger) *apps {
	every := cfg.JWKSRefresh
	if every <= 0 {
		every = DefaultJWKSRefresh
	}
	lim := cfg.AppLimits()
	a := &apps{insecure: cfg.Insecure, maxFirstUse: cfg.InsecureMaxApps, lim: lim, maxRooms: cfg.MaxRooms,
		byID: make(map[string]*app),
		jwks: &jwksSources{every: every, log: log, byURL: map[string]*jwksSource{}}}
	// The static apps until the node hands its registry's snapshot over
	// (SetApps); a node without a registry hands the same one.
	a.set(tenancy.NewSnapshot(lim, cfg.Apps, nil))
	return a
}

// lookup returns a known app, or nil. It never creates one.
func (a *apps) lookup(id []byte) *app {
	a.mu.RLock()
	p := a.byID[string(id)]
	a.mu.RUnlock()
	return p
}

var errTooManyApps = &proto.HTTPError{Status: 403, Reason: "too many apps made on first use: this insecure node makes at most --insecure-max-apps of them"}

// firstUse returns the app id of an insecure connection, making it on its
// first use (id already checked by ValidAppID).
func (a *apps) firstUseApp(id []byte) (*app, *proto.HTTPError) {
	if p := a.lookup(id); p != nil {
		return p, nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if p := a.byID[string(id)]; p != nil {
		return p, nil
	}
	if a.maxFirstUse > 0 && a.firstUse >= a.maxFirstUse {
		return nil, errTooManyApps
	}
	a.firstUse++
	p := &app{id: string(id), users: make(map[string]*appUser), reg: a}
	p.cfg.Store(resolve(a.lim, a.maxRooms, &proto.App{ID: p.id}))
	a.byID[p.id] = p
	return p, nil
}

// set installs a registry snapshot (registered apps; --app-secret entries
// fill in ids the registry does not hold), wrapping each app's view (the
// server API holds the same one) with what only the client edges use. It
// returns the apps that became disabled or unknown, whose live connections
// must be closed, and those whose secrets changed, whose connections'
// tokens must be looked at again.
func (a *apps) set(snap *tenancy.Snapshot) (gone, rekeyed []*app) {
	merged := make(map[string]*appConfig, len(snap.Entries))
	used := map[string]*jwksSource{}
	for _, e := range snap.Entries {
		c := withView(e.View, a.maxRooms, e.App)
		c.keys = a.jwks.keysFor(e.App.Identity, used)
		merged[e.App.ID] = c
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	defer a.jwks.keep(used)
	for id, cfg := range merged {
		p := a.byID[id]
		if p == nil {
			p = &app{id: id, users: make(map[string]*appUser), reg: a}
			a.byID[id] = p
		}
		old := p.cfg.Swap(cfg)
		switch {
		case cfg.Disabled && (old == nil || !old.Disabled):
			gone = append(gone, p)
		case old != nil && !sameSecrets(old, cfg):
			rekeyed = append(rekeyed, p)
		}
	}
	for id, p := range a.byID {
		if _, ok := merged[id]; ok {
			continue
		}
		old := p.cfg.Load()
		if old == nil || len(old.Secrets) == 0 {
			continue // made on first use (insecure): not the registry's
		}
		// Removed from the registry: unknown from now on.
		if a.insecure {
			p.cfg.Store(resolve(a.lim, a.maxRooms, &proto.App{ID: id}))
		} else {
			p.cfg.Store(nil)
		}
		gone = append(gone, p)
	}
	return gone, rekeyed
}

// sameSecrets: the tokens a and b accept by secret, and until when.
func sameSecrets(a, b *appConfig) bool {
	if len(a.Secrets) != len(b.Secrets) || !a.PrevUntil.Equal(b.PrevUntil) {
		return false
	}
	for i := range a.Secrets {
		if !bytes.Equal(a.Secrets[i], b.Secrets[i]) {
			return false
		}
	}
	return true
}

// admit counts a new connection of user against the app's limits; it
// returns the refusal (a close reason) or "". On success c.user is
// counted and must be released by release.
func (p *app) admit(cfg *appConfig, user string) (*appUser, string) {
	n := p.conns.Add(1)
	if cfg.MaxConns > 0 && n+p.remote.Load() > cfg.MaxConns {
		p.conns.Add(-1)
		p.refused[RefusedConnLimit].Add(1)
		return nil, "connection limit"
	}
	p.mu.Lock()
	u := p.users[user]
	if u == nil {
		u = &appUser{}
		p.users[user] = u
	}
	if cfg.MaxUserConns > 0 && int64(u.conns) >= cfg.MaxUserConns {
		p.mu.Unlock()
		p.conns.Add(-1)
		p.refused[RefusedUserConnLimit].Add(1)
		return nil, "connection limit"
	}
	u.conns++
	if u.conns == 1 && cfg.Online && p.reg != nil && p.reg.online != nil {
		u.online = true
		p.reg.online(p.id, user, true)
	}
	p.mu.Unlock()
	return u, ""
}

// release forgets one admitted connection.
func (p *app) release(user string, u *appUser) {
	p.conns.Add(-1)
	p.mu.Lock()
	p.releaseLocked(user, u)
	p.mu.Unlock()
}

// releaseConn releases c's admission and takes c out of its user's
// connections (linkWS); c.au is nil afterwards.
func (p *app) releaseConn(c *conn) {
	u := c.au
	c.au = nil
	p.conns.Add(-1)
	p.mu.Lock()
	p.unlink(u, c)
	p.releaseLocked(c.user, u)
	p.mu.Unlock()
}

func (p *app) releaseLocked(user string, u *appUser) {
	u.conns--
	if u.conns == 0 {
		if u.online {
			// Counted when it came: ended however the app's settings
			// changed since.
			u.online = false
			p.reg.online(p.id, user, false)
		}
		if u.pub.Full(tenancy.Now()) {
			// Its bucket is full again: nothing to remember.
			delete(p.users, user)
		} else if !u.spent {
			// A user who reconnects at once keeps a spent bucket;
			// pruneUsers drops it once full.
			u.spent = true
			p.spent = append(p.spent, user)
		}
	}
}

// linkWS adds c, an open WebSocket connection or SSE stream admitted as
// c.au, to its user's connections: read positions reach it from now on,
// until releaseConn.
func (p *app) linkWS(c *conn) {
	p.mu.Lock()
	u := c.au
	switch {
	case u.ws == nil:
		u.ws = c
	default:
		if p.more == nil {
			p.more = make(map[*appUser][]*conn)
		}
		p.more[u] = append(p.more[u], c)
	}
	p.mu.Unlock()
}

// unlink takes c out of u's WebSocket connections, if there. Under
// p.mu.
func (p *app) unlink(u *appUser, c *conn) {
	m := p.more[u]
	if u.ws == c {
		u.ws = nil
		if len(m) == 0 {
			return
		}
		u.ws, m[len(m)-1] = m[len(m)-1], nil
		m = m[:len(m)-1]
	} else {
		i := slices.Index(m, c)
		if i < 0 {
			return
		}
		m[i], m[len(m)-1] = m[len(m)-1], nil
		m = m[:len(m)-1]
	}
	if len(m) == 0 {
		if delete(p.more, u); len(p.more) == 0 {
			p.more = nil
		}
	} else {
		p.more[u] = m
	}
}

// moreOf is u's WebSocket connections past u.ws. Under p.mu.
func (p *app) moreOf(u *appUser) []*conn { return p.more[u] }

// maybePrune runs pruneUsers at most once a second, from whichever loop's
// sweep comes first. now is Unix ms.
func (a *apps) maybePrune(now int64) {
	last := a.pruned.Load()
	if now-last >= 1000 && a.pruned.CompareAndSwap(last, now) {
		a.pruneUsers()
	}
}

// pruneUsers drops users without connections whose buckets have refilled.
func (a *apps) pruneUsers() {
	now := tenancy.Now()
	a.mu.RLock()
	defer a.mu.RUnlock()
	for _, p := range a.byID {
		p.mu.Lock()
		keep := p.spent[:0]
		for _, id := range p.spent {
			u := p.users[id]
			switch {
			case u == nil:
			case u.conns > 0:
				u.spent = false // back: its next release looks again
			case u.pub.Full(now):
				delete(p.users, id)
			default:
				keep = append(keep, id)
			}
		}
		clear(p.spent[len(keep):])
		p.spent = keep
		p.mu.Unlock()
	}
}

// roomClaims are what a token grants: its `rooms` (exact names or
// `prefix*`) and its expiry. Kept together so that a connection without a
// token pays one nil pointer for both.
type roomClaims struct {
	patterns []string
	all      bool  // no rooms claim: every room of the app
	expMS    int64 // Unix ms at which the connection is closed: the token's end, or its secret's retirement
	tokExpMS int64 // Unix ms at which the token stops being accepted (exp + leeway)
	// signer is the secret that signed the token (nil: a public key did):
	// when a rotation retires it, the connection ends unless refreshed.
	signer []byte
}

// retireSpread spreads the closes of a retired secret's connections, so
// that their reconnects do not all arrive in one sweep. With the sweep's
// second, a connection ends at most 3 s after its secret expired.
const retireSpread = 2 * time.Second

// retire sets when the connection ends given the app's secrets now:
// at its token's end while its secret is current; at the previous
// secret's expiry (plus a spread) while it is the previous one; within
// the spread once the secret is gone, or at the end already set for it
// (a registry re-read past the expiry does not put it off). Upgrade,
// refresh and rekey only.
func (rc *roomClaims) retire(cfg *appConfig, nowMS int64) {
	if rc.signer == nil || len(cfg.Secrets) > 0 && bytes.Equal(rc.signer, cfg.Secrets[0]) {
		rc.expMS = rc.tokExpMS
		return
	}
	jitter := rand.Int64N(retireSpread.Milliseconds())
	if len(cfg.Secrets) > 1 && bytes.Equal(rc.signer, cfg.Secrets[1]) {
		rc.expMS = min(rc.tokExpMS, max(nowMS, cfg.PrevUntil.UnixMilli())+jitter)
		return
	}
	if rc.expMS == 0 || rc.expMS >= rc.tokExpMS || rc.expMS > nowMS+retireSpread.Milliseconds() {
		rc.expMS = min(rc.tokExpMS, nowMS+jitter)
	}
}

// allows: nil claims (no token) allow every room of the app.
func (rc *roomClaims) allows(room []byte) bool {
	if rc == nil || rc.all {
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
	errNoToken     = &proto.HTTPError{Status: 401, Reason: "missing token: connect with /ws?token=JWT or Authorization: Bearer JWT"}
	errBadToken    = &proto.HTTPError{Status: 401, Reason: "malformed token"}
	errBadSig      = &proto.HTTPError{Status: 401, Reason: "token signature does not match the app's secret"}
	errBadKeySig   = &proto.HTTPError{Status: 401, Reason: "token signature does not match the app's public key"}
	errExpired     = &proto.HTTPError{Status: 401, Reason: "token expired"}
	errNotYet      = &proto.HTTPError{Status: 401, Reason: "token not valid yet (nbf is in the future)"}
	errIssued      = &proto.HTTPError{Status: 401, Reason: "token issued in the future (iat): check the signer's clock"}
	errUnknown     = &proto.HTTPError{Status: 401, Reason: "unknown app"}
	errClaims      = &proto.HTTPError{Status: 401, Reason: "token lacks app, sub or exp (a provider's token names its app with app= in the URL)"}
	errBadClaims   = &proto.HTTPError{Status: 401, Reason: "token app must match [A-Za-z0-9_.-]{1,64}"}
	errAppMismatch = &proto.HTTPError{Status: 401, Reason: "token app claim and app= in the URL differ"}
	errAlg         = &proto.HTTPError{Status: 401, Reason: "token algorithm must be HS256 (" + providerAlgs + " for an app with a public key)"}
	errAlgSecret   = &proto.HTTPError{Status: 401, Reason: "token algorithm must be HS256: the app verifies tokens with its secret"}
	errAlgKey      = &proto.HTTPError{Status: 401, Reason: "token algorithm must be " + providerAlgs + ": the app verifies tokens with a public key, never HS256"}
	errDisabled    = &proto.HTTPError{Status: 403, Reason: "app disabled"}
	errNoUser      = &proto.HTTPError{Status: 400, Reason: "insecure mode needs ?user=NAME: 1 to 128 characters of UTF-8, no control characters"}
	errBadSub      = &proto.HTTPError{Status: 401, Reason: "token sub must be 1 to 128 characters of UTF-8, no control characters"}
	errBadAppID    = &proto.HTTPError{Status: 400, Reason: "app must match [A-Za-z0-9_.-]{1,64}"}
	errTwoTokens   = &proto.HTTPError{Status: 400, Reason: "give the token once: ?token= or Authorization: Bearer, not both"}
	errBadBearer   = &proto.HTTPError{Status: 401, Reason: "Authorization header must be Bearer JWT"}
)

// keyError carries a refusal out of the key function.
type keyError struct{ he *proto.HTTPError }

func (e keyError) Error() string { return e.he.Reason }

// identify sets the connection's app and user from the request: a JWT
// (?token= or Authorization: Bearer), or ?user=&app= in insecure mode.
func (c *conn) identify(req *proto.Request) *proto.HTTPError {
	s := c.l.srv
	var buf [512]byte
	tok, hasTok := proto.QueryValue(req.Query, "token", make([]byte, 0, len(req.Query)))
	hasTok = hasTok && len(tok) > 0
	if len(req.Authorization) > 0 {
		if hasTok {
			return errTwoTokens
		}
		scheme, rest, ok := bytes.Cut(req.Authorization, []byte(" "))
		if !ok || !bytes.EqualFold(scheme, []byte("Bearer")) || len(bytes.TrimSpace(rest)) == 0 {
			return errBadBearer
		}
		tok, hasTok = bytes.TrimSpace(rest), true
	}
	if hasTok {
		// A provider's token names no app: app= in the URL does.
		appID, _ := proto.QueryValue(req.Query, "app", buf[:0])
		if len(appID) > 0 && !proto.ValidAppID(appID) {
			return errBadAppID
		}
		v, he := s.verify(tok, string(appID), true)
		if he != nil {
			return he
		}
		c.app, c.user, c.rooms = v.app, v.sub, v.rooms
		return nil
	}
	if !s.cfg.Insecure {
		return errNoToken
	}
	user, ok := proto.QueryValue(req.Query, "user", buf[:0])
	if !ok || !proto.ValidUser(user) {
		return errNoUser
	}
	c.user = string(user)
	appID, ok := proto.QueryValue(req.Query, "app", buf[:0])
	if !ok || len(appID) == 0 {
		appID = []byte("demo")
	}
	if !proto.ValidAppID(appID) {
		return errBadAppID
	}
	a, he := s.apps.firstUseApp(appID)
	if he != nil {
		return he
	}
	c.app = a
	return nil
}

// verified is what a good token says.
type verified struct {
	app   *app
	sub   string
	exp   float64 // the exp claim, Unix s
	rooms *roomClaims
}

// verify checks a token for the app it names: its app claim, or appID when
// the token has none (a provider's token). With agree, a token's claim
// that differs from appID is refused (app= in the URL); without, the claim
// wins (a refresh: the caller compares). HS256 signed with a current secret
// of the app, or for an app with a public key RS256, ES256 or EdDSA as
// the key's type says; the user well formed (sub, or the app's user
// claim); exp required, in the future (fractions allowed) and within the
// app's max token TTL; nbf and iat honoured when present, all within the
// node's leeway; iss and aud as the app expects when it says. Upgrade and
// refresh only: it allocates.
func (s *Server) verify(tok []byte, appID string, agree bool) (verified, *proto.HTTPError) {
	var cl proto.TokenClaims
	var found *app
	var cfg *appConfig
	t, err := s.jwt.ParseWithClaims(string(tok), &cl, func(t *jwt.Token) (any, error) {
		id := cl.App
		switch {
		case id == "":
			id = appID
		case agree && appID != "" && id != appID:
			return nil, keyError{errAppMismatch}
		}
		if id == "" {
			return nil, keyError{errClaims}
		}
		if !proto.ValidAppID([]byte(id)) {
			return nil, keyError{errBadClaims}
		}
		a := s.apps.lookup([]byte(id))
		if a != nil {
			cfg = a.cfg.Load()
		}
		if cfg == nil || len(cfg.Secrets) == 0 && cfg.keys == nil {
			return nil, keyError{errUnknown}
		}
		found = a
		if cfg.keys != nil {
			k, he := cfg.keys.key(t)
			if he != nil {
				return nil, keyError{he}
			}
			return k, nil
		}
		if t.Method.Alg() != "HS256" {
			return nil, keyError{errAlgSecret}
		}
		if cl.App == "" {
			return nil, keyError{errClaims} // a secret's tokens name their app
		}
		valid := cfg.ValidSecrets(time.Now())
		if len(valid) == 1 {
			return valid[0], nil
		}
		keys := jwt.VerificationKeySet{Keys: make([]jwt.VerificationKey, len(valid))}
		for i, k := range valid {
			keys.Keys[i] = k
		}
		return keys, nil
	})
	var he *proto.HTTPError
	var sub string
	if err != nil {
		he = tokenError(t, err, cfg)
	} else {
		sub, he = s.checkClaims(t, &cl, cfg)
	}
	if he != nil {
		if found != nil && he != errUnknown {
			found.refused[RefusedAuth].Add(1)
		}
		return verified{}, he
	}
	if cfg.Disabled {
		found.refused[RefusedDisabled].Add(1)
		return verified{}, errDisabled
	}
	exp := cl.ExpiresAt.Time
	rc := &roomClaims{patterns: cl.Rooms, all: cl.Rooms == nil, tokExpMS: exp.Add(s.cfg.Leeway).UnixMilli()}
	if cfg.keys == nil {
		rc.signer = cfg.Secrets[0]
		if len(cfg.Secrets) > 1 && !signedWith(t, cfg.Secrets[0]) {
			rc.signer = cfg.Secrets[1]
		}
	}
	rc.retire(cfg, time.Now().UnixMilli())
	return verified{app: found, sub: sub, exp: float64(exp.UnixNano()) / 1e9, rooms: rc}, nil
}

// signedWith reports whether secret signed t (a rotation's tokens: which
// of the two secrets ends them).
func signedWith(t *jwt.Token, secret []byte) bool {
	i := strings.LastIndexByte(t.Raw, '.')
	return i > 0 && jwt.SigningMethodHS256.Verify(t.Raw[:i], t.Signature, secret) == nil
}

// checkClaims checks what a verified token says beyond its signature and
// times, and returns its user.
func (s *Server) checkClaims(t *jwt.Token, cl *proto.TokenClaims, cfg *appConfig) (string, *proto.HTTPError) {
	if cfg.MaxTokenTTL > 0 {
		if ahead := time.Until(cl.ExpiresAt.Time); ahead > cfg.MaxTokenTTL+s.cfg.Leeway {
			return "", &proto.HTTPError{Status: 401, Reason: fmt.Sprintf("token exp is %s ahead: the app's max token ttl is %s (--max-token-ttl)",
				ahead.Round(time.Second), cfg.MaxTokenTTL)}
		}
	}
	if cfg.Issuer != "" && cl.Issuer != cfg.Issuer {
		return "", &proto.HTTPError{Status: 401, Reason: fmt.Sprintf("token iss %q is not the app's issuer %q", trim(cl.Issuer, 128), cfg.Issuer)}
	}
	if cfg.Audience != "" && !slices.Contains(cl.Audience, cfg.Audience) {
		return "", &proto.HTTPError{Status: 401, Reason: fmt.Sprintf("token aud does not hold the app's audience %q", cfg.Audience)}
	}
	sub := cl.Subject
	if cfg.UserClaim != "" {
		sub = userClaim(t.Raw, cfg.UserClaim)
		if !proto.ValidUser([]byte(sub)) {
			return "", &proto.HTTPError{Status: 401, Reason: "token claim " + cfg.UserClaim + " (the app's user claim) must be a string of 1 to 128 characters of UTF-8, no control characters"}
		}
		return sub, nil
	}
	if sub == "" {
		return "", errClaims
	}
	if !proto.ValidUser([]byte(sub)) {
		return "", errBadSub
	}
	return sub, nil
}

// userClaim reads a string claim of a verified token's payload ("" when
// absent or not a string).
func userClaim(raw, name string) string {
	parts := strings.Split(raw, ".")
	if len(parts) != 3 {
		return ""
	}
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return ""
	}
	var m map[string]any
	if json.Unmarshal(b, &m) != nil {
		return ""
	}
	v, _ := m[name].(string)
	return v
}

// tokenError names what is wrong with a token, most specific first.
func tokenError(t *jwt.Token, err error, cfg *appConfig) *proto.HTTPError {
	var ke keyError
	switch {
	case errors.Is(err, jwt.ErrTokenMalformed):
		return errBadToken
	case errors.As(err, &ke):
		return ke.he
	case t != nil && !validAlg(t.Header["alg"]):
		return errAlg
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		return errClaims
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		if cfg != nil && cfg.keys != nil {
			return errBadKeySig
		}
		return errBadSig
	case errors.Is(err, jwt.ErrTokenExpired):
		return errExpired
	case errors.Is(err, jwt.ErrTokenNotValidYet):
		return errNotYet
	case errors.Is(err, jwt.ErrTokenUsedBeforeIssued):
		return errIssued
	}
	return errBadToken
}

// tokenAlgs are the algorithms any app accepts; which one an app takes is
// bound in verify's key function (HS256 for a secret, the key's own for a
// public key).
var tokenAlgs = []string{"HS256", "RS256", "ES256", "EdDSA"}

func validAlg(alg any) bool {
	s, _ := alg.(string)
	return slices.Contains(tokenAlgs, s)
}

// newTokenParser: an HS512 or `none` token is refused before its
// signature is looked at.
func newTokenParser(leeway time.Duration) *jwt.Parser {
	return jwt.NewParser(jwt.WithValidMethods(tokenAlgs), jwt.WithLeeway(leeway),
		jwt.WithExpirationRequired(), jwt.WithIssuedAt())
}

// refresh is the auth op: a new token for the same app and user with a
// later exp replaces the connection's (its rooms claim too; rooms already
// joined stay joined). A bad one is answered err forbidden and the old
// expiry stands.
func (c *conn) refresh(tok []byte) {
	s := c.l.srv
	if len(tok) == 0 {
		c.sendErr(nil, proto.CodeBadRequest, "auth needs a token")
		return
	}
	v, he := s.verify(tok, c.app.id, false)
	var why string
	switch {
	case he != nil:
		why = he.Reason
	case v.app != c.app:
		why = "token is for another app"
	case v.sub != c.user:
		why = "token is for another user"
	case c.rooms != nil && v.rooms.tokExpMS <= c.rooms.tokExpMS:
		why = "token must expire later than the current one"
	}
	if why != "" {
		if he == nil {
			c.app.refused[RefusedAuth].Add(1)
		}
		c.sendErr(nil, proto.CodeForbidden, "token refused: "+why)
		return
	}
	c.rooms = v.rooms
	c.l.due[c.pos] = c.dueAt() // the sweep looks at the new expiry, not the old one
	a := c.l.arena
	c.send(a.Keep(proto.AppendAuthedFrame(a.Space(64), v.exp)))
}

// SetApps installs a snapshot of the registry (any goroutine), the one the
// server API is handed too: new connections see the change at once; the
// live connections of apps now disabled, or gone from the registry, are
// closed with 1008; those of apps whose secrets changed have their tokens
// looked at again (rekeyApp). The snapshot must be resolved against this
// node's Config.Limits and hold its Config.Apps.
func (s *Server) SetApps(snap *tenancy.Snapshot) {
	gone, rekeyed := s.apps.set(snap)
	n := int(s.nloops.Load())
	for _, p := range gone {
		for i := 0; i < n; i++ {
			s.loops[i].Load().push(task{kind: tCloseApp, app: p.id})
		}
	}
	for _, p := range rekeyed {
		for i := 0; i < n; i++ {
			s.loops[i].Load().push(task{kind: tRekeyApp, app: p.id})
		}
	}
}

// closeApp closes the connections of a disabled (or removed) app. Loop only.
func (l *loopState) closeApp(id string) {
	for i := 0; i < len(l.conns); i++ {
		c := l.conns[i]
		if c.closed || c.state != stateOpen || c.app == nil || c.app.id != id {
			continue
		}
		c.app.refused[RefusedDisabled].Add(1)
		c.closeWith(proto.ClosePolicy, []byte("app disabled"))
	}
}

// rekeyApp sets again when each connection of an app whose secrets
// changed ends: a connection whose token a rotation's previous secret
// signed ends when that secret expires, unless it refreshed with a current
// one (op auth); the sweep closes it 1008 "token expired". Loop only.
func (l *loopState) rekeyApp(id string) {
	now := l.now()
	for i := 0; i < len(l.conns); i++ {
		c := l.conns[i]
		if c.closed || c.state != stateOpen || c.app == nil || c.app.id != id || c.rooms == nil {
			continue
		}
		cfg := c.app.cfg.Load()
		if cfg == nil {
			continue // gone: closeApp is on its way
		}
		c.rooms.retire(cfg, now)
		l.due[c.pos] = c.dueAt()
	}
}

// SetRemoteConns sets an app's connection count on the other nodes of the
// cluster (main refreshes it from Redis). Any goroutine.
func (s *Server) SetRemoteConns(app string, n int64) {
	if p := s.apps.lookup([]byte(app)); p != nil {
		p.remote.Store(n)
	}
}

// AppStat is one app's figures on this node.
type AppStat struct {
	Conns   int64
	Remote  int64 // connections on the other nodes, as last shared
	Refused [numRefusals]uint64
}

// AppStats calls fn for every app, ordered by id (metrics). Any goroutine.
func (s *Server) AppStats(fn func(app string, st *AppStat)) {
	s.apps.mu.RLock()
	ids := make([]string, 0, len(s.apps.byID))
	for id := range s.apps.byID {
		ids = append(ids, id)
	}
	s.apps.mu.RUnlock()
	sort.Strings(ids)
	var st AppStat
	for _, id := range ids {
		p := s.apps.lookup([]byte(id))
		st.Conns, st.Remote = p.conns.Load(), p.remote.Load()
		for i := range st.Refused {
			st.Refused[i] = p.refused[i].Load()
		}
		fn(id, &st)
	}
}

// AppConns calls fn for every app with its open WebSocket connections on
// this node. Any goroutine.
func (s *Server) AppConns(fn func(app string, conns int64)) {
	s.AppStats(func(id string, st *AppStat) { fn(id, st.Conns) })
}

// admitJoin applies the app's rooms-per-connection limit. Loop only.
func (c *conn) admitJoin() bool {
	max := c.l.srv.cfg.MaxRooms
	if cfg := c.app.cfg.Load(); cfg != nil {
		max = cfg.maxRooms
	}
	if max > 0 && c.m.Rooms()+c.m.Joining() >= max {
		c.app.refused[RefusedRoomLimit].Add(1)
		return false
	}
	return true
}

// admitPub applies the app's message size and publish rates to a pub, and
// answers the refusal itself. Loop only, allocation-free: the buckets are
// atomics shared with the other loops. The user's bucket is spent first,
// so one user over their own rate cannot drain the app's.
func (c *conn) admitPub(cmd *proto.Command) bool {
	cfg := c.app.cfg.Load()
	if cfg == nil {
		return true // the app left the registry: its close is on its way
	}
	if cfg.MaxMsg > 0 && int64(len(cmd.Body)) > cfg.MaxMsg {
		c.app.refused[RefusedTooLarge].Add(1)
		c.l.refusedFlood = true
		c.sendErr(cmd.ID, proto.CodeTooLarge, "message body larger than the app's max-msg")
		return false
	}
	if cfg.UserRate.Unlimited() && cfg.AppRate.Unlimited() {
		return true
	}
	now := tenancy.Now()
	if c.au != nil {
		if wait := c.au.pub.Take(now, cfg.UserRate); wait > 0 {
			c.app.refused[RefusedUserRate].Add(1)
			c.sendRateLimited(cmd.ID, "publish rate of this user exceeded: retry after retry_after ms", wait)
			return false
		}
	}
	if wait := c.app.pub.Take(now, cfg.AppRate); wait > 0 {
		c.app.refused[RefusedAppRate].Add(1)
		c.sendRateLimited(cmd.ID, "publish rate of this app exceeded: retry after retry_after ms", wait)
		return false
	}
	return true
}

func (c *conn) sendRateLimited(ref []byte, msg string, waitNS int64) {
	c.l.refusedFlood = true
	a := c.l.arena
	c.send(a.Keep(proto.AppendRateLimitedFrame(a.Space(96+6*len(ref)+len(msg)), ref, msg, tenancy.RetryAfterMS(waitNS))))
}
