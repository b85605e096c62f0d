package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/roost-chat/roost/fanout"
	"github.com/roost-chat/roost/fanout/api"
	"github.com/roost-chat/roost/loop"
	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
	"github.com/roost-chat/roost/pubsub"
	"github.com/roost-chat/roost/tuning"
)

// config is everything serve reads from flags, the environment and the
// config file.
type config struct {
	node       loop.Config
	admin      string
	api        string
	apiRate    float64
	apiBurst   int
	appSecrets string
	// appSecretFile holds APP=SECRET lines (secrets kept off the command
	// line); appsFile is the JSON app registry of a node without a database.
	appSecretFile string
	appsFile      string
	// impliedInsecure: no --app-secret on a loopback listener, so the node
	// runs in development mode without --insecure having been given.
	impliedInsecure bool
	keep            int
	memStoreMax     string
	memStoreMaxN    int64 // memStoreMax parsed
	maxAppRooms     int
	presenceGrace   time.Duration
	presenceLease   time.Duration
	retMaxAge       time.Duration
	retMaxCount     int
	appRetention    string
	retInterval     time.Duration
	retention       persist.RetentionPolicy // parsed from the four above
	databaseURL     string
	migrate         bool
	pgMaxConns      int
	stmtTimeout     time.Duration
	webhookLease    time.Duration
	webhookBacklog  string
	webhookBacklogN int64 // webhookBacklog parsed, or its default
	workers         int
	batchMax        int
	batchWindow     time.Duration
	queueLen        int
	redisURL        string
	drain           time.Duration
	logLevel        string
	logFormat       string
	memLimit        string
	memLimitN       int64 // memLimit parsed; 0 = from the cgroup
	connTarget      int

	configFile  string
	printConfig bool

	// The server API listener's budget (fanout/api.Edge), and the admin
	// listener's Bearer token.
	apiMaxConns, apiAppMaxConns, apiAppInFlight int
	adminToken                                  string

	// environ lists the environment for the misspelling check (os.Environ
	// in serve; nil skips the check).
	environ func() []string
	// readFile reads --app-secret-file (os.ReadFile; tests pass their own).
	readFile func(string) ([]byte, error)

	// source names where each setting came from, by flag name: "default",
	// "flag", "env ROOST_X" or "file PATH:LINE".
	source map[string]string
}

// env is how configuration reads the environment (os.LookupEnv; tests
// pass a map).
type envLookup func(string) (string, bool)

// envNames are the variables read for a flag, first found wins: ROOST_ and
// the flag name in upper case with _ for -, plus the conventional names of
// the two URLs and the plural the loop's error message has always named.
func envNames(flagName string) []string {
	names := []string{"ROOST_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))}
	switch flagName {
	case "database-url":
		names = append(names, "DATABASE_URL")
	case "redis-url":
		names = append(names, "REDIS_URL")
	case "app-secret":
		names = append(names, "ROOST_APP_SECRETS")
	}
	return names
}

func flags(c *config, fs *flag.FlagSet) {
	d := loop.Defaults()
	c.node = d
	fs.StringVar(&c.configFile, "config", "", "read settings from `FILE` (key = value lines, flag names as keys, # comments)")
	fs.BoolVar(&c.printConfig, "print-config", false, "print the effective configuration (secrets masked) and where each setting came from, then exit")
	fs.StringVar(&c.node.Listen, "listen", d.Listen, "client listener `host:port`")
	fs.BoolVar(&c.node.Insecure, "insecure", false, "development mode: /ws?user=NAME&app=APP without a token, apps made on first use, demo page at /; loopback only")
	fs.IntVar(&c.node.MaxFrame, "max-frame", d.MaxFrame, "largest client message in `bytes`; larger ones are closed with 1009")
	fs.IntVar(&c.node.OutboundLimit, "outbound-limit", d.OutboundLimit, "`bytes` queued for one connection before it is closed as a slow consumer (1013)")
	fs.DurationVar(&c.node.IdleInterval, "idle", d.IdleInterval, "server ping after this much silence; close after twice")
	fs.IntVar(&c.node.Loops, "loops", runtime.GOMAXPROCS(0), "event loops (default: GOMAXPROCS, i.e. usable CPUs after the cgroup CPU quota)")
	fs.DurationVar(&c.node.FlushInterval, "flush", d.FlushInterval, "outbound batching tick: frames for a connection are written once per tick")
	fs.DurationVar(&c.node.UpgradeTimeout, "upgrade-timeout", d.UpgradeTimeout, "time allowed for the HTTP upgrade")
	fs.IntVar(&c.node.MaxRooms, "max-rooms", d.MaxRooms, "rooms one connection may join")
	fs.IntVar(&c.node.MaxConns, "max-conns", 0, "client connections held at once, upgraded or not; past it a connection is closed at accept (default: the open-file limit minus a reserve for the store, broker, admin listener and files)")
	fs.IntVar(&c.node.MaxConnsPerIP, "max-conns-per-ip", 0, "client connections of one source address; past it a connection is closed at accept (0: no cap; behind a proxy or load balancer leave 0 unless --proxy-protocol or --trusted-proxies names the client)")
	fs.BoolVar(&c.node.ProxyProtocol, "proxy-protocol", false, "every client connection starts with a PROXY protocol header (v1 or v2: HAProxy send-proxy-v2, nginx proxy_protocol, AWS NLB) naming the client; one that does not is closed (set only when every connection comes through such a proxy)")
	fs.Var(&c.node.TrustedProxies, "trusted-proxies", "`CIDRS` (comma-separated, e.g. 10.0.0.0/8,192.0.2.7) of proxies whose X-Forwarded-For and X-Real-IP name the client, on the client listener's upgrade requests and the server API (default: nobody's)")
	fs.BoolVar(&c.node.ReusePort, "reuse-port", false, "share the client port with other processes (SO_REUSEPORT); without it a port in use fails the start with \"address already in use\"")
	fs.BoolVar(&c.node.IOURing, "io-uring", d.IOURing, "write the one-frame output of a flush in batches through io_uring (Linux 5.12+; where the kernel refuses it, one send(2) per frame as with false)")
	fs.IntVar(&c.node.Readers, "readers", d.Readers, "goroutines doing store reads (join catch-up, history, gap repair)")
	fs.IntVar(&c.node.ReadQueue, "read-queue", d.ReadQueue, "store reads waiting for a reader; past it a history, presence or gap-repair read is answered overloaded and a join's catch-up waits for the next tick (raise it when roost_catchups_deferred_total grows in reconnect storms and the database has room)")
	fs.DurationVar(&c.node.GapWindow, "gap-window", d.GapWindow, "how long a missing seq is awaited before it is read from the store")
	fs.DurationVar(&c.node.RetryMin, "retry-min", d.RetryMin, "shortest reconnect hint (retry=MS) of 1013 and drain closes")
	fs.DurationVar(&c.node.RetryMax, "retry-max", d.RetryMax, "longest reconnect hint; hints are drawn from [retry-min, retry-max)")
	fs.DurationVar(&c.node.SSEMaxAge, "sse-max-age", 0, "end an SSE stream after about this long (jittered by up to a tenth), with a jittered retry hint, so that long-lived listeners spread over nodes added since (0: never)")
	fs.IntVar(&c.node.InboxLimit, "inbox-limit", d.InboxLimit, "tasks queued for one event loop before its new publishes get err overloaded and deliveries to it are read from the store instead")
	fs.IntVar(&c.node.ProxyInFlight, "proxy-inflight", d.ProxyInFlight, "proxy hook calls of one app in flight from this node at once: the HTTP connections its backend sees from the node")
	fs.IntVar(&c.node.ProxyQueue, "proxy-queue", d.ProxyQueue, "proxy hook calls of one app waiting for one of its --proxy-inflight slots; past it a call is not made and the app's --proxy-fail mode answers")
	fs.DurationVar(&c.node.ShedAfter, "shed-after", d.ShedAfter, "answer new publishes err overloaded while an event loop's publishes take longer than this from read to commit (0: never)")
	fs.StringVar(&c.node.NodeID, "node-id", "", "this node's name for operators and clients (X-Roost-Node header, /healthz, metrics, logs); default HOSTNAME:PORT")
	fs.StringVar(&c.admin, "admin", "127.0.0.1:6060", "admin listener `host:port` (/debug/pprof/, /healthz, /readyz, /metrics); \"off\" disables")
	fs.StringVar(&c.api, "api", "127.0.0.1:8090", "server API listener `host:port` (HTTP JSON for apps' backends: publish, history, rooms, disconnect); \"off\" disables")
	fs.Float64Var(&c.apiRate, "api-rate", 1000, "server API requests per second of one app on this node, all routes together (429 rate_limited above; 0: no limit)")
	fs.IntVar(&c.apiBurst, "api-burst", 2000, "server API requests one app may make at once above --api-rate")
	fs.IntVar(&c.apiMaxConns, "api-max-conns", api.DefaultMaxConns, "server API connections all apps together hold on this node (a connection is an app's from its first request with a valid secret); past it 503 overloaded. As many again may wait for their first answer")
	fs.IntVar(&c.apiAppMaxConns, "api-app-max-conns", api.DefaultAppMaxConns, "server API connections one app holds on this node, at most half of --api-max-conns; past it 429 rate_limited and the connection is closed")
	fs.IntVar(&c.apiAppInFlight, "api-app-inflight", api.DefaultAppInFlight, "server API requests of one app answered at once on this node; past it 429 rate_limited")
	fs.StringVar(&c.adminToken, "admin-token", "", "Bearer `TOKEN` the admin listener asks for on /metrics and /debug/pprof/ (/healthz and /readyz stay open); give it in ROOST_ADMIN_TOKEN, not on the command line")
	fs.StringVar(&c.appSecrets, "app-secret", "", "HS256 secrets of apps, `APP=SECRET[,APP=SECRET...]`; give it in ROOST_APP_SECRET or --app-secret-file, never on the command line (ps shows it)")
	fs.StringVar(&c.appSecretFile, "app-secret-file", "", "read app secrets from `FILE`: APP=SECRET lines, # comments")
	fs.StringVar(&c.appsFile, "apps", "", "the app registry in a JSON `FILE` (roost app create --apps FILE); re-read on SIGHUP and when it changes. Without it, a node with --database-url keeps the registry in PostgreSQL")
	fs.DurationVar(&c.node.Leeway, "token-leeway", d.Leeway, "clock skew allowed on a token's exp, nbf and iat")
	fs.DurationVar(&c.node.Limits.MaxTokenTTL, "max-token-ttl", d.Limits.MaxTokenTTL, "default bound on how far ahead a token's exp may lie; tokens beyond it get 401 (per app: roost app set --max-token-ttl; 0: no bound)")
	fs.DurationVar(&c.node.JWKSRefresh, "jwks-refresh", loop.DefaultJWKSRefresh, "how often the JWKS of an app with --jwks-url is fetched again (a token naming a kid the set lacks asks for one fetch sooner)")
	fs.IntVar(&c.node.InsecureMaxApps, "insecure-max-apps", d.InsecureMaxApps, "insecure mode: apps made on first use at most (each is a metric series); then refused (0: no cap)")
	fs.Int64Var(&c.node.Limits.MaxConns, "app-max-conns", d.Limits.MaxConns, "default connections of one app on the whole cluster (shared through Redis when configured; 0: no limit)")
	fs.Int64Var(&c.node.Limits.MaxUserConns, "user-max-conns", d.Limits.MaxUserConns, "default connections of one user of an app on this node (0: no limit)")
	fs.Float64Var(&c.node.Limits.PubRate, "pub-rate", d.Limits.PubRate, "default publishes per second of one user (0: no limit; insecure mode: no limit unless set)")
	fs.Int64Var(&c.node.Limits.PubBurst, "pub-burst", d.Limits.PubBurst, "default publishes one user may send at once above --pub-rate")
	fs.Float64Var(&c.node.Limits.AppPubRate, "app-pub-rate", d.Limits.AppPubRate, "default publishes per second of one app on this node (0: no limit; insecure mode: no limit unless set)")
	fs.Float64Var(&c.node.SignalRate, "signal-rate", d.SignalRate, "signals (typing, cursors) per second of one connection, and read/unread/receipts requests in a bucket of their own; past it err rate_limited (0: no limit)")
	fs.IntVar(&c.node.SignalBurst, "signal-burst", d.SignalBurst, "signals one connection may send at once above --signal-rate")
	fs.Int64Var(&c.node.Limits.MaxPresence, "max-presence", d.Limits.MaxPresence, "default presence subscribers (joins with \"presence\":true) of one room of an app on this node; past it such a join gets err forbidden (0: no limit)")
	fs.DurationVar(&c.presenceGrace, "presence-grace", fanout.DefaultPresenceGrace, "a user leaves a room's presence only after this long with no connection in it, so a page reload does not flap")
	fs.DurationVar(&c.presenceLease, "presence-lease", pubsub.DefaultPresenceLease, "with Redis: a node silent this long is dead and its users leave every room's presence")
	fs.Int64Var(&c.node.Limits.MaxMsg, "max-msg", d.Limits.MaxMsg, "default largest pub body in `bytes` (err too_large above; 0: only --max-frame)")
	fs.StringVar(&c.memStoreMax, "memory-store-max", "512MiB", "memory store's byte budget (e.g. 256MiB; 0: none): past it the rooms written least recently lose their oldest messages first")
	fs.IntVar(&c.maxAppRooms, "max-rooms-per-app", 100000, "rooms one app may have, in memory and in PostgreSQL; a publish or join that would make one more gets err forbidden (0: no bound)")
	fs.IntVar(&c.keep, "keep", 1000, "memory store's retention: newest messages kept per room for since and history (the retention flags may keep fewer)")
	fs.DurationVar(&c.retMaxAge, "retention-max-age", 0, "delete messages older than this, in every app without its own --app-retention (0: no age limit)")
	fs.IntVar(&c.retMaxCount, "retention-max-count", 0, "keep only the newest N messages per room, in every app without its own --app-retention (0: no count limit)")
	fs.StringVar(&c.appRetention, "app-retention", "", "per-app retention, `APP=MAXAGE/MAXCOUNT[,...]` (e.g. chat=720h/0,audit=0/100000; 0: no limit of that kind); overrides the defaults above for APP")
	fs.DurationVar(&c.retInterval, "retention-interval", time.Minute, "how often retention runs")
	fs.StringVar(&c.databaseURL, "database-url", "", "PostgreSQL `url`; empty keeps messages in memory")
	fs.BoolVar(&c.migrate, "migrate", false, "apply pending schema migrations before serving")
	fs.IntVar(&c.pgMaxConns, "pg-max-conns", 0, "PostgreSQL connections (default: 4 × publish workers + 4)")
	fs.DurationVar(&c.stmtTimeout, "statement-timeout", 5*time.Second, "PostgreSQL statement timeout")
	fs.DurationVar(&c.webhookLease, "webhook-lease", 30*time.Second, "with PostgreSQL, how long a node's claim on a room's webhook delivery lasts unless renewed: another node takes a crashed node's rooms after this")
	fs.StringVar(&c.webhookBacklog, "webhook-backlog", "", "bytes of owed webhook events held in memory, all apps (default: a quarter of --memory-store-max, 128MiB without one): without a database, past it the app holding the most loses its oldest owed events (roost_webhook_dropped_total); with PostgreSQL, the rest is read back from the store")
	fs.IntVar(&c.workers, "publish-workers", 1, "publish goroutines, each committing a shard of rooms with one commit in flight (raise it only when one PostgreSQL backend is the limit)")
	fs.IntVar(&c.batchMax, "batch-max", 256, "publishes per group commit")
	fs.DurationVar(&c.batchWindow, "batch-window", 10*time.Millisecond, "the longest a PostgreSQL group commit smaller than 48 publishes may wait for more, from its first publish: all of it where the window brings 48 at the rate its worker sees, else the share it brings (1,500/s: 15 of 48, ~2.5ms), none where no publish is due (0: no wait; the memory store never waits)")
	fs.IntVar(&c.queueLen, "publish-queue", 8192, "publishes queued per worker before clients get err overloaded")
	fs.StringVar(&c.redisURL, "redis-url", "", "Redis `url` (redis://host:port, several comma-separated seeds for a cluster); empty: in-process broker")
	fs.DurationVar(&c.drain, "drain", 10*time.Second, "on SIGTERM, spread the closing of connections over this window")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&c.logFormat, "log-format", "text", "text or json")
	fs.StringVar(&c.memLimit, "memory-limit", "", "Go memory limit (e.g. 400MiB); default: cgroup limit minus headroom")
	fs.IntVar(&c.connTarget, "connections", 100000, "connection target the kernel settings are checked against")
}

// checked wraps a flag's value so that a bad value is recorded, with the
// place it came from, instead of stopping the parse: every bad setting is
// reported in one go.
type checked struct {
	flag.Value
	name   string
	where  string
	errs   *[]error
	failed *[]string // names of flags whose value did not parse
}

func (v *checked) Set(s string) error {
	if err := v.Value.Set(s); err != nil {
		*v.errs = append(*v.errs, fmt.Errorf("invalid --%s %q (from %s): %s", v.name, s, v.where, v.want(err)))
		*v.failed = append(*v.failed, v.name)
	}
	return nil
}

// want says what a value of this flag looks like.
func (v *checked) want(err error) string {
	if g, ok := v.Value.(flag.Getter); ok {
		switch g.Get().(type) {
		case int, int64:
			return "want a whole number"
		case float64:
			return "want a number"
		case bool:
			return "want true or false"
		case time.Duration:
			return "want a duration such as 250ms, 5s or 1m"
		}
	}
	return unwrapFlagErr(err).Error()
}

func (v *checked) String() string {
	if v == nil || v.Value == nil {
		return "" // flag.PrintDefaults probes a zero value
	}
	return v.Value.String()
}

func (v *checked) IsBoolFlag() bool {
	b, ok := v.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// unwrapFlagErr drops strconv's "strconv.ParseInt: parsing "x":" prefix.
func unwrapFlagErr(err error) error {
	var ne *strconv.NumError
	if errors.As(err, &ne) {
		return ne.Err
	}
	return err
}

// parse fills c from, in order of precedence: flags, environment, config
// file, defaults. It returns every bad setting (each naming the flag to
// fix), or a single usage error (unknown flag, -h) as the only element.
func parse(args []string, c *config, stderr io.Writer, getenv envLookup, readFile func(string) ([]byte, error)) []error {
	fs := flag.NewFlagSet("roost serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	flags(c, fs)
	fs.Usage = func() {
		// Printed from an unwrapped flag set, so that the flag package
		// still sees each value's type (int, duration) in the help.
		var shadow config
		plain := flag.NewFlagSet("roost serve", flag.ContinueOnError)
		flags(&shadow, plain)
		plain.SetOutput(stderr)
		fmt.Fprintln(stderr, "Usage of roost serve (flags > ROOST_* environment > --config file > defaults):")
		plain.PrintDefaults()
	}
	var errs []error
	var failed []string
	fs.VisitAll(func(f *flag.Flag) {
		f.Value = &checked{Value: f.Value, name: f.Name, where: "flag", errs: &errs, failed: &failed}
	})
	if err := fs.Parse(args); err != nil {
		return []error{usageError{err}} // the flag package printed it with the usage
	}
	if fs.NArg() > 0 {
		return []error{fmt.Errorf("unexpected argument %q: flags only (see roost serve -h)", fs.Arg(0))}
	}
	c.source = map[string]string{}
	fs.VisitAll(func(f *flag.Flag) { c.source[f.Name] = "default" })
	fs.Visit(func(f *flag.Flag) { c.source[f.Name] = "flag" })

	if c.source["config"] == "default" {
		if v, ok := getenv("ROOST_CONFIG"); ok {
			c.configFile = v
			c.source["config"] = "env ROOST_CONFIG"
		}
	}
	var file map[string]fileValue
	if c.configFile != "" {
		b, err := readFile(c.configFile)
		if err != nil {
			errs = append(errs, fmt.Errorf("cannot read --config file: %w", err))
		} else {
			var ferrs []error
			file, ferrs = parseConfigFile(c.configFile, b, fs)
			errs = append(errs, ferrs...)
		}
	}

	// The environment beats the file, so only the winning value is applied
	// (and checked) for each flag not given on the command line.
	fs.VisitAll(func(f *flag.Flag) {
		if c.source[f.Name] != "default" || f.Name == "config" {
			return
		}
		ck := f.Value.(*checked)
		for _, name := range envNames(f.Name) {
			if v, ok := getenv(name); ok {
				ck.where = "env " + name
				_ = ck.Set(v)
				c.source[f.Name] = ck.where
				return
			}
		}
		if fv, ok := file[f.Name]; ok {
			ck.where = fv.where
			_ = ck.Set(fv.value)
			c.source[f.Name] = fv.where
		}
	})
	if c.environ != nil {
		errs = append(errs, unknownEnv(c.environ(), fs)...)
	}
	if c.readFile == nil {
		c.readFile = readFile
	}
	// A value that did not parse is reported once, not again as out of range.
	for _, err := range validate(c) {
		if !slices.ContainsFunc(failed, func(name string) bool { return strings.Contains(err.Error(), "--"+name+" ") }) {
			errs = append(errs, err)
		}
	}
	return errs
}

type secretEntry struct{ kv, where string }

// otherEnv are ROOST_ variables that are not settings of serve: read by
// other commands (roost token, roost bench), or knobs of the tests and
// figure commands, whose nodes inherit the environment.
var otherEnv = map[string]bool{"ROOST_CONFIG": true, "ROOST_APP_SECRETS": true, "ROOST_SECRET": true, "ROOST_NODE_CPU_QUOTA": true}

// otherEnvPrefixes are families of such variables.
var otherEnvPrefixes = []string{"ROOST_TEST_", "ROOST_BENCH_", "ROOST_XNODE_", "ROOST_FUZZ_"}

// unknownEnv reports ROOST_ variables that name no setting, as an unknown
// key of the config file is: a typo must not leave a default in force
// unnoticed.
func unknownEnv(environ []string, fs *flag.FlagSet) []error {
	known := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) {
		for _, n := range envNames(f.Name) {
			known[n] = true
		}
	})
	var errs []error
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "ROOST_") || known[name] || otherEnv[name] ||
			slices.ContainsFunc(otherEnvPrefixes, func(p string) bool { return strings.HasPrefix(name, p) }) {
			continue
		}
		hint := ""
		best := 3
		for k := range known {
			if d := editDistance(name, k); d < best || (d == best && hint != "" && k < hint) {
				best, hint = d, k
			}
		}
		if hint != "" {
			hint = ", did you mean " + hint + "?"
		}
		errs = append(errs, fmt.Errorf("env %s: unknown setting%s (variables are ROOST_ and a flag name of roost serve -h, upper case, _ for -)", name, hint))
	}
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	return errs
}

// editDistance is the Levenshtein distance of two short names.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// usageError is a command-line error the flag package already reported.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

type fileValue struct{ value, where string }

// parseConfigFile reads `key = value` lines: keys are flag names (a leading
// -- is allowed), values may be double-quoted, # starts a comment line,
// blank lines are skipped.
func parseConfigFile(path string, b []byte, fs *flag.FlagSet) (map[string]fileValue, []error) {
	vals := map[string]fileValue{}
	var errs []error
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		where := fmt.Sprintf("file %s:%d", path, n)
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			errs = append(errs, fmt.Errorf("%s: want key = value, got %q", where, line))
			continue
		}
		k = strings.TrimPrefix(strings.TrimSpace(k), "--")
		v = strings.TrimSpace(v)
		if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
			uq, err := strconv.Unquote(v)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: bad quoted value for %s: %v", where, k, err))
				continue
			}
			v = uq
		}
		switch {
		case fs.Lookup(k) == nil:
			errs = append(errs, fmt.Errorf("%s: unknown setting %q (keys are the flag names of roost serve -h)", where, k))
		case k == "config" || k == "print-config":
			errs = append(errs, fmt.Errorf("%s: %s cannot be set in a config file", where, k))
		case vals[k].where != "":
			errs = append(errs, fmt.Errorf("%s: %s already set at %s", where, k, strings.TrimPrefix(vals[k].where, "file ")))
		default:
			vals[k] = fileValue{v, where}
		}
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, fmt.Errorf("cannot read --config file %s: %w", path, err))
	}
	return vals, errs
}

// validate checks every setting and returns one error per bad value, each
// naming the flag to change.
func validate(c *config) []error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	n := &c.node
	host, _, err := net.SplitHostPort(n.Listen)
	if c.admin != "off" && c.admin != "" {
		if _, _, err := net.SplitHostPort(c.admin); err != nil {
			bad("invalid --admin %q: want host:port or off", c.admin)
		}
	}
	if c.api != "off" && c.api != "" {
		if _, _, err := net.SplitHostPort(c.api); err != nil {
			bad("invalid --api %q: want host:port or off", c.api)
		}
	}
	if c.apiRate < 0 {
		bad("invalid --api-rate %g: want 0 (no limit) or more", c.apiRate)
	}
	if c.apiBurst < 1 {
		bad("invalid --api-burst %d: want at least 1", c.apiBurst)
	}
	if c.apiMaxConns < 2 {
		bad("invalid --api-max-conns %d: want at least 2", c.apiMaxConns)
	}
	if c.apiAppMaxConns < 1 || c.apiMaxConns >= 2 && c.apiAppMaxConns > c.apiMaxConns/2 {
		bad("invalid --api-app-max-conns %d: want 1 to half of --api-max-conns (%d), so that one app cannot hold them all", c.apiAppMaxConns, c.apiMaxConns/2)
	}
	if c.apiAppInFlight < 1 {
		bad("invalid --api-app-inflight %d: want at least 1", c.apiAppInFlight)
	}
	if n.NodeID == "" {
		n.NodeID = defaultNodeID(n.Listen)
	}
	n.Apps = nil
	var entries []secretEntry
	if c.appSecrets != "" {
		for _, kv := range strings.Split(c.appSecrets, ",") {
			entries = append(entries, secretEntry{kv, "--app-secret (from " + c.source["app-secret"] + ")"})
		}
	}
	if c.appSecretFile != "" {
		b, err := c.readFile(c.appSecretFile)
		if err != nil {
			bad("cannot read --app-secret-file: %v", err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			if line = strings.TrimSpace(line); line != "" && line[0] != '#' {
				entries = append(entries, secretEntry{line, fmt.Sprintf("--app-secret-file %s:%d", c.appSecretFile, i+1)})
			}
		}
	}
	for _, e := range entries {
		if n.Apps == nil {
			n.Apps = map[string][]byte{}
		}
		id, sec, ok := strings.Cut(strings.TrimSpace(e.kv), "=")
		switch {
		case !ok || !proto.ValidAppID([]byte(id)) || sec == "":
			bad("invalid %s entry %q: want APP=SECRET with APP matching [A-Za-z0-9_.-]{1,64}", e.where, maskAppSecrets(e.kv))
		case n.Apps[id] != nil:
			bad("invalid %s entry %q: app %s is given twice (remove one)", e.where, maskAppSecrets(e.kv), id)
		default:
			n.Apps[id] = []byte(sec)
		}
	}
	// A registry (PostgreSQL, or --apps) or a secret means token mode:
	// clients prove who they are. Without any, a newcomer's `go run .` must
	// just work: on a loopback listener the node runs in development mode
	// (serve warns); anywhere else it would be open to all, so it refuses.
	n.Registry = c.appsFile != "" || c.databaseURL != ""
	c.impliedInsecure = false
	if !n.Insecure && len(entries) == 0 && !n.Registry {
		// Anywhere else Validate refuses: a node without apps is open to all.
		if ip := net.ParseIP(host); err == nil && (host == "localhost" || (ip != nil && ip.IsLoopback())) {
			n.Insecure = true
			c.impliedInsecure = true
		}
	}
	if n.Insecure {
		// Development mode measures the node, not its limits: publish
		// rates are off unless asked for.
		if c.source["pub-rate"] == "default" {
			n.Limits.PubRate = 0
		}
		if c.source["app-pub-rate"] == "default" {
			n.Limits.AppPubRate = 0
		}
	}
	// Every node setting is checked where it is defined (Validate, which
	// names the flag of each error), not again here.
	errs = append(errs, n.Validate()...)
	c.memStoreMaxN = 0
	if strings.TrimSpace(c.memStoreMax) == "0" {
		// no budget (ParseSize takes positive sizes only)
	} else if v, err := tuning.ParseSize(c.memStoreMax); err != nil {
		bad("invalid --memory-store-max %q: %v", c.memStoreMax, err)
	} else if v != 0 && v < 1<<20 {
		bad("invalid --memory-store-max %q: want 0 (no budget) or at least 1MiB", c.memStoreMax)
	} else {
		c.memStoreMaxN = int64(v)
	}
	c.webhookBacklogN = max(c.memStoreMaxN/4, 1<<20)
	if c.memStoreMaxN == 0 {
		c.webhookBacklogN = 128 << 20
	}
	if c.webhookBacklog != "" {
		if v, err := tuning.ParseSize(c.webhookBacklog); err != nil || v < 1<<20 {
			bad("invalid --webhook-backlog %q: want a size of at least 1MiB, such as 64MiB", c.webhookBacklog)
		} else {
			c.webhookBacklogN = int64(v)
		}
	}
	if c.presenceGrace <= 0 {
		bad("invalid --presence-grace %s: want a positive duration such as 5s", c.presenceGrace)
	}
	if c.presenceLease < time.Second {
		bad("invalid --presence-lease %s: want at least 1s (the lease is renewed every fifth of it)", c.presenceLease)
	}
	if n.SignalRate < 0 || n.SignalBurst < 1 {
		bad("invalid --signal-rate %g or --signal-burst %d: want a rate of 0 (no limit) or more and a burst of at least 1", n.SignalRate, n.SignalBurst)
	}
	if n.Limits.MaxPresence < 0 {
		bad("invalid --max-presence %d: want 0 (no limit) or more", n.Limits.MaxPresence)
	}
	if c.maxAppRooms < 0 {
		bad("invalid --max-rooms-per-app %d: want 0 (no bound) or more", c.maxAppRooms)
	}
	if c.keep < 1 {
		bad("invalid --keep %d: want at least 1", c.keep)
	}
	if c.retMaxAge < 0 || (c.retMaxAge > 0 && c.retMaxAge < time.Second) {
		bad("invalid --retention-max-age %s: want 0 (no limit) or at least 1s", c.retMaxAge)
	}
	if c.retMaxCount < 0 {
		bad("invalid --retention-max-count %d: want 0 (no limit) or more", c.retMaxCount)
	}
	if c.retInterval < time.Second {
		bad("invalid --retention-interval %s: want at least 1s", c.retInterval)
	}
	c.retention = persist.RetentionPolicy{Default: persist.Retention{MaxAge: c.retMaxAge, MaxCount: c.retMaxCount}}
	if c.appRetention != "" {
		c.retention.Apps = map[string]persist.Retention{}
		for _, kv := range strings.Split(c.appRetention, ",") {
			kv = strings.TrimSpace(kv)
			ret, err := parseAppRetention(kv)
			if err != nil {
				bad("invalid --app-retention entry %q: %v", kv, err)
				continue
			}
			id, _, _ := strings.Cut(kv, "=")
			if _, dup := c.retention.Apps[id]; dup {
				bad("invalid --app-retention: app %q given twice", id)
			}
			c.retention.Apps[id] = ret
		}
	}
	if c.databaseURL != "" && strings.Contains(c.databaseURL, "://") {
		if u, err := url.Parse(c.databaseURL); err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
			bad("invalid --database-url %q: want postgres://USER@HOST:PORT/DB", maskURLs(c.databaseURL))
		}
	}
	if c.pgMaxConns < 0 {
		bad("invalid --pg-max-conns %d: want 0 (automatic) or more", c.pgMaxConns)
	}
	if c.webhookLease < time.Second {
		bad("invalid --webhook-lease %s: want 1s or more", c.webhookLease)
	}
	if c.stmtTimeout <= 0 {
		bad("invalid --statement-timeout %s: want a positive duration", c.stmtTimeout)
	}
	if c.workers < 1 || c.workers > 256 {
		bad("invalid --publish-workers %d: want 1 to 256", c.workers)
	}
	if c.batchMax < 1 {
		bad("invalid --batch-max %d: want at least 1", c.batchMax)
	}
	if c.batchWindow < 0 || c.batchWindow > time.Second {
		bad("invalid --batch-window %s: want 0 to 1s", c.batchWindow)
	}
	if c.queueLen < 1 {
		bad("invalid --publish-queue %d: want at least 1", c.queueLen)
	}
	if c.redisURL != "" {
		if _, err := pubsub.ParseRedisURL(c.redisURL); err != nil {
			bad("invalid --redis-url %q: %v", maskURLs(c.redisURL), err)
		}
	}
	if c.drain < 0 {
		bad("invalid --drain %s: want 0 or a positive duration", c.drain)
	}
	switch c.logLevel {
	case "debug", "info", "warn", "error":
	default:
		bad("invalid --log-level %q: use debug, info, warn or error", c.logLevel)
	}
	if c.logFormat != "text" && c.logFormat != "json" {
		bad("invalid --log-format %q: use text or json", c.logFormat)
	}
	c.memLimitN = 0
	if c.memLimit != "" {
		v, err := tuning.ParseSize(c.memLimit)
		if err != nil {
			bad("invalid --memory-limit %q: %v", c.memLimit, err)
		}
		c.memLimitN = int64(v)
	}
	if c.connTarget < 1 {
		bad("invalid --connections %d: want at least 1", c.connTarget)
	}
	return errs
}

// parseAppRetention reads APP=MAXAGE/MAXCOUNT.
func parseAppRetention(kv string) (persist.Retention, error) {
	const want = "want APP=MAXAGE/MAXCOUNT such as chat=720h/0 (0: no limit of that kind)"
	id, v, ok := strings.Cut(kv, "=")
	if !ok || !proto.ValidAppID([]byte(id)) {
		return persist.Retention{}, errors.New(want + ", APP matching [A-Za-z0-9_.-]{1,64}")
	}
	age, count, ok := strings.Cut(v, "/")
	if !ok {
		return persist.Retention{}, errors.New(want)
	}
	var r persist.Retention
	if age != "0" {
		d, err := time.ParseDuration(age)
		if err != nil || d < time.Second {
			return persist.Retention{}, fmt.Errorf("max age %q: want 0 or a duration of at least 1s", age)
		}
		r.MaxAge = d
	}
	n, err := strconv.Atoi(count)
	if err != nil || n < 0 {
		return persist.Retention{}, fmt.Errorf("max count %q: want 0 or a whole number", count)
	}
	r.MaxCount = n
	return r, nil
}

var (
	urlPassword = regexp.MustCompile(`(://[^:@/,]*:)[^@/,]*@`)
	dsnPassword = regexp.MustCompile(`(password=)('[^']*'|\S*)`)
)

// maskURLs hides the passwords of URLs (several comma-separated ones too)
// and of key=value DSNs.
func maskURLs(s string) string {
	s = urlPassword.ReplaceAllString(s, "${1}*****@")
	return dsnPassword.ReplaceAllString(s, "${1}*****")
}

// maskAppSecrets keeps the app ids and hides the secrets.
func maskAppSecrets(s string) string {
	parts := strings.Split(s, ",")
	for i, kv := range parts {
		if id, _, ok := strings.Cut(kv, "="); ok {
			parts[i] = id + "=*****"
		}
	}
	return strings.Join(parts, ",")
}

// printConfig writes every setting, its effective value (secrets masked)
// and its source as a table.
func printConfig(w io.Writer, c *config) error {
	// The names, in the flag package's order, come from a flag set bound
	// to a throwaway config (binding one to c would reset c to defaults).
	var shadow config
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	flags(&shadow, fs)
	values := map[string]string{}
	bindValues(c, values)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SETTING\tVALUE\tSOURCE")
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name == "print-config" {
			return
		}
		v := values[f.Name]
		switch f.Name {
		case "app-secret":
			v = maskAppSecrets(v)
		case "admin-token":
			if v != "" {
				v = "*****"
			}
		case "database-url", "redis-url":
			v = maskURLs(v)
		}
		if v == "" {
			v = `""`
		}
		if _, e := fmt.Fprintf(tw, "%s\t%s\t%s\n", f.Name, v, c.source[f.Name]); e != nil && err == nil {
			err = e
		}
	})
	// Derived: what the settings above add up to.
	if _, e := fmt.Fprintf(tw, "(auth mode)\t%s\t%s\n", authMode(c), "derived"); e != nil && err == nil {
		err = e
	}
	if e := tw.Flush(); e != nil && err == nil {
		err = e
	}
	return err
}

// pgMaxConns is the PostgreSQL pool size serve uses.
func pgMaxConns(c *config) int {
	if c.pgMaxConns == 0 {
		// Each worker commits a full batch as up to 4 parallel
		// commits (persist.PoolConfig.Spread); reads share the rest.
		return 4*c.workers + 4
	}
	return c.pgMaxConns
}

func pgMaxConnsText(c *config) string {
	if c.pgMaxConns == 0 {
		return strconv.Itoa(pgMaxConns(c)) + " (4 x publish workers + 4)"
	}
	return strconv.Itoa(c.pgMaxConns)
}

// authMode says how clients are identified, and where apps come from.
func authMode(c *config) string {
	n := &c.node
	var from []string
	switch {
	case c.appsFile != "":
		from = append(from, "registry file "+c.appsFile)
	case c.databaseURL != "":
		from = append(from, "registry in PostgreSQL")
	}
	if len(n.Apps) > 0 {
		from = append(from, strconv.Itoa(len(n.Apps))+" --app-secret app(s)")
	}
	switch {
	case c.impliedInsecure:
		return "insecure (implied: loopback listener and no apps configured); ?user=&app=, apps made on first use"
	case n.Insecure && len(from) > 0:
		return "insecure (--insecure); ?user=&app= or tokens of " + strings.Join(from, " and ")
	case n.Insecure:
		return "insecure (--insecure); ?user=&app=, apps made on first use"
	}
	return "token (HS256 JWT, leeway " + n.Leeway.String() + "); apps from " + strings.Join(from, " and ")
}

// bindValues renders c's fields as flag values, keyed by flag name.
func bindValues(c *config, into map[string]string) {
	n := &c.node
	d := func(x time.Duration) string { return x.String() }
	for k, v := range map[string]string{
		"config":              c.configFile,
		"listen":              n.Listen,
		"insecure":            strconv.FormatBool(n.Insecure),
		"max-frame":           strconv.Itoa(n.MaxFrame),
		"outbound-limit":      strconv.Itoa(n.OutboundLimit),
		"idle":                d(n.IdleInterval),
		"loops":               strconv.Itoa(n.Loops),
		"flush":               d(n.FlushInterval),
		"upgrade-timeout":     d(n.UpgradeTimeout),
		"max-rooms":           strconv.Itoa(n.MaxRooms),
		"max-conns":           strconv.Itoa(n.MaxConns),
		"max-conns-per-ip":    strconv.Itoa(n.MaxConnsPerIP),
		"reuse-port":          strconv.FormatBool(n.ReusePort),
		"proxy-protocol":      strconv.FormatBool(n.ProxyProtocol),
		"trusted-proxies":     n.TrustedProxies.String(),
		"io-uring":            strconv.FormatBool(n.IOURing),
		"readers":             strconv.Itoa(n.Readers),
		"read-queue":          strconv.Itoa(n.ReadQueue),
		"gap-window":          d(n.GapWindow),
		"retry-min":           d(n.RetryMin),
		"retry-max":           d(n.RetryMax),
		"sse-max-age":         d(n.SSEMaxAge),
		"inbox-limit":         strconv.Itoa(n.InboxLimit),
		"shed-after":          d(n.ShedAfter),
		"proxy-inflight":      strconv.Itoa(n.ProxyInFlight),
		"proxy-queue":         strconv.Itoa(n.ProxyQueue),
		"node-id":             n.NodeID,
		"admin":               c.admin,
		"api":                 c.api,
		"api-rate":            strconv.FormatFloat(c.apiRate, 'g', -1, 64),
		"api-burst":           strconv.Itoa(c.apiBurst),
		"api-max-conns":       strconv.Itoa(c.apiMaxConns),
		"api-app-max-conns":   strconv.Itoa(c.apiAppMaxConns),
		"api-app-inflight":    strconv.Itoa(c.apiAppInFlight),
		"admin-token":         c.adminToken,
		"app-secret":          c.appSecrets,
		"app-secret-file":     c.appSecretFile,
		"apps":                c.appsFile,
		"token-leeway":        d(n.Leeway),
		"max-token-ttl":       d(n.Limits.MaxTokenTTL),
		"jwks-refresh":        d(n.JWKSRefresh),
		"insecure-max-apps":   strconv.Itoa(n.InsecureMaxApps),
		"app-max-conns":       strconv.FormatInt(n.Limits.MaxConns, 10),
		"user-max-conns":      strconv.FormatInt(n.Limits.MaxUserConns, 10),
		"pub-rate":            strconv.FormatFloat(n.Limits.PubRate, 'g', -1, 64),
		"pub-burst":           strconv.FormatInt(n.Limits.PubBurst, 10),
		"app-pub-rate":        strconv.FormatFloat(n.Limits.AppPubRate, 'g', -1, 64),
		"max-msg":             strconv.FormatInt(n.Limits.MaxMsg, 10),
		"max-presence":        strconv.FormatInt(n.Limits.MaxPresence, 10),
		"signal-rate":         strconv.FormatFloat(n.SignalRate, 'g', -1, 64),
		"signal-burst":        strconv.Itoa(n.SignalBurst),
		"presence-grace":      d(c.presenceGrace),
		"presence-lease":      d(c.presenceLease),
		"keep":                strconv.Itoa(c.keep),
		"memory-store-max":    c.memStoreMax,
		"max-rooms-per-app":   strconv.Itoa(c.maxAppRooms),
		"retention-max-age":   d(c.retMaxAge),
		"retention-max-count": strconv.Itoa(c.retMaxCount),
		"app-retention":       c.appRetention,
		"retention-interval":  d(c.retInterval),
		"database-url":        c.databaseURL,
		"migrate":             strconv.FormatBool(c.migrate),
		"pg-max-conns":        pgMaxConnsText(c),
		"statement-timeout":   d(c.stmtTimeout),
		"webhook-lease":       d(c.webhookLease),
		"webhook-backlog":     c.webhookBacklog,
		"publish-workers":     strconv.Itoa(c.workers),
		"batch-max":           strconv.Itoa(c.batchMax),
		"batch-window":        d(c.batchWindow),
		"publish-queue":       strconv.Itoa(c.queueLen),
		"redis-url":           c.redisURL,
		"drain":               d(c.drain),
		"log-level":           c.logLevel,
		"log-format":          c.logFormat,
		"memory-limit":        c.memLimit,
		"connections":         strconv.Itoa(c.connTarget),
	} {
		into[k] = v
	}
}

// defaultNodeID is HOSTNAME:PORT: unique per node behind a load balancer
// and recognisable in an operator's dashboards.
func defaultNodeID(listen string) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "roost"
	}
	id := []byte(host)
	for i, ch := range id {
		if !(ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || ch == '_' || ch == '.' || ch == '-') {
			id[i] = '-'
		}
	}
	if _, port, err := net.SplitHostPort(listen); err == nil {
		id = append(append(id, ':'), port...)
	}
	if len(id) > 128 {
		id = id[len(id)-128:]
	}
	return string(id)
}
