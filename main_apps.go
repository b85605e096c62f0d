package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
)

var appUsage = fmt.Sprintf(appUsageText, appSetFlagLines())

const appUsageText = `Usage: roost app COMMAND [ID] [flags]

  create ID [limits]            register an app; prints {"app":"ID","secret":"..."}
  list                          every app as JSON (secrets masked)
  show ID                       one app as JSON (secrets masked)
  rotate ID [--keep-previous D] new secret (printed alone); the previous one stays valid for D (default 24h)
  disable ID                    refuse the app's clients; its live connections are closed (1008 app disabled)
  enable ID                     accept them again
  set ID [limits]               change limits and retention (create takes them too):
%s        (a value "default" returns to the node's default; 0 turns a limit off;
        roost app set -h says what each one is)

The registry: --database-url URL (PostgreSQL, also ROOST_DATABASE_URL or
DATABASE_URL) or --apps FILE (JSON, also ROOST_APPS). Running nodes see a
change within 2 s. stdout is for scripts (JSON, secrets), stderr for words.
`

// registryFlags are the flags every registry command takes.
type registryFlags struct {
	databaseURL, appsFile string
}

func (r *registryFlags) bind(fs *flag.FlagSet) {
	fs.StringVar(&r.databaseURL, "database-url", "", "PostgreSQL `url` holding the registry (default: ROOST_DATABASE_URL or DATABASE_URL)")
	fs.StringVar(&r.appsFile, "apps", "", "the registry as a JSON `FILE` (default: ROOST_APPS)")
}

// open returns the registry, and a function to release it.
func (r *registryFlags) open(ctx context.Context) (persist.Registry, func(), error) {
	if r.appsFile == "" {
		r.appsFile = os.Getenv("ROOST_APPS")
	}
	if r.databaseURL == "" && r.appsFile == "" {
		for _, name := range envNames("database-url") {
			if v, ok := os.LookupEnv(name); ok && v != "" {
				r.databaseURL = v
				break
			}
		}
	}
	switch {
	case r.appsFile != "":
		return persist.OpenAppFile(r.appsFile), func() {}, nil
	case r.databaseURL != "":
		pg, err := persist.OpenPostgres(ctx, r.databaseURL, persist.PGConfig{MaxConns: 2})
		if err != nil {
			return nil, nil, err
		}
		ok, err := pg.SchemaCurrent(ctx)
		if err == nil && !ok {
			err = errors.New("database schema is missing or outdated: run `roost migrate`")
		}
		if err != nil {
			pg.Close()
			return nil, nil, err
		}
		return pg, pg.Close, nil
	}
	return nil, nil, errors.New("no registry: give --database-url URL or --apps FILE (or ROOST_DATABASE_URL, ROOST_APPS)")
}

// limitFlags are the per-app settings of create and set; each stays nil
// unless given, and "default" clears an override.
type limitFlags struct {
	set map[string]string
}

var limitNames = []struct{ name, help string }{
	{"max-conns", "connections of the app on the whole cluster"},
	{"max-user-conns", "connections of one user on a node"},
	{"pub-rate", "publishes per second of one user"},
	{"pub-burst", "publishes one user may send at once"},
	{"app-pub-rate", "publishes per second of the app on a node"},
	{"max-msg", "largest message body in bytes"},
	{"max-rooms", "rooms one connection may join (only lowers the node's --max-rooms; 0: the node's)"},
	{"max-presence", "presence subscribers of one room, per node (joins with presence past it get err forbidden)"},
	{"signal-rate", "signals (typing, cursors) per second of one connection (0: no limit; node default --signal-rate)"},
	{"signal-burst", "signals one connection may send at once (node default --signal-burst)"},
	{"read-rate", "read, unread and receipts requests per second of one connection (0: no limit; node default --signal-rate)"},
	{"read-burst", "read, unread and receipts requests one connection may send at once (node default --signal-burst)"},
	{"keep-age", "retention: delete messages older than this (0: forever)"},
	{"keep-count", "retention: keep this many newest messages per room (at most the memory store's --keep; 0: all)"},
	{"max-token-ttl", "refuse tokens whose exp lies further ahead than this duration, such as 24h (0: no bound; node default --max-token-ttl, 7 days)"},
}

// identityNames say how the app's tokens are checked beyond its secret
// (docs/protocol.md, Identity from a provider).
var identityNames = []struct{ name, help string }{
	{"jwks-url", "verify tokens with the keys of this identity provider's JWKS `URL` (RS256, ES256, EdDSA) instead of the secret (\"none\": the secret again)"},
	{"public-key", "verify tokens with the PEM public key in `FILE` (RSA, ECDSA P-256 or Ed25519) instead of the secret (\"none\": the secret again)"},
	{"issuer", "tokens must carry this iss (\"none\": not checked)"},
	{"audience", "tokens' aud must hold this value (\"none\": not checked)"},
	{"user-claim", "the token claim naming the user (\"default\": sub)"},
}

// webhookNames are the webhook's settings, set like the limits.
var webhookNames = []struct{ name, help string }{
	{"webhook-url", "POST the app's messages to this http(s) `URL` (\"none\": no webhook)"},
	{"webhook-rooms", "only the messages of these rooms, comma-separated, `prefix*` allowed (\"\" or \"*\": every room)"},
	{"webhook-timeout", "bound of one webhook POST (default 5s, at most 1m)"},
	{"webhook-max-age", "how long a message is retried before it becomes a dead letter (default 24h; PostgreSQL keeps dead letters)"},
	{"webhook-events", "what the webhook receives, comma-separated: msg (messages), presence (joined, left), connection (online, offline) (default msg)"},
}

// proxyNames are the proxy hooks' settings (docs/protocol.md, Proxy hooks).
var proxyNames = []struct{ name, help string }{
	{"connect-proxy", "ask this http(s) `URL` before accepting a connection (\"none\": do not ask)"},
	{"publish-proxy", "ask this http(s) `URL` before accepting a publish (\"none\": do not ask)"},
	{"proxy-timeout", "bound of one proxy call (default 1s, at most 10s)"},
	{"proxy-fail", "what a proxy call that fails or times out does: open (accept) or closed (refuse, the default)"},
	{"proxy-inflight", "calls of the app in flight from one node at once, the connections its backend sees from each node (1 to 4096; \"default\": the node's --proxy-inflight)"},
}

func (l *limitFlags) bind(fs *flag.FlagSet) {
	l.set = map[string]string{}
	for _, n := range limitNames {
		fs.Func(n.name, n.help+` (a number; "default": the node's)`, func(v string) error {
			l.set[n.name] = v
			return nil
		})
	}
	for _, n := range append(append(webhookNames[:len(webhookNames):len(webhookNames)], proxyNames...), identityNames...) {
		fs.Func(n.name, n.help, func(v string) error {
			l.set[n.name] = v
			return nil
		})
	}
}

// applyWebhook writes the webhook settings given into a.
func (l *limitFlags) applyWebhook(a *proto.App) error {
	u, hasURL := l.set["webhook-url"]
	rooms, hasRooms := l.set["webhook-rooms"]
	to, hasTO := l.set["webhook-timeout"]
	age, hasAge := l.set["webhook-max-age"]
	evs, hasEvents := l.set["webhook-events"]
	if !hasURL && !hasRooms && !hasTO && !hasAge && !hasEvents {
		return nil
	}
	if hasURL && (u == "none" || u == "") {
		if hasRooms || hasTO || hasAge || hasEvents {
			return errors.New("--webhook-url none removes the webhook: give no other --webhook- flag with it")
		}
		a.Webhook = nil
		return nil
	}
	w := proto.Webhook{}
	if a.Webhook != nil {
		w = *a.Webhook
	}
	if hasURL {
		w.URL = u
	}
	if w.URL == "" && a.ID != "" { // the probe of the flags' values is a zero App
		return errors.New("the app has no webhook: give --webhook-url URL")
	}
	if hasRooms {
		w.Rooms = nil
		for _, r := range strings.Split(rooms, ",") {
			if r = strings.TrimSpace(r); r != "" && r != "*" {
				w.Rooms = append(w.Rooms, r)
			}
		}
	}
	if hasTO {
		d, err := time.ParseDuration(to)
		if err != nil {
			return fmt.Errorf("invalid --webhook-timeout %q: want a duration such as 5s", to)
		}
		w.Timeout = proto.Duration(d)
	}
	if hasAge {
		d, err := time.ParseDuration(age)
		if err != nil || d < 0 {
			return fmt.Errorf("invalid --webhook-max-age %q: want a duration such as 24h", age)
		}
		w.MaxAge = proto.Duration(d)
	}
	if hasEvents {
		events, err := parseWebhookEvents(evs)
		if err != nil {
			return err
		}
		w.Events = events
	}
	a.Webhook = &w
	return nil
}

// parseWebhookEvents reads --webhook-events: kinds in a canonical order,
// none for the default (msg alone), so that the registry holds one
// spelling of each setting.
func parseWebhookEvents(v string) ([]string, error) {
	kinds := []string{proto.WebhookEventMsg, proto.WebhookEventPresence, proto.WebhookEventConnection}
	given := map[string]bool{}
	for _, k := range strings.Split(v, ",") {
		k = strings.TrimSpace(k)
		if k == "" {
			continue
		}
		if !slices.Contains(kinds, k) {
			return nil, fmt.Errorf("invalid --webhook-events %q: want a comma-separated list of msg, presence, connection", v)
		}
		given[k] = true
	}
	if len(given) == 0 {
		return nil, fmt.Errorf("invalid --webhook-events %q: want at least one of msg, presence, connection", v)
	}
	if len(given) == 1 && given[proto.WebhookEventMsg] {
		return nil, nil
	}
	var out []string
	for _, k := range kinds {
		if given[k] {
			out = append(out, k)
		}
	}
	return out, nil
}

// applyProxy writes the proxy hook settings given into a; with neither
// URL left, the app has no proxy settings.
func (l *limitFlags) applyProxy(a *proto.App) error {
	p := proto.Proxy{}
	if a.Proxy != nil {
		p = *a.Proxy
	}
	given := false
	for _, k := range []struct {
		name string
		url  *string
	}{{"connect-proxy", &p.Connect}, {"publish-proxy", &p.Publish}} {
		if v, ok := l.set[k.name]; ok {
			given = true
			if v == "none" {
				v = ""
			}
			*k.url = v
		}
	}
	if v, ok := l.set["proxy-timeout"]; ok {
		given = true
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return fmt.Errorf("invalid --proxy-timeout %q: want a duration such as 1s", v)
		}
		p.Timeout = proto.Duration(d)
	}
	if v, ok := l.set["proxy-fail"]; ok {
		given = true
		switch v {
		case "open":
			p.FailOpen = true
		case "closed":
			p.FailOpen = false
		default:
			return fmt.Errorf("invalid --proxy-fail %q: want open or closed", v)
		}
	}
	if v, ok := l.set["proxy-inflight"]; ok {
		given = true
		if v == "default" {
			p.InFlight = 0
		} else if n, err := strconv.Atoi(v); err != nil || n < 1 || n > proto.MaxProxyInFlight {
			return fmt.Errorf("invalid --proxy-inflight %q: want 1 to %d or \"default\"", v, proto.MaxProxyInFlight)
		} else {
			p.InFlight = n
		}
	}
	if !given {
		return nil
	}
	if p.Connect == "" && p.Publish == "" {
		_, c := l.set["connect-proxy"]
		_, pu := l.set["publish-proxy"]
		if !c && !pu && a.ID != "" { // the probe of the flags' values is a zero App
			return errors.New("the app has no proxy hook: give --connect-proxy URL or --publish-proxy URL")
		}
		a.Proxy = nil
		return nil
	}
	a.Proxy = &p
	return nil
}

// applyIdentity writes the identity settings given into a; with none
// left, the app has no identity settings.
func (l *limitFlags) applyIdentity(a *proto.App) error {
	id := proto.Identity{}
	if a.Identity != nil {
		id = *a.Identity
	}
	given := false
	for _, k := range []struct {
		name, off string
		p         *string
	}{{"jwks-url", "none", &id.JWKSURL}, {"issuer", "none", &id.Issuer}, {"audience", "none", &id.Audience}, {"user-claim", "default", &id.UserClaim}} {
		if v, ok := l.set[k.name]; ok {
			given = true
			if v == k.off {
				v = ""
			}
			*k.p = v
		}
	}
	if f, ok := l.set["public-key"]; ok {
		given = true
		if _, both := l.set["jwks-url"]; both && f != "none" && id.JWKSURL != "" {
			return errors.New("give --jwks-url or --public-key, not both")
		}
		id.PublicKey = ""
		if f != "none" {
			b, err := os.ReadFile(f)
			if err != nil {
				return fmt.Errorf("cannot read --public-key: %w", err)
			}
			if _, err := proto.ParsePublicKey(string(b)); err != nil {
				return fmt.Errorf("invalid --public-key %s: %w", f, err)
			}
			id.PublicKey, id.JWKSURL = string(b), ""
		}
	} else if v, ok := l.set["jwks-url"]; ok && v != "none" {
		id.PublicKey = "" // one source of keys: the URL replaces a key file
	}
	if !given {
		return nil
	}
	if id == (proto.Identity{}) {
		a.Identity = nil
		return nil
	}
	a.Identity = &id
	return nil
}

// apply writes the given limits into a.
func (l *limitFlags) apply(a *proto.App) error {
	if err := l.applyWebhook(a); err != nil {
		return err
	}
	if err := l.applyProxy(a); err != nil {
		return err
	}
	if err := l.applyIdentity(a); err != nil {
		return err
	}
	for name, v := range l.set {
		if strings.HasPrefix(name, "webhook-") || strings.Contains(name, "proxy") || isIdentityFlag(name) {
			continue
		}
		def := v == "default"
		bad := func(want string) error { return fmt.Errorf("invalid --%s %q: want %s or \"default\"", name, v, want) }
		switch name {
		case "pub-rate", "app-pub-rate", "signal-rate", "read-rate":
			var p *float64
			if !def {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil || !(f >= 0) || math.IsInf(f, 0) {
					return bad("events per second (0: no limit)")
				}
				p = &f
			}
			switch name {
			case "pub-rate":
				a.Limits.PubRate = p
			case "app-pub-rate":
				a.Limits.AppPubRate = p
			case "signal-rate":
				a.Limits.SignalRate = p
			case "read-rate":
				a.Limits.ReadRate = p
			}
		case "max-token-ttl":
			var p *proto.Duration
			if !def {
				d, err := time.ParseDuration(v)
				if err != nil || d < 0 {
					return bad("a duration such as 24h (0: no bound)")
				}
				p = (*proto.Duration)(&d)
			}
			a.Limits.MaxTokenTTL = p
		case "keep-age":
			d := time.Duration(0)
			if !def {
				var err error
				if d, err = time.ParseDuration(v); err != nil || d < 0 {
					return bad("a duration such as 720h (0: forever)")
				}
			}
			a.KeepAge = proto.Duration(d)
		case "keep-count":
			n := 0
			if !def {
				var err error
				if n, err = strconv.Atoi(v); err != nil || n < 0 {
					return bad("a whole number (0: all)")
				}
			}
			a.KeepCount = n
		default:
			var p *int64
			if !def {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil || n < 0 {
					return bad("a whole number (0: no limit)")
				}
				p = &n
			}
			switch name {
			case "max-conns":
				a.Limits.MaxConns = p
			case "max-user-conns":
				a.Limits.MaxUserConns = p
			case "pub-burst":
				a.Limits.PubBurst = p
			case "max-msg":
				a.Limits.MaxMsg = p
			case "max-rooms":
				a.Limits.MaxRooms = p
			case "max-presence":
				a.Limits.MaxPresence = p
			case "signal-burst", "read-burst":
				if p != nil && *p < 1 {
					return bad("a whole number of at least 1")
				}
				if name == "signal-burst" {
					a.Limits.SignalBurst = p
				} else {
					a.Limits.ReadBurst = p
				}
			}
		}
	}
	return nil
}

func isIdentityFlag(name string) bool {
	for _, n := range identityNames {
		if n.name == name {
			return true
		}
	}
	return false
}

// newSecret is 32 random bytes, base64url: 256 bits for HS256.
func newSecret() string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("BUG: no randomness: " + err.Error())
	}
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// maskSecret keeps the last 4 characters, enough to tell two secrets apart.
func maskSecret(s string) string {
	if s == "" {
		return ""
	}
	if len(s) < 24 {
		return "*****"
	}
	return "*****" + s[len(s)-4:]
}

// appView is an app as list and show print it.
type appView struct {
	App            string          `json:"app"`
	Secret         string          `json:"secret"`
	PreviousSecret string          `json:"previous_secret,omitempty"`
	PreviousUntil  *time.Time      `json:"previous_until,omitempty"`
	Enabled        bool            `json:"enabled"`
	Limits         proto.AppLimits `json:"limits"`
	KeepAge        string          `json:"keep_age,omitempty"`
	KeepCount      int             `json:"keep_count,omitempty"`
	Created        *time.Time      `json:"created,omitempty"`
	Webhook        *proto.Webhook  `json:"webhook,omitempty"`
	Proxy          *proto.Proxy    `json:"proxy,omitempty"`
	Identity       *proto.Identity `json:"identity,omitempty"`
}

func viewOf(a *proto.App) appView {
	v := appView{App: a.ID, Secret: maskSecret(a.Secret), Enabled: !a.Disabled, Limits: a.Limits, KeepCount: a.KeepCount, Webhook: a.Webhook, Proxy: a.Proxy, Identity: a.Identity}
	if a.PreviousSecret != "" && time.Now().Before(a.PreviousUntil) {
		v.PreviousSecret = maskSecret(a.PreviousSecret)
		u := a.PreviousUntil
		v.PreviousUntil = &u
	}
	if a.KeepAge > 0 {
		v.KeepAge = time.Duration(a.KeepAge).String()
	}
	if !a.Created.IsZero() {
		c := a.Created
		v.Created = &c
	}
	return v
}

func printJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// splitPositional separates positional arguments from flags, so that
// `roost app set ID --max-conns 5` and `roost app set --max-conns 5 ID`
// both work (the flag package stops at the first non-flag).
func splitPositional(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

func appMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, appUsage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("roost app "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, appUsage+"\nFlags of roost app "+sub+":\n")
		fs.PrintDefaults()
	}
	var rf registryFlags
	rf.bind(fs)
	var lf limitFlags
	keep := 24 * time.Hour
	switch sub {
	case "create", "set":
		lf.bind(fs)
	case "rotate":
		fs.DurationVar(&keep, "keep-previous", keep, "how long the previous secret stays valid (0: not at all)")
	case "list", "show", "disable", "enable":
	default:
		fmt.Fprintf(stderr, "roost app: unknown command %q\n\n%s", sub, appUsage)
		return 2
	}
	pos, err := splitPositional(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	want := 1
	if sub == "list" {
		want = 0
	}
	if len(pos) != want {
		if want == 0 {
			fmt.Fprintf(stderr, "roost app list: unexpected argument %q\n", pos[0])
		} else {
			fmt.Fprintf(stderr, "roost app %s: want one app ID, got %d arguments\n", sub, len(pos))
		}
		return 2
	}
	var id string
	if want == 1 {
		id = pos[0]
		if !proto.ValidAppID([]byte(id)) {
			fmt.Fprintf(stderr, "roost app %s: invalid app ID %q: want [A-Za-z0-9_.-]{1,64}\n", sub, id)
			return 2
		}
	}
	if keep < 0 {
		fmt.Fprintln(stderr, "roost app rotate: invalid --keep-previous: want 0 or more")
		return 2
	}
	// A limit value is checked before the registry is touched.
	var probe proto.App
	if err := lf.apply(&probe); err != nil {
		fmt.Fprintf(stderr, "roost app %s: %v\n", sub, err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reg, closeReg, err := rf.open(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "roost app %s: %v\n", sub, err)
		return 2
	}
	defer closeReg()
	fail := func(err error) int {
		fmt.Fprintf(stderr, "roost app %s: %v\n", sub, err)
		if errors.Is(err, persist.ErrNoApp) || errors.Is(err, persist.ErrAppExists) {
			return 1
		}
		return 1
	}
	switch sub {
	case "create":
		a := proto.App{ID: id, Secret: newSecret()}
		if err := lf.apply(&a); err != nil {
			return fail(err)
		}
		if err := reg.CreateApp(ctx, a); err != nil {
			return fail(err)
		}
		if err := printJSON(stdout, map[string]string{"app": id, "secret": a.Secret}); err != nil {
			return fail(err)
		}
		fmt.Fprintf(stderr, "roost app create: app %s registered; the secret is shown this once (roost app rotate makes a new one)\n", id)
	case "list":
		apps, err := reg.Apps(ctx)
		if err != nil {
			return fail(err)
		}
		views := make([]appView, 0, len(apps))
		for i := range apps {
			views = append(views, viewOf(&apps[i]))
		}
		if err := printJSON(stdout, views); err != nil {
			return fail(err)
		}
	case "show":
		apps, err := reg.Apps(ctx)
		if err != nil {
			return fail(err)
		}
		for i := range apps {
			if apps[i].ID == id {
				if err := printJSON(stdout, viewOf(&apps[i])); err != nil {
					return fail(err)
				}
				return 0
			}
		}
		return fail(fmt.Errorf("app %s: %w", id, persist.ErrNoApp))
	case "rotate":
		secret := newSecret()
		a, err := reg.UpdateApp(ctx, id, func(a *proto.App) error {
			if keep > 0 {
				a.PreviousSecret, a.PreviousUntil = a.Secret, time.Now().Add(keep).UTC()
			} else {
				a.PreviousSecret, a.PreviousUntil = "", time.Time{}
			}
			a.Secret = secret
			return nil
		})
		if err != nil {
			return fail(err)
		}
		fmt.Fprintln(stdout, a.Secret)
		if keep > 0 {
			fmt.Fprintf(stderr, "roost app rotate: new secret for %s; the previous one stays valid until %s\n", id, a.PreviousUntil.Format(time.RFC3339))
		} else {
			fmt.Fprintf(stderr, "roost app rotate: new secret for %s; the previous one is no longer valid\n", id)
		}
	case "disable", "enable":
		if _, err := reg.UpdateApp(ctx, id, func(a *proto.App) error {
			a.Disabled = sub == "disable"
			return nil
		}); err != nil {
			return fail(err)
		}
		if sub == "disable" {
			fmt.Fprintf(stderr, "roost app disable: %s disabled; nodes close its connections within 2 s\n", id)
		} else {
			fmt.Fprintf(stderr, "roost app enable: %s enabled\n", id)
		}
	case "set":
		if len(lf.set) == 0 {
			fmt.Fprintln(stderr, "roost app set: nothing to set: give a limit flag (roost app set -h)")
			return 2
		}
		a, err := reg.UpdateApp(ctx, id, lf.apply)
		if err != nil {
			return fail(err)
		}
		if err := printJSON(stdout, viewOf(&a)); err != nil {
			return fail(err)
		}
	}
	return 0
}

// tokenMain is `roost token`: it prints a client token alone, for scripts.
func tokenMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("roost token", flag.ContinueOnError)
	fs.SetOutput(stderr)
	appID := fs.String("app", "", "app `ID` (required)")
	user := fs.String("user", "", "user id, the token's sub (required)")
	ttl := fs.Duration("ttl", time.Hour, "how long the token is valid")
	rooms := fs.String("rooms", "", "rooms the user may join and publish to, comma-separated, `prefix*` allowed (default: every room)")
	secret := fs.String("secret", "", "the app's `SECRET` (prefer ROOST_SECRET or --secret-file: the command line is visible to every user)")
	secretFile := fs.String("secret-file", "", "read the secret from `FILE`")
	var rf registryFlags
	rf.bind(fs)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: roost token --app A --user U [--ttl 1h] [--rooms 'a,b*'] with --secret-file F, ROOST_SECRET, --secret S, or the registry (--database-url, --apps)")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "roost token: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	switch {
	case !proto.ValidAppID([]byte(*appID)):
		fmt.Fprintln(stderr, "roost token: give --app ID ([A-Za-z0-9_.-]{1,64})")
		return 2
	case *user == "" || len(*user) > 128:
		fmt.Fprintln(stderr, "roost token: give --user ID (1 to 128 bytes)")
		return 2
	case *ttl <= 0:
		fmt.Fprintln(stderr, "roost token: --ttl must be positive")
		return 2
	}
	var roomList []string
	if *rooms != "" {
		for _, r := range strings.Split(*rooms, ",") {
			r = strings.TrimSpace(r)
			if !proto.ValidRoom([]byte(strings.TrimSuffix(r, "*"))) && r != "*" {
				fmt.Fprintf(stderr, "roost token: invalid room %q in --rooms: want [A-Za-z0-9_.:-]{1,128}, optionally ending in *\n", r)
				return 2
			}
			roomList = append(roomList, r)
		}
	}
	sec := *secret
	if *secretFile != "" {
		b, err := os.ReadFile(*secretFile)
		if err != nil {
			fmt.Fprintln(stderr, "roost token: cannot read --secret-file:", err)
			return 2
		}
		sec = strings.TrimSpace(string(b))
	}
	if sec == "" {
		sec = os.Getenv("ROOST_SECRET")
	}
	// The bound nodes hold tokens to: the node default unless the
	// registry says the app's own.
	maxTTL, from := proto.DefaultMaxTokenTTL, "the nodes' default --max-token-ttl"
	if sec == "" {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		reg, closeReg, err := rf.open(ctx)
		if err != nil {
			fmt.Fprintln(stderr, "roost token: no secret: give --secret-file, ROOST_SECRET or --secret, or a registry;", err)
			return 2
		}
		defer closeReg()
		apps, err := reg.Apps(ctx)
		if err != nil {
			fmt.Fprintln(stderr, "roost token:", err)
			return 1
		}
		for i := range apps {
			if apps[i].ID == *appID {
				sec = apps[i].Secret
				if t := apps[i].Limits.MaxTokenTTL; t != nil {
					maxTTL, from = time.Duration(*t), "the app's --max-token-ttl"
				}
				if apps[i].Disabled {
					// The token is still made (for a test, or ready for
					// enable); a script that hands it out should know.
					fmt.Fprintf(stderr, "roost token: warning: app %s is disabled: nodes refuse its clients (403 app disabled) until roost app enable %s\n", *appID, *appID)
				}
			}
		}
		if sec == "" {
			fmt.Fprintf(stderr, "roost token: app %s is not in the registry\n", *appID)
			return 1
		}
	}
	if maxTTL > 0 && *ttl > maxTTL {
		// Still made (a node may run with another bound), but said.
		fmt.Fprintf(stderr, "roost token: warning: --ttl %s is beyond %s (%s): nodes refuse such a token with 401\n", *ttl, from, maxTTL)
	}
	tok, err := proto.SignToken([]byte(sec), *appID, *user, time.Now().Add(*ttl), roomList)
	if err != nil {
		fmt.Fprintln(stderr, "roost token:", err)
		return 1
	}
	fmt.Fprintln(stdout, tok)
	return 0
}
