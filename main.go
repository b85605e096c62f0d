// Command roost is a chat node: WebSocket clients on gnet event loops,
// messages committed to PostgreSQL (or memory) and fanned out through Redis
// (or in process). `roost` alone runs `roost serve` on embedded defaults.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/roost-chat/roost/bench"
	"github.com/roost-chat/roost/fanout"
	"github.com/roost-chat/roost/loop"
	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/pubsub"
	"github.com/roost-chat/roost/tuning"
)

const usage = `roost: a chat node.

Usage:
  roost [serve] [flags]     run the node (default; embedded store and broker unless configured)
  roost migrate [flags]     apply the PostgreSQL schema migrations (--database-url)
  roost bench SCENARIO ...  the load generator (roost bench alone lists scenarios)
  roost tune [flags]        check kernel and cgroup settings; --emit sysctl|systemd
  roost version

Every serve flag can also be set as ROOST_<FLAG> (e.g. ROOST_LISTEN,
ROOST_MAX_FRAME); a flag on the command line wins over the environment.
DATABASE_URL and REDIS_URL are read too.
`

var version = "dev"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	cmd := "serve"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		return serve(args, stderr)
	case "migrate":
		return migrate(args, stderr)
	case "bench":
		return bench.Main(args, stdout, stderr)
	case "tune":
		return tuning.TuneMain(args, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "roost", version, runtime.Version())
		return 0
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "roost: unknown command %q\n\n%s", cmd, usage)
	return 2
}

// config is everything serve reads from flags and the environment.
type config struct {
	node        loop.Config
	admin       string
	appSecrets  string
	keep        int
	databaseURL string
	migrate     bool
	pgMaxConns  int
	stmtTimeout time.Duration
	workers     int
	batchMax    int
	batchWindow time.Duration
	queueLen    int
	redisURL    string
	drain       time.Duration
	logLevel    string
	logFormat   string
	memLimit    string
	connTarget  int
}

func flags(c *config, fs *flag.FlagSet) {
	d := loop.Defaults()
	c.node = d
	fs.StringVar(&c.node.Listen, "listen", d.Listen, "client listener `host:port`")
	fs.BoolVar(&c.node.Insecure, "insecure", false, "development mode: /ws?user=NAME&app=APP without a token, apps made on first use; loopback only")
	fs.IntVar(&c.node.MaxFrame, "max-frame", d.MaxFrame, "largest client message in `bytes`; larger ones are closed with 1009")
	fs.IntVar(&c.node.OutboundLimit, "outbound-limit", d.OutboundLimit, "`bytes` queued for one connection before it is closed as a slow consumer (1013)")
	fs.DurationVar(&c.node.IdleInterval, "idle", d.IdleInterval, "server ping after this much silence; close after twice")
	fs.IntVar(&c.node.Loops, "loops", runtime.GOMAXPROCS(0), "event loops (default: usable CPUs)")
	fs.DurationVar(&c.node.FlushInterval, "flush", d.FlushInterval, "outbound batching tick: frames for a connection are written once per tick")
	fs.DurationVar(&c.node.UpgradeTimeout, "upgrade-timeout", d.UpgradeTimeout, "time allowed for the HTTP upgrade")
	fs.IntVar(&c.node.MaxRooms, "max-rooms", d.MaxRooms, "rooms one connection may join")
	fs.IntVar(&c.node.Readers, "readers", d.Readers, "goroutines doing store reads (join catch-up, history, gap repair)")
	fs.DurationVar(&c.node.GapWindow, "gap-window", d.GapWindow, "how long a missing seq is awaited before it is read from the store")
	fs.StringVar(&c.admin, "admin", "127.0.0.1:6060", "admin listener `host:port` (/debug/pprof/, /healthz, /readyz, /metrics); \"off\" disables")
	fs.StringVar(&c.appSecrets, "app-secret", "", "HS256 secrets of apps, `APP=SECRET[,APP=SECRET...]`")
	fs.IntVar(&c.keep, "keep", 1000, "memory store: newest messages kept per room for since and history")
	fs.StringVar(&c.databaseURL, "database-url", os.Getenv("DATABASE_URL"), "PostgreSQL `url`; empty keeps messages in memory")
	fs.BoolVar(&c.migrate, "migrate", false, "apply pending schema migrations before serving")
	fs.IntVar(&c.pgMaxConns, "pg-max-conns", 0, "PostgreSQL connections (default: publish workers + 4)")
	fs.DurationVar(&c.stmtTimeout, "statement-timeout", 5*time.Second, "PostgreSQL statement timeout")
	fs.IntVar(&c.workers, "publish-workers", 4, "publish goroutines, each committing a shard of rooms")
	fs.IntVar(&c.batchMax, "batch-max", 256, "publishes per group commit")
	fs.DurationVar(&c.batchWindow, "batch-window", time.Millisecond, "how long a group commit waits for more publishes")
	fs.IntVar(&c.queueLen, "publish-queue", 8192, "publishes queued per worker before clients get err overloaded")
	fs.StringVar(&c.redisURL, "redis-url", os.Getenv("REDIS_URL"), "Redis `url` (redis://host:port, several comma-separated seeds for a cluster); empty: in-process broker")
	fs.DurationVar(&c.drain, "drain", 10*time.Second, "on SIGTERM, spread the closing of connections over this window")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&c.logFormat, "log-format", "text", "text or json")
	fs.StringVar(&c.memLimit, "memory-limit", "", "Go memory limit (e.g. 400MiB); default: cgroup limit minus headroom")
	fs.IntVar(&c.connTarget, "connections", 100000, "connection target the kernel settings are checked against")
}

// parse reads flags, then ROOST_* for every flag not given on the command
// line. Stray arguments and bad values are fatal, with the flag to fix.
func parse(args []string, c *config, stderr io.Writer) error {
	fs := flag.NewFlagSet("roost serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	flags(c, fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q: flags only (see roost serve -h)", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		env := "ROOST_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(env); ok {
			if e := f.Value.Set(v); e != nil {
				err = fmt.Errorf("invalid %s=%q: %w", env, v, e)
			}
		}
	})
	if err != nil {
		return err
	}
	if c.appSecrets != "" {
		c.node.Apps = map[string][]byte{}
		for _, kv := range strings.Split(c.appSecrets, ",") {
			id, sec, ok := strings.Cut(strings.TrimSpace(kv), "=")
			if !ok || !loop.ValidAppID([]byte(id)) || sec == "" {
				return fmt.Errorf("invalid --app-secret entry %q: want APP=SECRET with APP matching [A-Za-z0-9_.-]{1,64}", kv)
			}
			c.node.Apps[id] = []byte(sec)
		}
	}
	switch {
	case c.keep < 1:
		return errors.New("--keep must be at least 1")
	case c.workers < 1 || c.workers > 256:
		return errors.New("--publish-workers must be between 1 and 256")
	case c.batchMax < 1:
		return errors.New("--batch-max must be at least 1")
	case c.queueLen < 1:
		return errors.New("--publish-queue must be at least 1")
	case c.logLevel != "debug" && c.logLevel != "info" && c.logLevel != "warn" && c.logLevel != "error":
		return fmt.Errorf("invalid --log-level %q: use debug, info, warn or error", c.logLevel)
	case c.logFormat != "text" && c.logFormat != "json":
		return fmt.Errorf("invalid --log-format %q: use text or json", c.logFormat)
	}
	if c.admin != "off" && c.admin != "" {
		if _, _, e := net.SplitHostPort(c.admin); e != nil {
			return fmt.Errorf("invalid --admin %q: want host:port or off", c.admin)
		}
	}
	return nil
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
// for a signal, stop in reverse; each phase logs its duration.
func serve(args []string, stderr io.Writer) int {
	var c config
	if err := parse(args, &c, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "roost:", err)
		return 2
	}
	log := newLogger(&c, stderr)
	fatal := func(err error) int {
		log.Error("cannot start", "err", err)
		return 1
	}
	start := time.Now()

	var opts tuning.ApplyOptions
	if c.memLimit != "" {
		n, err := tuning.ParseSize(c.memLimit)
		if err != nil {
			return fatal(fmt.Errorf("invalid --memory-limit: %w", err))
		}
		opts.MemLimit = n
	}
	rep := tuning.Apply(opts, log)
	log.Info("tuned", "report", rep)
	tuning.LogFindings(log, tuning.Check("/proc/sys", tuning.Target{Connections: c.connTarget, NoFile: rep.NoFileSoft}))

	ctx := context.Background()
	var store persist.Store
	if c.databaseURL != "" {
		t0 := time.Now()
		if c.migrate {
			if err := persist.Migrate(ctx, c.databaseURL); err != nil {
				return fatal(err)
			}
		}
		maxConns := c.pgMaxConns
		if maxConns == 0 {
			maxConns = c.workers + 4
		}
		pg, err := persist.OpenPostgres(ctx, c.databaseURL, persist.PGConfig{MaxConns: int32(maxConns), StatementTimeout: c.stmtTimeout, Logger: log})
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
			return fatal(errors.New("database schema is outdated: run `roost migrate` or start with --migrate"))
		}
		pg.StartRetention(ctx, time.Minute)
		store = pg
		log.Info("store: postgresql", "took", time.Since(t0))
	} else {
		store = persist.NewMemory(c.keep)
		log.Info("store: memory (no --database-url)", "keep", c.keep)
	}
	defer store.Close()

	srv, err := loop.New(c.node, store, log)
	if err != nil {
		return fatal(err)
	}
	hub := fanout.NewHub(srv, c.node.Loops)
	var broker pubsub.Broker
	if c.redisURL != "" {
		t0 := time.Now()
		rc, err := pubsub.ParseRedisURL(c.redisURL)
		if err != nil {
			return fatal(err)
		}
		r, err := pubsub.NewRedis(ctx, rc, hub, log)
		if err != nil {
			return fatal(err)
		}
		broker = r
		log.Info("broker: redis", "addrs", rc.Addrs, "took", time.Since(t0))
	} else {
		broker = pubsub.NewMemory(hub)
		log.Info("broker: in-process (no --redis-url)")
	}
	hub.SetSubscriber(broker)
	pool := persist.NewPool(store, srv, persist.PoolConfig{Workers: c.workers, MaxBatch: c.batchMax, Window: c.batchWindow, QueueLen: c.queueLen, Timeout: c.stmtTimeout})
	srv.Attach(hub, broker, pool)
	loop.DemoPage = demoPage

	var ready atomic.Bool
	var adminSrv *http.Server
	if c.admin != "off" && c.admin != "" {
		ln, err := net.Listen("tcp", c.admin)
		if err != nil {
			return fatal(fmt.Errorf("cannot listen on --admin %s: %w", c.admin, err))
		}
		adminSrv = &http.Server{Handler: adminMux(srv, pool, &ready), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = adminSrv.Serve(ln) }()
		log.Info("admin listening", "addr", ln.Addr().String())
	}

	if err := srv.Start(); err != nil {
		return fatal(err)
	}
	ready.Store(true)
	mode := "token"
	if c.node.Insecure {
		mode = "insecure"
	}
	log.Info("roost serving", "addr", srv.Addr(), "loops", c.node.Loops, "auth", mode, "took", time.Since(start))

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	got := <-sig
	log.Info("draining", "signal", got.String(), "window", c.drain)

	// Stop in reverse: not ready, close clients over the drain window,
	// commit what is in flight, stop the loops, then the broker and store.
	t0 := time.Now()
	ready.Store(false)
	srv.Drain(1001, c.drain)
	pool.Close()
	log.Info("clients closed, publishes committed", "took", time.Since(t0))
	t0 = time.Now()
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := srv.Stop(sctx); err != nil {
		log.Warn("cannot stop loops cleanly", "err", err)
	}
	_ = broker.Close()
	if adminSrv != nil {
		_ = adminSrv.Shutdown(sctx)
	}
	log.Info("stopped", "took", time.Since(t0))
	return 0
}

func migrate(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("roost migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL `url`")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "roost migrate: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *url == "" {
		fmt.Fprintln(stderr, "roost migrate: no database: give --database-url or DATABASE_URL")
		return 2
	}
	if err := persist.Migrate(context.Background(), *url); err != nil {
		fmt.Fprintln(stderr, "roost migrate:", err)
		return 1
	}
	fmt.Fprintln(stderr, "roost migrate: schema is current")
	return 0
}

// adminMux serves operators: pprof from the first day, health and metrics.
func adminMux(srv *loop.Server, pool *persist.Pool, ready *atomic.Bool) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		sn := srv.Snapshot()
		fmt.Fprintf(w, "ok conns=%d rooms=%d loops=%d\n", sn.Conns, sn.Rooms, sn.Loops)
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if !ready.Load() {
			http.Error(w, "not ready: starting or draining", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		writeMetrics(w, srv, pool)
	})
	return mux
}

// writeMetrics prints the node's counters in Prometheus text format. The
// counters are atomics updated on the hot path; only this reader formats.
func writeMetrics(w io.Writer, srv *loop.Server, pool *persist.Pool) {
	st := &srv.Stats
	sn := srv.Snapshot()
	m := map[string]float64{
		"roost_connections":                float64(st.Conns.Load()),
		"roost_upgrading_connections":      float64(st.Upgrading.Load()),
		"roost_rooms":                      float64(sn.Rooms),
		"roost_accepted_total":             float64(st.Accepted.Load()),
		"roost_frames_out_total":           float64(st.FramesOut.Load()),
		"roost_bytes_out_total":            float64(st.BytesOut.Load()),
		"roost_writes_total":               float64(st.Writes.Load()),
		"roost_frames_in_total":            float64(st.FramesIn.Load()),
		"roost_publishes_total":            float64(st.Publishes.Load()),
		"roost_acks_total":                 float64(st.Acks.Load()),
		"roost_slow_consumer_closes_total": float64(st.SlowCloses.Load()),
		"roost_gap_repairs_total":          float64(st.Repairs.Load()),
		"roost_gap_closes_total":           float64(st.GapCloses.Load()),
		"roost_broker_errors_total":        float64(st.BrokerErrors.Load()),
		"roost_overloaded_total":           float64(st.Overloaded.Load()),
		"roost_upgrade_errors_total":       float64(st.UpgradeErrors.Load()),
	}
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		fmt.Fprintf(w, "%s %s\n", k, strconv.FormatFloat(m[k], 'f', -1, 64))
	}
}
