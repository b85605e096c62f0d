// Command roost is a chat node: WebSocket clients on gnet event loops,
// messages committed to PostgreSQL (or memory) and fanned out through Redis
// (or in process). `roost` alone runs `roost serve` on embedded defaults.
//
// The root package owns no part of the node's work, only its wiring: the
// command line and its settings (main_config.go), the dispatch of the
// commands (main.go), serve's script that builds the parts in dependency
// order and stops them in reverse through one stop list (main.go,
// main_stop.go), the registry's readings handed to the edges
// (main_registry.go), the admin listener with the node's metrics set
// (main_admin*.go: node info and runtime/process series; each part
// registers its own), and the CLIs of the app
// registry, tokens, webhooks and migrations.
package main

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	vm "github.com/VictoriaMetrics/metrics"

	"github.com/roost-chat/roost/bench"
	"github.com/roost-chat/roost/fanout"
	"github.com/roost-chat/roost/fanout/api"
	"github.com/roost-chat/roost/fanout/hooknet"
	"github.com/roost-chat/roost/fanout/webhook"
	"github.com/roost-chat/roost/loop"
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

// serve reads like a script: configure, build in dependency order, wait
// for a signal, stop in reverse; each phase logs its duration. Each part
// is added to one stop list as soon as it is started, and every way out
// (a part that fails to start, a signal, loops that died) runs that list:
// no path closes anything by hand. stop, when not nil, replaces the
// signals (tests).
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
	stops := &stopList{log: log}
	fatal := func(err error) int {
		log.Error("cannot start", "err", err)
		stops.run()
		return 1
	}
	start := time.Now()

	// 1. Tuning: the runtime fitted to the cgroup, the connection budget.
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

	// Every part registers its own series on the node's set as it is
	// built (its latency histograms too); the admin listener's /metrics
	// writes the set.
	set := vm.NewSet()
	nodeInfo(set, c.node.NodeID)

	// 2. The store.
	ctx := context.Background()
	t0 = time.Now()
	store, pg, err := openStore(ctx, &c, log, stops)
	if err != nil {
		return fatal(err)
	}
	store.RegisterMetrics(set)
	if pg != nil {
		log.Info("store: postgresql", "took", time.Since(t0))
	} else {
		log.Info("store: memory (no --database-url)", "keep", c.keep, "max_bytes", c.memStoreMax, "max_rooms_per_app", c.maxAppRooms, "took", time.Since(t0))
	}

	// 3. The webhooks: they take each committed batch before its acks;
	// with no app having one, that costs one atomic load per batch.
	hcfg := webhook.Config{Log: log, MaxBytes: c.webhookBacklogN}
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
	hooks.RegisterMetrics(set)
	stops.add("webhooks", func() {
		if owed := hooks.Stats.Owed.Load(); owed > 0 && !hooks.Durable() {
			// In memory only: what the receivers have not taken is lost.
			log.Warn("webhook events still owed at exit are lost", "events", owed)
		}
		hooks.Close() // gives the rooms' leases up; with PostgreSQL what is owed stays owed
	})

	// 4. The publish path on the store, which builds its broker (the
	// broker delivers to it). A group commit waits --batch-window for
	// company only where a commit costs a round trip; a memory commit
	// costs nothing, so waiting would only add latency. (The pool reads
	// Window 0 as its default and <0 as "do not wait".)
	window := c.batchWindow
	if window == 0 || c.databaseURL == "" {
		window = -1
	}
	var redis *pubsub.Redis
	var redisAddrs []string
	t0 = time.Now()
	parts := fanout.Parts{
		Store:         store,
		Pool:          fanout.PoolConfig{Workers: c.workers, MaxBatch: c.batchMax, Window: window, QueueLen: c.queueLen, Timeout: c.stmtTimeout, Logger: log},
		Log:           log,
		PresenceGrace: c.presenceGrace,
		OnCommitted:   hooks.Committed,
		ConnEvents:    hooks.WantsEvent, // connection events: the apps' --webhook-events
	}
	// Control messages (a server API disconnect, from any node) reach the
	// loops once they exist; none can concern a connection before that.
	var loops atomic.Pointer[loop.Server]
	parts.OnControl = func(msg []byte) { onControl(loops.Load(), msg, log) }
	if c.redisURL != "" {
		rc, err := pubsub.ParseRedisURL(c.redisURL)
		if err != nil {
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
		return fatal(err)
	}
	fan.RegisterMetrics(set)
	if redis != nil {
		redis.RegisterMetrics(set)
	}
	// What is queued is committed and answered, then the readers, the
	// rebroadcaster and the broker stop.
	stops.add("publish path and broker", func() {
		if err := fan.Close(); err != nil {
			log.Warn("cannot close broker cleanly", "err", err)
		}
	})
	if redis != nil {
		log.Info("broker: redis", "addrs", redisAddrs, "took", time.Since(t0))
	} else {
		log.Info("broker: in-process (no --redis-url)", "took", time.Since(t0))
	}

	// 5. The loops in front of it (their listener opens at step 9).
	c.node.ClientScript, c.node.DemoPage = clientScript, demoPage
	srv, err := loop.New(c.node, fan, log)
	if err != nil {
		return fatal(err)
	}
	loops.Store(srv)
	srv.RegisterMetrics(set)
	var releaseClientAddr func()
	stops.add("loops", func() {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := srv.Stop(sctx); err != nil {
			log.Warn("cannot stop loops cleanly", "err", err)
		}
		if releaseClientAddr != nil {
			releaseClientAddr()
		}
	})
	// Before the loops stop: what they (and the API) queued is committed
	// and its acks handed to them.
	stops.add("publish pool", fan.ClosePublishes)

	// 6. The server API's handler: a second source of publishes.
	var apiSrv *api.Server
	if c.api != "off" && c.api != "" {
		apiSrv = api.New(api.Config{Rate: c.apiRate, Burst: c.apiBurst, MaxMsg: c.node.Limits.MaxMsg, Static: c.node.Apps,
			Edge: api.Edge{MaxConns: c.apiMaxConns, AppMaxConns: c.apiAppMaxConns, AppInFlight: c.apiAppInFlight},
			Dev:  c.node.Insecure && loopbackAddr(c.api), DevMaxApps: c.node.InsecureMaxApps},
			api.Parts{Fan: fan, Store: store, Disconnect: srv.Disconnect, Log: log})
		apiSrv.RegisterMetrics(set)
	}

	// 7. The app registry, read once and then watched; the node's
	// background work (the registry's watch, SIGHUP, sharing connection
	// counts, the admin page's samples) ends with bg.
	bg, stopBG := context.WithCancel(ctx)
	stops.add("app registry and background work", stopBG)
	reg, err := startRegistry(bg, &c, log, store, pg, srv, hooks, apiSrv)
	if err != nil {
		return fatal(err)
	}
	if redis != nil {
		go shareConns(bg, redis, srv, log)
	}
	// What a burst of connections left in the heap goes back to the OS
	// once the node is quiet again (tuning/release.go).
	go tuning.ReleaseAfterBursts(bg, time.Second, log)

	// 8. The listeners of operators and backends.
	var ready atomic.Bool
	if c.admin != "off" && c.admin != "" {
		t0 = time.Now()
		ln, err := net.Listen("tcp", c.admin)
		if err != nil {
			return fatal(fmt.Errorf("cannot listen on --admin %s: %w", c.admin, err))
		}
		release := hooknet.Default.Own("admin", ln.Addr()) // hooks may not call it
		adm := &admin{srv: srv, fan: fan, metrics: set, redis: redis, ready: &ready, token: c.adminToken}
		adm.board = newStatusBoard(adm, log)
		go adm.board.run(bg)
		adminSrv, ln := newAdminServer(ln, adm, log)
		go func() { _ = adminSrv.Serve(ln) }()
		stops.add("admin listener", func() {
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			_ = adminSrv.Shutdown(sctx)
			release()
		})
		log.Info("admin listening", "addr", ln.Addr().String(), "took", time.Since(t0))
	}
	var apiAddr string
	stopAPI := func() {}
	if apiSrv != nil {
		t0 = time.Now()
		ln, err := net.Listen("tcp", c.api)
		if err != nil {
			return fatal(fmt.Errorf("cannot listen on --api %s: %w (give another address, or --api off)", c.api, err))
		}
		release := hooknet.Default.Own("server API", ln.Addr())
		apiHTTP, ln := newAPIServer(apiSrv, ln, log)
		// Behind a trusted proxy the caller is the client it names.
		apiHTTP.Handler = c.node.TrustedProxies.Handler(apiHTTP.Handler)
		go func() { _ = apiHTTP.Serve(ln) }()
		// It takes no new requests once the drain starts; the publishes it
		// has taken are answered (it waits for them) before the publish
		// pool closes. The drain starts it; the stop list waits for it.
		stopAPI = sync.OnceFunc(func() {
			actx, cancel := context.WithTimeout(ctx, c.drain+10*time.Second)
			defer cancel()
			_ = apiHTTP.Shutdown(actx)
			release()
		})
		stops.add("server API listener", stopAPI)
		apiAddr = ln.Addr().String()
		log.Info("server API listening", "addr", apiAddr, "rate", c.apiRate, "burst", c.apiBurst, "took", time.Since(t0))
	}

	// 9. The clients' listener, last: the node is ready.
	t0 = time.Now()
	if err := srv.Start(); err != nil {
		return fatal(err)
	}
	if a, err := net.ResolveTCPAddr("tcp", srv.Addr()); err == nil {
		releaseClientAddr = hooknet.Default.Own("client", a)
	}
	ready.Store(true)
	mode := "token"
	if c.node.Insecure {
		mode = "insecure"
	}
	if c.impliedInsecure {
		log.Warn("no apps configured: development mode on loopback (clients name themselves with ?user=&app=, no token); give --apps FILE, --database-url or --app-secret to require tokens")
	}
	// SIGTERM and SIGINT stop the node, SIGHUP re-reads the registry. They
	// are taken before the node says it is serving: a SIGHUP sent on that
	// line (a reload as the node starts) was lost (TestSIGHUPReloadsRegistry
	// failed so in a CI run), or would end the process as Go's default
	// does.
	if stop == nil {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
		defer signal.Stop(sig)
		stop = sig
	}
	if reg != nil {
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
		go func() {
			for {
				select {
				case <-bg.Done():
					return
				case <-hup:
					log.Info("SIGHUP: re-reading the app registry")
					reg.Reload()
				}
			}
		}()
	}
	log.Info("roost serving", "node", c.node.NodeID, "addr", srv.Addr(), "loops", c.node.Loops, "auth", mode, "took", time.Since(t0), "startup", time.Since(start))
	if c.node.Insecure {
		devBanner(stderr, log, c.logFormat == "json", srv.Addr(), apiAddr, apiSrv != nil && loopbackAddr(c.api))
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
		stops.run()
		return 1
	}

	// The drain: not ready, the server API takes no more requests, and
	// clients are closed over the drain window once their publishes in
	// flight are answered. Then everything stops in reverse.
	stopping := time.Now()
	log.Info("draining", "signal", got.String(), "window", c.drain, "conns", srv.Stats.Conns.Load())
	ready.Store(false)
	apiDone := make(chan struct{})
	go func() {
		defer close(apiDone)
		stopAPI()
	}()
	t0 = time.Now()
	srv.Drain(1001, c.drain)
	log.Info("clients closed", "took", time.Since(t0), "in_flight", srv.Stats.InFlight.Load())
	<-apiDone
	stops.run()
	log.Info("stopped", "took", time.Since(stopping))
	return 0
}
