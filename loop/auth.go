package loop

import (
	"bytes"
	"errors"
	"math"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/roost-chat/roost/fanout/proxy"
	"github.com/roost-chat/roost/proto"
)

// Limits are the node-wide defaults of the per-app limits; an app's entry
// in the registry overrides any of them. 0 turns a limit off.
type Limits struct {
	MaxConns     int64   // connections of one app on the whole cluster
	MaxUserConns int64   // connections of one user of an app on this node
	PubRate      float64 // publishes per second of one user (on this node)
	PubBurst     int64   // publishes one user may send at once
	AppPubRate   float64 // publishes per second of one app on this node; its burst is one second's worth
	MaxMsg       int64   // bytes of one pub body (too_large above)
	MaxPresence  int64   // presence subscribers of one room of an app, per node (0: no limit)
}

// DefaultLimits are limits no ordinary chat client reaches, and that every
// load test of docs/benchmarks.md stays under (in insecure mode the
// publish rates are off unless set: main clears them).
func DefaultLimits() Limits {
	return Limits{
		MaxConns:     1_000_000,
		MaxUserConns: 100,
		PubRate:      200,
		PubBurst:     400,
		AppPubRate:   50_000,
		MaxMsg:       64 << 10,
		MaxPresence:  10_000,
	}
}

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
	numRefusals
)

// RefusalNames label the refusal counters in metrics.
var RefusalNames = [numRefusals]string{"conn_limit", "user_conn_limit", "user_rate", "app_rate", "too_large", "room_limit", "auth", "disabled", "proxy", "presence_limit"}

// app is a tenant on this node. It lives as long as the node (the map only
// grows: registered apps, bounded first-use apps in insecure mode); its
// configuration is swapped whole when the registry changes.
type app struct {
	id  string
	cfg atomic.Pointer[appConfig] // nil: not registered (unknown to token checks)

	conns  atomic.Int64 // open WebSocket connections of this node (admitted)
	remote atomic.Int64 // the app's connections on the other nodes (shared through Redis)
	pubTAT atomic.Int64 // the app's publish bucket: theoretical arrival time, ns since monoEpoch

	mu    sync.Mutex
	users map[string]*appUser // users with a connection on this node, or a spent bucket
	// spent: users whose last connection ended with their bucket spent,
	// kept until it refills; pruneUsers visits these only, not every user
	// (15,000 idle users cost a map walk a second otherwise).
	spent []string

	refused [numRefusals]atomic.Uint64
}

// appUser is one user of an app on this node: its connections (under
// app.mu) and its publish bucket, shared by its connections on every loop.
type appUser struct {
	conns int64
	spent bool // in app.spent
	tat   atomic.Int64
}

// appConfig is an app's registry entry, resolved against the node's
// defaults. Immutable once stored.
type appConfig struct {
	secrets   [][]byte // current first; empty for a first-use app
	prevUntil time.Time
	disabled  bool

	maxConns, maxUserConns int64
	maxMsg                 int64
	maxRooms               int
	maxPresence            int
	// GCRA buckets: one publish per interval ns, tolerance ns of credit
	// ((burst-1) intervals). interval 0: unlimited.
	userInterval, userTolerance int64
	appInterval, appTolerance   int64
	// The app's proxy hooks; nil: not asked (proxy.go).
	connectProxy, publishProxy *proxy.Target
}

func resolve(lim Limits, maxRooms int, a *proto.App) *appConfig {
	o := &a.Limits
	i64 := func(p *int64, def int64) int64 {
		if p != nil {
			return *p
		}
		return def
	}
	f64 := func(p *float64, def float64) float64 {
		if p != nil {
			return *p
		}
		return def
	}
	c := &appConfig{
		disabled:     a.Disabled,
		prevUntil:    a.PreviousUntil,
		maxConns:     i64(o.MaxConns, lim.MaxConns),
		maxUserConns: i64(o.MaxUserConns, lim.MaxUserConns),
		maxMsg:       i64(o.MaxMsg, lim.MaxMsg),
		maxRooms:     appMaxRooms(o.MaxRooms, maxRooms),
		maxPresence:  int(i64(o.MaxPresence, lim.MaxPresence)),
	}
	for _, s := range a.Secrets(time.Now()) {
		if s != "" {
			c.secrets = append(c.secrets, []byte(s))
		}
	}
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
	c.userInterval, c.userTolerance = bucket(f64(o.PubRate, lim.PubRate), i64(o.PubBurst, lim.PubBurst))
	ar := f64(o.AppPubRate, lim.AppPubRate)
	c.appInterval, c.appTolerance = bucket(ar, int64(math.Ceil(ar)))
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

// bucket turns a rate and burst into GCRA terms.
func bucket(rate float64, burst int64) (interval, tolerance int64) {
	if !(rate > 0) {
		return 0, 0
	}
	interval = max(1, int64(float64(time.Second)/rate))
	return interval, (max(burst, 1) - 1) * interval
}

// take spends one publish from a GCRA bucket at now (ns since monoEpoch):
// 0 if allowed, else the ns to wait. Lock-free and allocation-free; a
// bucket is shared by the loops (an app's, a user's connections).
func take(tat *atomic.Int64, now, interval, tolerance int64) int64 {
	if interval == 0 {
		return 0
	}
	for {
		old := tat.Load()
		t := max(old, now)
		if wait := t - now - tolerance; wait > 0 {
			return wait
		}
		if tat.CompareAndSwap(old, t+interval) {
			return 0
		}
	}
}

// apps is the node's app registry: the configured and registered apps,
// and in insecure mode the apps made on first use, at most maxFirstUse of
// them so that a client cannot grow the map or the metric series without
// bound. Touched on upgrade and on registry changes only.
type apps struct {
	insecure    bool
	maxFirstUse int
	lim         Limits
	maxRooms    int
	static      map[string][]byte // --app-secret

	mu       sync.RWMutex
	byID     map[string]*app
	firstUse int
	pruned   atomic.Int64 // Unix ms of the last pruneUsers
}

func newApps(cfg *Config) *apps {
	a := &apps{insecure: cfg.Insecure, maxFirstUse: cfg.InsecureMaxApps, lim: cfg.Limits, maxRooms: cfg.MaxRooms,
		static: cfg.Apps, byID: make(map[string]*app)}
	a.set(nil)
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
	p := &app{id: string(id), users: make(map[string]*appUser)}
	p.cfg.Store(resolve(a.lim, a.maxRooms, &proto.App{ID: p.id}))
	a.byID[p.id] = p
	return p, nil
}

// set installs a new registry (registered apps; --app-secret entries fill
// in ids the registry does not hold). It returns the apps that became
// disabled or unknown, whose live connections must be closed.
func (a *apps) set(reg []proto.App) []*app {
	merged := make(map[string]*appConfig, len(reg)+len(a.static))
	for id, sec := range a.static {
		merged[id] = resolve(a.lim, a.maxRooms, &proto.App{ID: id, Secret: string(sec)})
	}
	for i := range reg {
		merged[reg[i].ID] = resolve(a.lim, a.maxRooms, &reg[i])
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	var gone []*app
	for id, cfg := range merged {
		p := a.byID[id]
		if p == nil {
			p = &app{id: id, users: make(map[string]*appUser)}
			a.byID[id] = p
		}
		old := p.cfg.Swap(cfg)
		if cfg.disabled && (old == nil || !old.disabled) {
			gone = append(gone, p)
		}
	}
	for id, p := range a.byID {
		if _, ok := merged[id]; ok {
			continue
		}
		old := p.cfg.Load()
		if old == nil || len(old.secrets) == 0 {
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
	return gone
}

// admit counts a new connection of user against the app's limits; it
// returns the refusal (a close reason) or "". On success c.user is
// counted and must be released by release.
func (p *app) admit(cfg *appConfig, user string) (*appUser, string) {
	n := p.conns.Add(1)
	if cfg.maxConns > 0 && n+p.remote.Load() > cfg.maxConns {
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
	if cfg.maxUserConns > 0 && u.conns >= cfg.maxUserConns {
		p.mu.Unlock()
		p.conns.Add(-1)
		p.refused[RefusedUserConnLimit].Add(1)
		return nil, "connection limit"
	}
	u.conns++
	p.mu.Unlock()
	return u, ""
}

// release forgets one admitted connection.
func (p *app) release(user string, u *appUser) {
	p.conns.Add(-1)
	p.mu.Lock()
	u.conns--
	if u.conns == 0 {
		if u.tat.Load() <= int64(time.Since(monoEpoch)) {
			// Its bucket is full again: nothing to remember.
			delete(p.users, user)
		} else if !u.spent {
			// A user who reconnects at once keeps a spent bucket;
			// pruneUsers drops it once full.
			u.spent = true
			p.spent = append(p.spent, user)
		}
	}
	p.mu.Unlock()
}

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
	now := int64(time.Since(monoEpoch))
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
			case u.tat.Load() <= now:
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
	expMS    int64 // Unix ms at which the token stops being accepted (exp + leeway)
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
	errNoToken    = &proto.HTTPError{Status: 401, Reason: "missing token: connect with /ws?token=JWT or Authorization: Bearer JWT"}
	errBadToken   = &proto.HTTPError{Status: 401, Reason: "malformed token"}
	errBadSig     = &proto.HTTPError{Status: 401, Reason: "token signature does not match the app's secret"}
	errExpired    = &proto.HTTPError{Status: 401, Reason: "token expired"}
	errNotYet     = &proto.HTTPError{Status: 401, Reason: "token not valid yet (nbf is in the future)"}
	errIssued     = &proto.HTTPError{Status: 401, Reason: "token issued in the future (iat): check the signer's clock"}
	errUnknown    = &proto.HTTPError{Status: 401, Reason: "unknown app"}
	errClaims     = &proto.HTTPError{Status: 401, Reason: "token lacks app, sub or exp"}
	errBadClaims  = &proto.HTTPError{Status: 401, Reason: "token app must match [A-Za-z0-9_.-]{1,64}"}
	errAlg        = &proto.HTTPError{Status: 401, Reason: "token algorithm must be HS256"}
	errDisabled   = &proto.HTTPError{Status: 403, Reason: "app disabled"}
	errNoUser     = &proto.HTTPError{Status: 400, Reason: "insecure mode needs ?user=NAME: 1 to 128 characters of UTF-8, no control characters"}
	errBadSub     = &proto.HTTPError{Status: 401, Reason: "token sub must be 1 to 128 characters of UTF-8, no control characters"}
	errBadAppID   = &proto.HTTPError{Status: 400, Reason: "app must match [A-Za-z0-9_.-]{1,64}"}
	errTwoTokens  = &proto.HTTPError{Status: 400, Reason: "give the token once: ?token= or Authorization: Bearer, not both"}
	errBadBearer  = &proto.HTTPError{Status: 401, Reason: "Authorization header must be Bearer JWT"}
	errKeyUnknown = errors.New("unknown app")
	errKeyClaims  = errors.New("claims")
	errKeySub     = errors.New("sub")
	errKeyMissing = errors.New("missing claims")
)

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
		v, he := s.verify(tok)
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

// verify checks a token: HS256 only, signed with a current secret of the
// app it names, app and sub well formed, exp required and in the future
// (fractions allowed), nbf and iat honoured when present, all within the
// node's leeway. Upgrade and refresh only: it allocates.
func (s *Server) verify(tok []byte) (verified, *proto.HTTPError) {
	var cl proto.TokenClaims
	var found *app
	t, err := s.jwt.ParseWithClaims(string(tok), &cl, func(t *jwt.Token) (any, error) {
		if cl.App == "" || cl.Subject == "" {
			return nil, errKeyMissing
		}
		if !proto.ValidAppID([]byte(cl.App)) {
			return nil, errKeyClaims
		}
		if !proto.ValidUser([]byte(cl.Subject)) {
			return nil, errKeySub
		}
		a := s.apps.lookup([]byte(cl.App))
		var cfg *appConfig
		if a != nil {
			cfg = a.cfg.Load()
		}
		if cfg == nil || len(cfg.secrets) == 0 {
			return nil, errKeyUnknown
		}
		found = a
		if len(cfg.secrets) == 1 || time.Now().After(cfg.prevUntil) {
			return cfg.secrets[0], nil
		}
		keys := jwt.VerificationKeySet{Keys: make([]jwt.VerificationKey, len(cfg.secrets))}
		for i, k := range cfg.secrets {
			keys.Keys[i] = k
		}
		return keys, nil
	})
	if err != nil {
		he := tokenError(t, err)
		if found != nil && he != errUnknown {
			found.refused[RefusedAuth].Add(1)
		}
		return verified{}, he
	}
	cfg := found.cfg.Load()
	if cfg == nil {
		return verified{}, errUnknown
	}
	if cfg.disabled {
		found.refused[RefusedDisabled].Add(1)
		return verified{}, errDisabled
	}
	exp := cl.ExpiresAt.Time
	return verified{app: found, sub: cl.Subject, exp: float64(exp.UnixNano()) / 1e9,
		rooms: &roomClaims{patterns: cl.Rooms, all: cl.Rooms == nil, expMS: exp.Add(s.cfg.Leeway).UnixMilli()}}, nil
}

// tokenError names what is wrong with a token, most specific first.
func tokenError(t *jwt.Token, err error) *proto.HTTPError {
	switch {
	case errors.Is(err, jwt.ErrTokenMalformed):
		return errBadToken
	case t != nil && t.Header["alg"] != "HS256":
		return errAlg
	case errors.Is(err, errKeyMissing), errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		return errClaims
	case errors.Is(err, errKeyClaims):
		return errBadClaims
	case errors.Is(err, errKeySub):
		return errBadSub
	case errors.Is(err, errKeyUnknown):
		return errUnknown
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
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

// newTokenParser accepts HS256 only: an HS512 or `none` token is refused
// before its signature is looked at.
func newTokenParser(leeway time.Duration) *jwt.Parser {
	return jwt.NewParser(jwt.WithValidMethods([]string{"HS256"}), jwt.WithLeeway(leeway),
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
	v, he := s.verify(tok)
	var why string
	switch {
	case he != nil:
		why = he.Reason
	case v.app != c.app:
		why = "token is for another app"
	case v.sub != c.user:
		why = "token is for another user"
	case c.rooms != nil && v.rooms.expMS <= c.rooms.expMS:
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

// SetApps installs the registry's apps (any goroutine): new connections see
// the change at once; the live connections of apps now disabled, or gone
// from the registry, are closed with 1008.
func (s *Server) SetApps(reg []proto.App) {
	gone := s.apps.set(reg)
	for _, p := range gone {
		n := int(s.nloops.Load())
		for i := 0; i < n; i++ {
			s.loops[i].Load().push(task{kind: tCloseApp, app: p.id})
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
	if cfg.maxMsg > 0 && int64(len(cmd.Body)) > cfg.maxMsg {
		c.app.refused[RefusedTooLarge].Add(1)
		c.l.refusedFlood = true
		c.sendErr(cmd.ID, proto.CodeTooLarge, "message body larger than the app's max-msg")
		return false
	}
	if cfg.userInterval == 0 && cfg.appInterval == 0 {
		return true
	}
	now := int64(time.Since(monoEpoch))
	if c.au != nil {
		if wait := take(&c.au.tat, now, cfg.userInterval, cfg.userTolerance); wait > 0 {
			c.app.refused[RefusedUserRate].Add(1)
			c.sendRateLimited(cmd.ID, "publish rate of this user exceeded: retry after retry_after ms", wait)
			return false
		}
	}
	if wait := take(&c.app.pubTAT, now, cfg.appInterval, cfg.appTolerance); wait > 0 {
		c.app.refused[RefusedAppRate].Add(1)
		c.sendRateLimited(cmd.ID, "publish rate of this app exceeded: retry after retry_after ms", wait)
		return false
	}
	return true
}

func (c *conn) sendRateLimited(ref []byte, msg string, waitNS int64) {
	c.l.refusedFlood = true
	a := c.l.arena
	c.send(a.Keep(proto.AppendRateLimitedFrame(a.Space(96+6*len(ref)+len(msg)), ref, msg, retryAfterMS(waitNS))))
}

// retryAfterMS rounds a wait up to whole milliseconds (at least 1).
func retryAfterMS(ns int64) int64 {
	return max(1, (ns+int64(time.Millisecond)-1)/int64(time.Millisecond))
}

// SignToken makes an HS256 token (tests and tools); it panics on a signing
// error, which HS256 with a non-empty secret cannot produce.
func SignToken(secret []byte, appID, sub string, exp time.Time, rooms []string) string {
	tok, err := proto.SignToken(secret, appID, sub, exp, rooms)
	if err != nil {
		panic("BUG: cannot sign a token: " + err.Error())
	}
	return tok
}
