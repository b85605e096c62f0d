// Command roost is a chat node: WebSocket clients on gnet event loops,
// messages committed to PostgreSQL (or memory) and fanned out through Redis
// (or in process). `roost` alone runs `roost serve` on embedded defaults.
package main

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/roost-chat/roost/bench"
	"github.com/roost-chat/roost/fanout"
	"github.com/roost-chat/roost/fanout/api"
	"github.com/roost-chat/roost/fanout/hooknet"
	"github.com/roost-chat/roost/fanout/webhook"
	"github.com/roost-chat/roost/loop"
	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
	"github.com/roost-chat/roost/pubsub"
	"github.com/roost-chat/roost/tuning"
)

const usage = `roost: a chat node.

Usage:
  roost [serve] [flags]     run the node (default; embedded store and broker unless configured)
  roost serve --print-config  show the effective configuration and where each value came from
  roost migrate [flags]     apply the PostgreSQL schema migrations (--database-url)
  roost app COMMAND ...     the app registry: create, list, show, rotate, disable, enable, set
  roost webhook dead [--app A]  list webhook dead letters (JSON; PostgreSQL)
  roost webhook replay ID   POST a dead letter to its app's webhook again
  roost token --app A --user U [--ttl 1h] [--rooms 'a,b*']
                            print a client token (secret from --secret-file, ROOST_SECRET or the registry)
  roost bench SCENARIO ...  the load generator (roost bench alone lists scenarios)
  roost tune [flags]        check kernel and cgroup settings; --emit sysctl|systemd
  roost health [--ready]    ask a node's admin listener /healthz (or /readyz); exit 0 when it answers 200
  roost version             also --version
  roost -h                  this text; roost serve -h lists every flag of the node

Settings come from, highest precedence first: command-line flags, the
environment (ROOST_<FLAG>, e.g. ROOST_LISTEN, ROOST_MAX_FRAME; DATABASE_URL
and REDIS_URL too), the config file (--config FILE or ROOST_CONFIG: lines of
"flag-name = value", # comments), then the defaults. See docs/operations.md.
Secrets belong in the environment or a file (ROOST_APP_SECRET,
--app-secret-file, --apps FILE, the database), never on the command line.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	cmd := "serve"
	if len(args) > 0 {
		switch args[0] {
		case "-h", "-help", "--help", "help":
			fmt.Fprint(stdout, usage)
			return 0
		case "-version", "--version", "-V", "version":
			fmt.Fprintln(stdout, binaryVersion)
			return 0
		}
		if !strings.HasPrefix(args[0], "-") {
			cmd, args = args[0], args[1:]
		}
	}
	switch cmd {
	case "serve":
		return serve(args, stdout, stderr, nil)
	case "migrate":
		return migrate(args, stderr)
	case "bench":
		return bench.Main(args, stdout, stderr)
	case "tune":
		return tuning.TuneMain(args, stdout, stderr)
	case "app":
		return appMain(args, stdout, stderr)
	case "token":
		return tokenMain(args, stdout, stderr)
	case "webhook":
		return webhookMain(args, stdout, stderr)
	case "health":
		return healthMain(args, stdout, stderr)
	}
	fmt.Fprintf(stderr, "roost: unknown command %q\n\n%s", cmd, usage)
	return 2
}

func newLogger(c *config, w io.Writer) *slog.Logger {
	var lv slog.Level
	_ = lv.UnmarshalText([]byte(c.logLevel))
	opts := &slog.HandlerOptions{Level: lv}
	if c.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// serve reads like a script: configure, build in dependency order, wait
// for a signal, stop in reverse; each phase logs its duration. stop, when
// not nil, replaces the signals (tests).
func serve(args []string, stdout, stderr io.Writer, stop <-chan os.Signal) int {
	c := config{environ: os.Environ}
	if errs := parse(args, &c, stderr, os.LookupEnv, os.ReadFile); len(errs) > 0 {
		var ue usageError
		switch {
		case errors.Is(errs[0], flag.ErrHelp):
			return 0
		case errors.As(errs[0], &ue):
			return 2
		}
		for _, err := range errs {
			fmt.Fprintln(stderr, "roost serve:", err)
		}
		fmt.Fprintf(stderr, "roost serve: %d bad setting(s); see roost serve -h or docs/operations.md\n", len(errs))
		return 2
	}
	if c.printConfig {
		if err := printConfig(stdout, &c); err != nil {
			fmt.Fprintln(stderr, "roost serve: cannot print the configuration:", err)
			return 1
		}
		return 0
	}
	log := newLogger(&c, stderr)
	fatal := func(err error) int {
		log.Error("cannot start", "err", err)
		return 1
	}
	start := time.Now()

	t0 := time.Now()
	rep := tuning.Apply(tuning.ApplyOptions{MemLimit: c.memLimitN}, log)
	tuning.LogFindings(log, tuning.Check("/proc/sys", tuning.Target{Connections: c.connTarget, NoFile: rep.NoFileSoft}))
	if c.source["loops"] == "default" {
		// The flag's default was read before Apply fitted GOMAXPROCS to
		// the cgroup CPU quota: one loop per usable CPU, not per host CPU.
		c.node.Loops = min(runtime.GOMAXPROCS(0), fanout.MaxLoops)
	}
	log.Info("tuned", "report", rep, "loops", c.node.Loops, "took", time.Since(t0))
	if err := connBudget(&c, rep.NoFileSoft, rep.NoFileErr, log); err != nil {
		return fatal(err)
	}

	ctx := context.Background()
	var store persist.Store
	var pg *persist.Postgres
	t0 = time.Now()
	if c.databaseURL != "" {
		if c.migrate {
			rep, err := persist.MigrateReport(ctx, c.databaseURL)
			if err != nil {
				return fatal(err)
			}
			log.Info("schema migrated", "from", rep.From, "to", rep.To, "applied", rep.Applied)
		}
		maxConns := pgMaxConns(&c)
		var err error
		pg, err = persist.OpenPostgres(ctx, c.databaseURL, persist.PGConfig{MaxConns: int32(maxConns), StatementTimeout: c.stmtTimeout, MaxAppRooms: c.maxAppRooms, Logger: log})
		if err != nil {
			return fatal(err)
		}
		ok, err := pg.SchemaCurrent(ctx)
		if err != nil {
			pg.Close()
			return fatal(err)
		}
		if !ok {
			pg.Close()
			return fatal(errors.New("database schema is missing or outdated: run `roost migrate` or start with --migrate"))
		}
		pg.SetRetentionPolicy(c.retention)
		pg.StartRetention(ctx, c.retInterval)
		store = pg
		log.Info("store: postgresql", "took", time.Since(t0))
	} else {
		mem := persist.NewMemory(c.keep)
		mem.SetRetentionPolicy(c.retention)
		mem.SetLimits(c.memStoreMaxN, c.maxAppRooms)
		mem.StartRetention(ctx, c.retInterval)
		store = mem
		log.Info("store: memory (no --database-url)", "keep", c.keep, "max_bytes", c.memStoreMax, "max_rooms_per_app", c.maxAppRooms, "took", time.Since(t0))
	}
	closeStore := func() {
		t0 := time.Now()
		store.Close()
		log.Info("store closed", "took", time.Since(t0))
	}

	// Built in dependency order: the store, the publish path on it (which
	// builds its broker: the broker delivers to it), the loops in front.
	// A group commit waits --batch-window for company only where a commit
	// costs a round trip; a memory commit costs nothing, so waiting would
	// only add latency. (The pool reads Window 0 as its default and <0 as
	// "do not wait".)
	window := c.batchWindow
	if window == 0 || c.databaseURL == "" {
		window = -1
	}
	hists := newHistograms()
	var redis *pubsub.Redis
	var redisAddrs []string
	t0 = time.Now()
	parts := fanout.Parts{
		Store:          store,
		Pool:           fanout.PoolConfig{Workers: c.workers, MaxBatch: c.batchMax, Window: window, QueueLen: c.queueLen, Timeout: c.stmtTimeout, Logger: log},
		Log:            log,
		PublishLatency: hists.publishLatency,
		BrokerLatency:  hists.brokerLatency,
		DeliveryLag:    hists.deliveryLag,
		AckPhases:      hists.fanoutAckPhases(),
		PresenceGrace:  c.presenceGrace,
	}
	// Control messages (a server API disconnect, from any node) reach the
	// loops once they exist; none can concern a connection before that.
	var loops atomic.Pointer[loop.Server]
	parts.OnControl = func(msg []byte) { onControl(loops.Load(), msg, log) }
	// Webhooks take each committed batch before its acks; with no app
	// having one, that costs one atomic load per batch.
	hcfg := webhook.Config{Log: log, Lag: hists.webhookLag.Observe, MaxBytes: c.webhookBacklogN}
	if pg != nil {
		// Durable: what is owed is the messages past each room's cursor.
		// The lease owner names this process (two nodes may share a
		// --node-id, and a restarted process is a new owner: it takes a
		// crashed one's rooms when their leases, --webhook-lease, run out).
		var rnd [6]byte
		_, _ = crand.Read(rnd[:])
		hcfg.Store, hcfg.Owner, hcfg.Lease = pg, c.node.NodeID+"/"+hex.EncodeToString(rnd[:]), c.webhookLease
	}
	hooknet.Default.SetLog(log)
	hooks := webhook.New(hcfg)
	defer hooks.Close() // after the explicit Close below: a no-op
	parts.OnCommitted = hooks.Committed
	if c.redisURL != "" {
		rc, err := pubsub.ParseRedisURL(c.redisURL)
		if err != nil {
			closeStore()
			return fatal(err)
		}
		redisAddrs = rc.Addrs
		parts.NewBroker = func(h pubsub.Handler) (pubsub.Broker, error) {
			r, err := pubsub.NewRedis(ctx, rc, h, log)
			redis = r
			return r, err
		}
		parts.NewPresence = func(bus pubsub.Broker) (pubsub.Presence, error) {
			return bus.(*pubsub.Redis).NewPresence(pubsub.RedisPresenceConfig{Lease: c.presenceLease, Grace: c.presenceGrace}), nil
		}
	}
	fan, err := fanout.New(c.node.Config, parts)
	if err != nil {
		closeStore()
		return fatal(err)
	}
	if redis != nil {
		log.Info("broker: redis", "addrs", redisAddrs, "took", time.Since(t0))
	} else {
		log.Info("broker: in-process (no --redis-url)", "took", time.Since(t0))
	}
	// closeFan stops the publish path: what is queued is committed and
	// answered, then the readers, the rebroadcaster and the broker stop.
	closeFan := func() {
		if err := fan.Close(); err != nil {
			log.Warn("cannot close broker cleanly", "err", err)
		}
	}
	c.node.ClientScript, c.node.DemoPage = clientScript, demoPage
	ackInbox, ackWrite := hists.loopAckPhases()
	srv, err := loop.New(c.node, fan, log, loop.Histograms{WriteFrames: hists.writeFrames, AckLatency: hists.ackLatency,
		AckInbox: ackInbox, AckWrite: ackWrite, ProxyLatency: hists.proxyCall})
	if err != nil {
		closeFan()
		closeStore()
		return fatal(err)
	}
	loops.Store(srv)
	var apiSrv *api.Server
	if c.api != "off" && c.api != "" {
		apiSrv = api.New(api.Config{Rate: c.apiRate, Burst: c.apiBurst, MaxMsg: c.node.Limits.MaxMsg, Static: c.node.Apps,
			Edge: api.Edge{MaxConns: c.apiMaxConns, AppMaxConns: c.apiAppMaxConns, AppInFlight: c.apiAppInFlight},
			Dev:  c.node.Insecure && loopbackAddr(c.api), DevMaxApps: c.node.InsecureMaxApps},
			api.Parts{Fan: fan, Store: store, Disconnect: srv.Disconnect, Log: log, PublishLatency: hists.apiPublish})
	}
	// A registry in PostgreSQL keeps the apps' retention in the columns the
	// store's retention reads; a file's reaches the store from here.
	fileRetention, _ := store.(interface {
		SetAppRetention(map[string]persist.Retention)
	})
	if c.appsFile == "" {
		fileRetention = nil
	}
	regLog := newRegistryLog(log)
	setApps := func(apps []proto.App) {
		regLog.applied(apps)
		srv.SetApps(apps)
		hooks.SetApps(apps)
		if apiSrv != nil {
			apiSrv.SetApps(apps)
		}
		if fileRetention != nil {
			fileRetention.SetAppRetention(registryRetention(apps))
		}
	}
	var reg persist.Registry
	switch {
	case c.appsFile != "":
		reg = persist.OpenAppFile(c.appsFile)
	case pg != nil:
		reg = pg
	}
	regCtx, stopRegistry := context.WithCancel(ctx)
	defer stopRegistry()
	if reg != nil {
		t0 = time.Now()
		apps, err := reg.Apps(ctx)
		if err != nil {
			closeFan()
			closeStore()
			return fatal(err)
		}
		setApps(apps)
		// Changes reach this node within 2 s: LISTEN/NOTIFY or the file's
		// mtime at once, the periodic re-read at worst.
		reg.WatchApps(regCtx, time.Second, setApps, log)
		if len(apps) == 0 && len(c.node.Apps) == 0 && !c.node.Insecure {
			log.Warn("the app registry is empty: every client is refused until `roost app create ID` registers an app")
		}
		log.Info("app registry", "apps", len(apps), "where", registryName(&c), "took", time.Since(t0))
	}
	if redis != nil {
		go shareConns(regCtx, redis, srv, log)
	}

	var ready atomic.Bool
	var adminSrv *http.Server
	if c.admin != "off" && c.admin != "" {
		t0 = time.Now()
		ln, err := net.Listen("tcp", c.admin)
		if err != nil {
			closeFan()
			closeStore()
			return fatal(fmt.Errorf("cannot listen on --admin %s: %w", c.admin, err))
		}
		defer hooknet.Default.Own("admin", ln.Addr())() // hooks may not call it
		adm := &admin{srv: srv, fan: fan, hists: hists, store: store, redis: redis, ready: &ready, api: apiSrv, hooks: hooks, token: c.adminToken}
		adm.board = newStatusBoard(adm, log)
		go adm.board.run(regCtx)
		adminSrv, ln = newAdminServer(ln, adm, log)
		go func() { _ = adminSrv.Serve(ln) }()
		log.Info("admin listening", "addr", ln.Addr().String(), "took", time.Since(t0))
	}

	var apiHTTP *http.Server
	var apiAddr string
	if apiSrv != nil {
		t0 = time.Now()
		ln, err := net.Listen("tcp", c.api)
		if err != nil {
			closeFan()
			closeStore()
			return fatal(fmt.Errorf("cannot listen on --api %s: %w (give another address, or --api off)", c.api, err))
		}
		defer hooknet.Default.Own("server API", ln.Addr())()
		apiHTTP, ln = newAPIServer(apiSrv, ln, log)
		// Behind a trusted proxy the caller is the client it names.
		apiHTTP.Handler = c.node.TrustedProxies.Handler(apiHTTP.Handler)
		go func() { _ = apiHTTP.Serve(ln) }()
		apiAddr = ln.Addr().String()
		log.Info("server API listening", "addr", apiAddr, "rate", c.apiRate, "burst", c.apiBurst, "took", time.Since(t0))
	}

	t0 = time.Now()
	if err := srv.Start(); err != nil {
		closeFan()
		closeStore()
		return fatal(err)
	}
	if a, err := net.ResolveTCPAddr("tcp", srv.Addr()); err == nil {
		defer hooknet.Default.Own("client", a)()
	}
	ready.Store(true)
	mode := "token"
	if c.node.Insecure {
		mode = "insecure"
	}
	if c.impliedInsecure {
		log.Warn("no apps configured: development mode on loopback (clients name themselves with ?user=&app=, no token); give --apps FILE, --database-url or --app-secret to require tokens")
	}
	log.Info("roost serving", "node", c.node.NodeID, "addr", srv.Addr(), "loops", c.node.Loops, "auth", mode, "took", time.Since(t0), "startup", time.Since(start))
	if c.node.Insecure {
		devBanner(stderr, log, c.logFormat == "json", srv.Addr(), apiAddr, apiSrv != nil && loopbackAddr(c.api))
	}

	if stop == nil {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
		stop = sig
	}
	if reg != nil {
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
		go func() {
			for {
				select {
				case <-regCtx.Done():
					return
				case <-hup:
					log.Info("SIGHUP: re-reading the app registry")
					reg.Reload()
				}
			}
		}()
	}
	var got os.Signal
	select {
	case got = <-stop:
	case <-srv.Stopped():
		// A loop or the listener failed: gnet has ended every loop and
		// closed their connections. Nothing here can bring them back;
		// exit non-zero so the supervisor starts a fresh node, after
		// committing what was submitted.
		ready.Store(false)
		log.Error("client listener stopped: exiting so that the supervisor restarts the node", "cause", srv.DeathCause())
		fan.ClosePublishes()
		_ = srv.Stop(context.Background())
		closeFan()
		closeStore()
		if adminSrv != nil {
			_ = adminSrv.Close()
		}
		if apiHTTP != nil {
			_ = apiHTTP.Close()
		}
		return 1
	}
	stopping := time.Now()
	log.Info("draining", "signal", got.String(), "window", c.drain, "conns", srv.Stats.Conns.Load())

	// Stop in reverse: not ready, close clients over the drain window once
	// their publishes in flight are answered, commit what is still queued,
	// stop the loops, then the broker, the store and the admin listener.
	ready.Store(false)
	stopRegistry()
	// The server API stops taking requests with the drain; the publishes
	// it has taken are answered before the publish pool closes.
	apiDone := make(chan struct{})
	go func() {
		defer close(apiDone)
		if apiHTTP != nil {
			actx, cancel := context.WithTimeout(ctx, c.drain+10*time.Second)
			defer cancel()
			_ = apiHTTP.Shutdown(actx)
		}
	}()
	t0 = time.Now()
	srv.Drain(1001, c.drain)
	log.Info("clients closed", "took", time.Since(t0), "in_flight", srv.Stats.InFlight.Load())
	<-apiDone
	t0 = time.Now()
	fan.ClosePublishes()
	log.Info("publish pool closed", "took", time.Since(t0))
	if owed := hooks.Stats.Owed.Load(); owed > 0 && !hooks.Durable() {
		// In memory only: what the receivers have not taken is lost.
		log.Warn("webhook events still owed at exit are lost", "events", owed)
	}
	t0 = time.Now()
	hooks.Close() // gives the rooms' leases up; with PostgreSQL what is owed stays owed
	log.Info("webhooks stopped", "took", time.Since(t0))
	t0 = time.Now()
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := srv.Stop(sctx); err != nil {
		log.Warn("cannot stop loops cleanly", "err", err)
	}
	log.Info("loops stopped", "took", time.Since(t0))
	t0 = time.Now()
	closeFan()
	log.Info("broker closed", "took", time.Since(t0))
	closeStore()
	if adminSrv != nil {
		t0 = time.Now()
		_ = adminSrv.Shutdown(sctx)
		log.Info("admin closed", "took", time.Since(t0))
	}
	log.Info("stopped", "took", time.Since(stopping))
	return 0
}

// newAPIServer serves the server API on ln: timeouts sized for backends,
// a bound on request heads (bodies are bounded per request by the app's
// max-msg), and connections held only by apps that gave a valid secret,
// each within its budget (fanout/api/edge.go).
func newAPIServer(s *api.Server, ln net.Listener, log *slog.Logger) (*http.Server, net.Listener) {
	return s.NewHTTPServer(ln, slog.NewLogLogger(log.Handler(), slog.LevelDebug))
}

// onControl acts on a control message from the broker: a disconnect
// closes the user's connections on this node. It runs on the broker's
// goroutine, so the close (which waits for the loops) runs on its own.
func onControl(srv *loop.Server, msg []byte, log *slog.Logger) {
	var c proto.Control
	if err := proto.ParseControl(msg, &c); err != nil {
		log.Warn("malformed control message on the broker", "len", len(msg))
		return
	}
	if srv != nil {
		go srv.Disconnect(c.App, c.User, 2*time.Second)
	}
}

func registryName(c *config) string {
	if c.appsFile != "" {
		return "file " + c.appsFile
	}
	return "postgresql"
}

// registryRetention is the apps' own retention (keep_age, keep_count) by
// app, for those that have one.
func registryRetention(apps []proto.App) map[string]persist.Retention {
	out := map[string]persist.Retention{}
	for i := range apps {
		if a := &apps[i]; a.KeepAge > 0 || a.KeepCount > 0 {
			out[a.ID] = persist.Retention{MaxAge: time.Duration(a.KeepAge), MaxCount: a.KeepCount}
		}
	}
	return out
}

func migrate(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("roost migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("database-url", "", "PostgreSQL `url` (default: ROOST_DATABASE_URL or DATABASE_URL)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "roost migrate: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	for _, name := range envNames("database-url") {
		if v, ok := os.LookupEnv(name); ok && *url == "" {
			*url = v
		}
	}
	if *url == "" {
		fmt.Fprintln(stderr, "roost migrate: no database: give --database-url or DATABASE_URL")
		return 2
	}
	rep, err := persist.MigrateReport(context.Background(), *url)
	if err != nil {
		fmt.Fprintln(stderr, "roost migrate:", err)
		return 1
	}
	printMigration(stderr, rep)
	return 0
}
