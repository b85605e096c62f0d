// Package loop owns the client connections: the gnet event loops, the HTTP
// upgrade, RFC 6455 framing, the protocol commands, and the hand-offs
// between the loops and the goroutines that commit, read and broadcast.
//
// A connection belongs to exactly one loop for its whole life and is
// touched only on that loop's goroutine; there is no goroutine per
// connection. Work produced elsewhere (deliveries from the broker, acks from
// the publish pool, store reads) reaches a loop through that loop's inbox:
// one queue, one wake-up per batch. Outbound frames are queued per
// connection and written once per flush tick: many frames, one writev.
package loop

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/panjf2000/gnet/v2"
	"github.com/panjf2000/gnet/v2/pkg/logging"

	"github.com/roost-chat/roost/fanout"
	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
	"github.com/roost-chat/roost/tuning"
)

// Config is what the loops need to know. main fills it from flags.
type Config struct {
	Listen         string        // host:port of the client listener
	Insecure       bool          // ?user=&app= instead of a JWT; loopback only
	MaxFrame       int           // largest client message, bytes (1009 above)
	OutboundLimit  int           // pending + unsent bytes per connection before 1013
	IdleInterval   time.Duration // server ping after this much silence; close after twice
	Loops          int           // event loops
	FlushInterval  time.Duration // outbound batching tick
	UpgradeTimeout time.Duration // a connection must finish its upgrade within this
	MaxRooms       int           // rooms one connection may be in
	Readers        int           // goroutines doing store reads (join, history, repair)
	GapWindow      time.Duration // how long a missing seq may be awaited before repair
	RetryMin       time.Duration // jittered reconnect hint of 1013 closes: [RetryMin, RetryMax)
	RetryMax       time.Duration
	// InboxLimit bounds a loop's inbox: a delivery that finds this many
	// tasks queued is not queued (its room is read from the store
	// instead), and new publishes on the loop get err overloaded.
	InboxLimit int
	// ShedAfter: while a loop's publishes take longer than this from read
	// to commit (smoothed), it answers new ones err overloaded (0: never).
	ShedAfter time.Duration
	Apps      map[string][]byte // app id -> HS256 secret (production mode)
	// MaxConns is the connection budget: TCP connections the client
	// listener holds at once, upgraded or not (0: no budget). main derives
	// it from RLIMIT_NOFILE minus a reserve, so that accept never meets
	// EMFILE. A connection past it is closed at once and counted.
	MaxConns int
	// MaxConnsPerIP caps the connections of one source address (0: no
	// cap), so that one host cannot take the whole budget.
	MaxConnsPerIP int
	// ReusePort lets several processes share the listen port
	// (SO_REUSEPORT across processes). Off, a port already in use fails
	// Start with "address already in use".
	ReusePort bool
	// NodeID names this node to operators and clients: it is sent as the
	// X-Roost-Node header of every upgrade response, so a client (or a
	// support engineer with its logs) can tell which node it is on.
	NodeID string
	// ClientScript is served at /roost.js in every mode and DemoPage at /
	// in insecure mode (main embeds both; nil serves nothing).
	ClientScript []byte
	DemoPage     []byte
}

// Defaults returns the documented defaults.
func Defaults() Config {
	return Config{
		Listen:         "127.0.0.1:8080",
		MaxFrame:       64 << 10,
		OutboundLimit:  1 << 20,
		IdleInterval:   25 * time.Second,
		Loops:          1,
		FlushInterval:  4 * time.Millisecond, // p99 under 10 ms at 1,000 msg/s in a 330-member room; see docs/benchmarks.md
		UpgradeTimeout: 10 * time.Second,
		MaxRooms:       256,
		Readers:        8,
		GapWindow:      250 * time.Millisecond,
		RetryMin:       500 * time.Millisecond,
		RetryMax:       5 * time.Second,
		ShedAfter:      time.Second,
		InboxLimit:     65536,
	}
}

// Publisher hands committed messages to the broker (pubsub.Broker fits).
type Publisher interface {
	Publish(ctx context.Context, key string, seq uint64, frame []byte) error
}

// Submitter takes publishes to commit (persist.Pool fits).
type Submitter interface {
	Submit(req *proto.PubRequest) error
}

// Server is the client side of a node: gnet engine, loops, and the glue
// to the store, the publish pool and the broker.
type Server struct {
	gnet.BuiltinEventEngine

	cfg   Config
	log   *slog.Logger
	store persist.Store
	hub   *fanout.Hub
	bus   Publisher
	pool  Submitter
	apps  *apps
	// nodeHeader ends every 101 response: "X-Roost-Node: ID\r\n\r\n".
	nodeHeader []byte
	// script and demo are the files of Config.ClientScript and DemoPage.
	script, demo *staticFile

	addr    string // resolved listen address
	eng     gnet.Engine
	booted  chan struct{}
	stopped chan struct{}
	runErr  error

	loopsMu sync.Mutex
	loops   [fanout.MaxLoops]atomic.Pointer[loopState]
	nloops  atomic.Int32

	draining atomic.Bool // set by Drain; loops created later start draining

	// open counts the TCP connections admitted against MaxConns; perIP
	// those of each source address (only with MaxConnsPerIP).
	open  atomic.Int64
	perIP struct {
		sync.Mutex
		n map[netip.Addr]int32
	}
	// stopping is set by Stop: the engine ending before that is a death
	// (Dead), not a shutdown. gnetErrs are gnet's latest error lines,
	// which name the cause.
	stopping atomic.Bool
	gnetErrs *errLines

	brokerLogged atomic.Int64 // Unix ns of the last broker error logged

	reads    chan readJob
	retries  chan rebroadcast
	done     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup

	Stats Stats
}

// Stats are the node's counters, updated without locks.
type Stats struct {
	Conns         atomic.Int64 // open WebSocket connections
	Upgrading     atomic.Int64
	Accepted      atomic.Uint64
	FramesOut     atomic.Uint64 // frames handed to the kernel or gnet
	BytesOut      atomic.Uint64
	Writes        atomic.Uint64 // writev calls (frames/writes = batch size)
	FramesIn      atomic.Uint64
	Publishes     atomic.Uint64
	Acks          atomic.Uint64
	SlowCloses    atomic.Uint64
	Repairs       atomic.Uint64
	GapCloses     atomic.Uint64
	BrokerErrors  atomic.Uint64 // broker publishes that failed (each is retried)
	Rebroadcasts  atomic.Uint64 // failed broadcasts that a retry delivered
	BrokerDropped atomic.Uint64 // failed broadcasts given up: receivers repair from the store
	Overloaded    atomic.Uint64
	Shed          atomic.Uint64 // of Overloaded: publishes refused by ShedAfter
	// InboxFull: of Overloaded, publishes refused because their loop's
	// inbox held InboxLimit tasks. InboxOverflow: deliveries not queued for
	// the same reason; their rooms were read from the store instead.
	InboxFull     atomic.Uint64
	InboxOverflow atomic.Uint64
	UpgradeErrors atomic.Uint64
	RefusedBudget atomic.Uint64 // connections closed at accept: MaxConns reached
	RefusedPerIP  atomic.Uint64 // connections closed at accept: MaxConnsPerIP reached
	Joined        atomic.Int64  // live room memberships, all connections
	InFlight      atomic.Int64  // publishes submitted and not yet answered

	// Histograms, built by New. Observe takes no lock and allocates nothing.
	WriteFrames    *tuning.Histogram // frames per writev: the batch size of one write
	PublishLatency *tuning.Histogram // seconds from a pub frame read to its commit
	AckLatency     *tuning.Histogram // seconds from a pub frame read to its ack queued
	BrokerLatency  *tuning.Histogram // seconds one broker Publish of a committed message takes
	// DeliveryLag is seconds from a message's commit (its ts) to its
	// arrival at this node from the broker, sampled one message in 64.
	// Across nodes it includes their clock offset.
	DeliveryLag *tuning.Histogram

	// InboxDepth[i] is how many tasks loop i took in its latest inbox drain:
	// a loop falling behind shows as a growing number here.
	InboxDepth [fanout.MaxLoops]atomic.Int64
}

// Bucket bounds of the Stats histograms.
var (
	LatencyBuckets     = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5}
	WriteFramesBuckets = []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}
)

// monoEpoch anchors the publish stamps: time.Since reads the monotonic
// clock, so a wall-clock step cannot produce a negative latency.
var monoEpoch = time.Now()

// pubStamp travels in PubRequest.Origin from the pub frame to its ack: the
// publishing connection and when its frame was read. Stamps are recycled
// through their loop's free list (loop only), so a publish allocates none
// in steady state.
type pubStamp struct {
	c  *conn
	t0 time.Duration // since monoEpoch
}

// stamp returns a stamp for a publish of c read now. Loop only.
func (l *loopState) stamp(c *conn) *pubStamp {
	var ps *pubStamp
	if n := len(l.stamps); n > 0 {
		ps = l.stamps[n-1]
		l.stamps[n-1] = nil
		l.stamps = l.stamps[:n-1]
	} else {
		ps = new(pubStamp)
	}
	ps.c, ps.t0 = c, time.Since(monoEpoch)
	l.inflight++
	l.srv.Stats.InFlight.Add(1)
	return ps
}

// unstamp recycles the stamp of req and returns how long ago its frame was
// read; with answered it also feeds that into commitLag. Loop only;
// req.Origin must not be used afterwards.
func (l *loopState) unstamp(req *proto.PubRequest, answered bool) time.Duration {
	ps := req.Origin.(*pubStamp)
	d := time.Since(monoEpoch) - ps.t0
	ps.c = nil
	l.stamps = append(l.stamps, ps)
	l.inflight--
	l.srv.Stats.InFlight.Add(-1)
	if answered {
		l.commitLag += (d - l.commitLag) / 8
	}
	return d
}

// shedding reports whether the loop should refuse a publish: its recent
// publishes took longer than ShedAfter from read to commit and some are
// still waiting. Under CPU overload that is where the backlog builds (the
// publish pool shares the CPU with the loop's fan-out; docs/multinode.md),
// and every publish taken adds a fan-out the node cannot serve. Once the
// loop's publishes have all been answered it takes one again, so the
// smoothed lag falls as soon as commits are quick.
func (l *loopState) shedding() bool {
	sa := l.srv.cfg.ShedAfter
	return sa > 0 && l.inflight > 0 && l.commitLag > sa
}

// AppConns calls fn for every app with its open WebSocket connections
// (for metrics). Any goroutine.
func (s *Server) AppConns(fn func(app string, conns int64)) {
	s.apps.mu.RLock()
	defer s.apps.mu.RUnlock()
	for id, a := range s.apps.byID {
		fn(id, a.conns.Load())
	}
}

// New builds a server. Wire it with Attach before Serve.
func New(cfg Config, store persist.Store, log *slog.Logger) (*Server, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Server{
		cfg:     cfg,
		log:     log,
		store:   store,
		apps:    newApps(cfg.Insecure, cfg.Apps),
		booted:  make(chan struct{}),
		stopped: make(chan struct{}),
		reads:   make(chan readJob, 4096),
		retries: make(chan rebroadcast, 8192),
		done:    make(chan struct{}),

		gnetErrs: new(errLines),
	}
	s.perIP.n = make(map[netip.Addr]int32)
	s.Stats.WriteFrames = tuning.NewHistogram(WriteFramesBuckets...)
	s.Stats.PublishLatency = tuning.NewHistogram(LatencyBuckets...)
	s.Stats.AckLatency = tuning.NewHistogram(LatencyBuckets...)
	s.Stats.BrokerLatency = tuning.NewHistogram(LatencyBuckets...)
	s.Stats.DeliveryLag = tuning.NewHistogram(LatencyBuckets...)
	if cfg.NodeID != "" {
		s.nodeHeader = []byte("X-Roost-Node: " + cfg.NodeID + "\r\n\r\n")
	}
	// A new node version may bring a new client: browsers revalidate
	// (cheaply, by ETag) after five minutes.
	s.script = newStaticFile(cfg.ClientScript, "text/javascript; charset=utf-8", "public, max-age=300")
	s.demo = newStaticFile(cfg.DemoPage, "text/html; charset=utf-8", "no-cache")
	return s, nil
}

func (c *Config) validate() error {
	switch {
	case c.MaxFrame < 125 || c.MaxFrame > 16<<20:
		return fmt.Errorf("frame limit %d out of range: set --max-frame between 125 and 16777216", c.MaxFrame)
	case c.OutboundLimit < 4<<10:
		return fmt.Errorf("outbound limit %d too small: set --outbound-limit to at least 4096", c.OutboundLimit)
	case c.Loops < 1 || c.Loops > fanout.MaxLoops:
		return fmt.Errorf("loops %d out of range: set --loops between 1 and %d", c.Loops, fanout.MaxLoops)
	case c.IdleInterval < 100*time.Millisecond:
		return fmt.Errorf("idle interval %s too short: set --idle to at least 100ms", c.IdleInterval)
	case c.FlushInterval < 100*time.Microsecond || c.FlushInterval > time.Second:
		return fmt.Errorf("flush interval %s out of range: set --flush between 100µs and 1s", c.FlushInterval)
	case c.MaxRooms < 1:
		return errors.New("room limit must be positive: set --max-rooms")
	case !validNodeID(c.NodeID):
		return fmt.Errorf("node id %q: want up to 128 of [A-Za-z0-9_.:-]: set --node-id", c.NodeID)
	case c.Readers < 1:
		return errors.New("readers must be positive: set --readers")
	case c.RetryMax <= c.RetryMin:
		return errors.New("retry window empty: RetryMax must exceed RetryMin")
	case c.MaxConns < 0:
		return errors.New("connection budget must not be negative: set --max-conns")
	case c.MaxConnsPerIP < 0:
		return errors.New("per-address cap must not be negative: set --max-conns-per-ip")
	case c.InboxLimit < 16:
		return fmt.Errorf("inbox limit %d too small: set --inbox-limit to at least 16", c.InboxLimit)
	case c.ShedAfter < 0 || (c.ShedAfter > 0 && c.ShedAfter < 10*time.Millisecond):
		return fmt.Errorf("shed-after %s out of range: set --shed-after to 0 (never) or at least 10ms", c.ShedAfter)
	}
	if c.Insecure {
		host, _, err := net.SplitHostPort(c.Listen)
		if err != nil {
			return fmt.Errorf("cannot parse listen address %q: %w", c.Listen, err)
		}
		ip := net.ParseIP(host)
		if host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return fmt.Errorf("insecure mode listens only on loopback, not %q: use --listen 127.0.0.1:PORT or drop --insecure", c.Listen)
		}
	} else if len(c.Apps) == 0 {
		return errors.New("no app secrets configured: give --app-secret APP=SECRET (or ROOST_APP_SECRETS), or run with --insecure on loopback")
	}
	return nil
}

// validNodeID: the id goes into an HTTP header, so header-safe characters
// only; empty means no header.
func validNodeID(id string) bool {
	if len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		ch := id[i]
		if !(ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || ch == '_' || ch == '.' || ch == ':' || ch == '-') {
			return false
		}
	}
	return true
}

// NodeID is the configured node id.
func (s *Server) NodeID() string { return s.cfg.NodeID }

// Attach wires the hub, broker and publish pool (built after the server,
// since they call back into it).
func (s *Server) Attach(hub *fanout.Hub, bus Publisher, pool Submitter) {
	s.hub, s.bus, s.pool = hub, bus, pool
}

// Addr is the resolved client listen address (after Start).
func (s *Server) Addr() string { return s.addr }

// Start runs the engine in the background and returns once it accepts.
func (s *Server) Start() error {
	addr, err := resolveListen(s.cfg.Listen)
	if err != nil {
		return err
	}
	s.addr = addr
	if !s.cfg.ReusePort {
		if err := probePort(addr); err != nil {
			return err
		}
	}
	if n := runtime.GOMAXPROCS(0); n <= s.cfg.Loops {
		// Each gnet loop blocks in its own epoll_wait while holding a P.
		// With every P held that way nobody polls Go's own netpoller (pgx,
		// rueidis, the admin listener) until sysmon does, up to 10 ms
		// later: measured, a PostgreSQL commit took ~10 ms instead of ~1
		// and publish p50 fell from 15.3 ms to 5.5 ms with one P left free.
		// A spare P costs nothing while idle.
		runtime.GOMAXPROCS(s.cfg.Loops + 1)
		s.log.Info("GOMAXPROCS raised above the loop count so Go's netpoller keeps a P", "from", n, "to", s.cfg.Loops+1, "loops", s.cfg.Loops)
	}
	for i := 0; i < s.cfg.Readers; i++ {
		s.wg.Add(1)
		go s.reader()
	}
	s.wg.Add(1)
	go s.rebroadcaster()
	go func() {
		defer close(s.stopped)
		s.runErr = gnet.Run(s, "tcp://"+addr,
			gnet.WithMulticore(s.cfg.Loops > 1),
			gnet.WithNumEventLoop(s.cfg.Loops),
			gnet.WithReusePort(true),
			// The connections a killed node leaves in TIME_WAIT inherit
			// the listener's options: without SO_REUSEADDR they fail the
			// probe's plain bind for a minute, so a node SIGKILLed and
			// started again at once could not listen on its port.
			gnet.WithReuseAddr(true),
			gnet.WithTCPNoDelay(gnet.TCPNoDelay),
			gnet.WithLogger(gnetLogger{s.log, s.gnetErrs}),
			gnet.WithLogLevel(logging.ErrorLevel),
		)
	}()
	select {
	case <-s.booted:
	case <-s.stopped:
		return fmt.Errorf("cannot listen on %s: %w", addr, s.runErr)
	}
	if !s.cfg.ReusePort {
		// The probe leaves an instant between its close and gnet's bind:
		// two nodes started together can both pass it. Whoever finds the
		// other's listener now gives way; if both do, both exit (their
		// supervisor retries), which is better than splitting the clients.
		if err := sharedPort(addr); err != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = s.Stop(ctx)
			return err
		}
	}
	return nil
}

// sharedPort fails when a listening TCP socket on addr's port belongs to
// another process: every listener on the port in /proc/net/tcp{,6} must be
// one of this process's descriptors. The tables are read before the
// descriptors, so a listener of ours is always found among them. Where
// /proc cannot be read, it cannot tell and says nothing.
func sharedPort(addr string) error {
	_, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return nil
	}
	port, err := strconv.ParseUint(ps, 10, 16)
	if err != nil {
		return nil
	}
	var listening []string
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fl := strings.Fields(line)
			if len(fl) < 10 || fl[3] != "0A" { // 0A: LISTEN
				continue
			}
			_, hexPort, ok := strings.Cut(fl[1], ":")
			if p, err := strconv.ParseUint(hexPort, 16, 16); !ok || err != nil || p != port {
				continue
			}
			listening = append(listening, fl[9])
		}
	}
	if len(listening) == 0 {
		return nil
	}
	ours := map[string]bool{}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil
	}
	for _, fd := range fds {
		if l, err := os.Readlink("/proc/self/fd/" + fd.Name()); err == nil && strings.HasPrefix(l, "socket:[") {
			ours[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	for _, ino := range listening {
		if !ours[ino] {
			return fmt.Errorf("cannot listen on %s: address already in use (another process listens on port %d too; give --reuse-port only to share the port on purpose)", addr, port)
		}
	}
	return nil
}

// probePort fails when another socket listens on addr. gnet binds one
// SO_REUSEPORT listener per loop, and the kernel lets any other process of
// the same user that sets SO_REUSEPORT join the port: two nodes would
// split the clients between two stores without a word. A plain bind (no
// SO_REUSEPORT) is refused while anyone listens there, so it tells. The
// probe closes before gnet binds; two nodes started within that instant
// can still both pass, which a supervisor starting one node does not do.
func probePort(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("cannot listen on %s: address already in use (another process listens there; give --reuse-port only to share the port on purpose)", addr)
		}
		return fmt.Errorf("cannot listen on %s: %w", addr, err)
	}
	return ln.Close()
}

// resolveListen turns port 0 into a concrete free port: with SO_REUSEPORT
// every loop binds its own listener, and they must share one port.
func resolveListen(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("cannot parse listen address %q: %w", addr, err)
	}
	if port != "0" {
		return addr, nil
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return "", fmt.Errorf("cannot find a free port on %s: %w", host, err)
	}
	defer ln.Close()
	return net.JoinHostPort(host, strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)), nil
}

// OnBoot: the engine accepts from now on.
func (s *Server) OnBoot(eng gnet.Engine) gnet.Action {
	s.eng = eng
	close(s.booted)
	return gnet.None
}

// Drain takes the node out of service over window, in three steps:
//
//  1. every loop refuses new connections and answers new publishes with
//     err overloaded;
//  2. publishes already submitted are awaited (up to half the window) so
//     that each is committed and its ack queued before its connection closes;
//  3. connections are closed with code (1001 or 1013) and a jittered
//     retry=MS hint, a share of each loop's connections per round, the
//     rounds spread over what is left of the window: clients reconnect
//     elsewhere gradually, not in one storm.
//
// It returns when every connection has been sent its close. Any goroutine;
// call it once.
func (s *Server) Drain(code int, window time.Duration) {
	start := time.Now()
	s.draining.Store(true)
	if !s.eachLoop(task{kind: tDrain}) { // n = 0: refuse, close nothing yet
		return // the loops are gone, and their connections with them
	}
	for s.Stats.InFlight.Load() > 0 && time.Since(start) < window/2 && !s.Dead() {
		time.Sleep(2 * time.Millisecond) // off the hot path: once per shutdown
	}
	rest := window - time.Since(start)
	rounds := max(1, min(int(rest/(100*time.Millisecond)), 50))
	step := rest / time.Duration(rounds)
	for r := rounds; r >= 1; r-- {
		if !s.eachLoop(task{kind: tDrain, n: uint64(code), seq: uint64(r)}) {
			return
		}
		if s.Stats.Conns.Load()+s.Stats.Upgrading.Load() == 0 {
			return // nobody left: do not sit out the window
		}
		if r > 1 {
			time.Sleep(step)
		}
	}
}

// eachLoop runs t on every loop and waits until all have run it. It
// reports false, without waiting, when the engine has stopped: a task
// pushed to a loop that no longer runs never runs.
func (s *Server) eachLoop(t task) bool {
	n := int(s.nloops.Load())
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		t.done = wg.Done
		s.loops[i].Load().push(t)
	}
	all := make(chan struct{})
	go func() { wg.Wait(); close(all) }()
	select {
	case <-all:
		return true
	case <-s.stopped:
		return false
	}
}

// Dead reports whether the engine stopped without Stop: a loop or the
// listener failed (gnet ends every loop when one fails). The node is then
// of no use to clients: readiness fails and main exits non-zero.
func (s *Server) Dead() bool {
	select {
	case <-s.stopped:
		return !s.stopping.Load()
	default:
		return false
	}
}

// Stopped is closed when the engine has stopped, by Stop or by a failure.
func (s *Server) Stopped() <-chan struct{} { return s.stopped }

// DeathCause is gnet's latest error lines: why the engine stopped, when
// Dead.
func (s *Server) DeathCause() string {
	if c := s.gnetErrs.String(); c != "" {
		return c
	}
	if s.runErr != nil {
		return s.runErr.Error()
	}
	return "the event loops stopped"
}

// Stop stops the engine, the ticker and the readers.
// Stop may be called more than once; later calls return at once.
func (s *Server) Stop(ctx context.Context) error {
	var err error
	s.stopOnce.Do(func() {
		s.stopping.Store(true)
		close(s.done)
		select {
		case <-s.booted:
			err = s.eng.Stop(ctx)
			<-s.stopped
		default:
		}
		// The loops are gone: no task can arm their timers again.
		for i := 0; i < int(s.nloops.Load()); i++ {
			s.loops[i].Load().stopTimers()
		}
		s.wg.Wait()
	})
	return err
}

// loopFor returns the state of a gnet loop, creating it when the loop shows
// its first connection. Called on that loop only.
func (s *Server) loopFor(el gnet.EventLoop) *loopState {
	n := int(s.nloops.Load())
	for i := 0; i < n; i++ {
		if l := s.loops[i].Load(); l.el == el {
			return l
		}
	}
	s.loopsMu.Lock()
	defer s.loopsMu.Unlock()
	n = int(s.nloops.Load())
	for i := 0; i < n; i++ {
		if l := s.loops[i].Load(); l.el == el {
			return l
		}
	}
	if n >= s.cfg.Loops {
		panic("BUG: loop: more gnet loops than configured")
	}
	l := newLoopState(s, el, n)
	l.draining = s.draining.Load()
	s.loops[n].Store(l)
	s.nloops.Store(int32(n + 1))
	return l
}

// sweepEvery is how often a loop with connections checks them for
// silence, upgrade timeouts and token expiry: coarse, since the shortest
// of those is seconds by default, and a sweep visits every connection.
func (s *Server) sweepEvery() time.Duration {
	d := min(time.Second, s.cfg.IdleInterval/4, s.cfg.UpgradeTimeout/4)
	return max(d, 10*time.Millisecond)
}

// retryMS is a jittered reconnect delay for 1013 closes.
func (s *Server) retryMS() int {
	lo, hi := s.cfg.RetryMin.Milliseconds(), s.cfg.RetryMax.Milliseconds()
	return int(lo + rand.Int64N(hi-lo))
}

// Committed is called by the publish pool's workers (persist.Sink), in seq
// order per room: the frame goes to the broker first, then the ack to the
// publisher's loop, so an ack always means "stored and on its way".
func (s *Server) Committed(req *proto.PubRequest, res *proto.PubResult) {
	s.Stats.PublishLatency.Observe((time.Since(monoEpoch) - req.Entered).Seconds())
	if res.Err == nil && !res.Duplicate {
		t0 := time.Now()
		err := s.bus.Publish(context.Background(), req.Key, res.Seq, res.Frame)
		s.Stats.BrokerLatency.Observe(time.Since(t0).Seconds())
		if err != nil {
			// Stored but not broadcast. Receivers would repair the gap from
			// the store at the room's next message, but a room that goes
			// quiet has none: broadcast again from the side.
			s.Stats.BrokerErrors.Add(1)
			s.rebroadcastLater(req.Key, res.Seq, res.Frame, err)
		}
	}
	req.Origin.Published(req, res)
}

// Published hands the outcome of a publish to its connection's loop
// (proto.Origin).
func (ps *pubStamp) Published(req *proto.PubRequest, res *proto.PubResult) {
	c := ps.c
	c.l.push(task{kind: tAck, conn: c, req: req, seq: res.Seq, err: res.Err})
}

// Deliver queues a message for loop i (fanout.Loops).
func (s *Server) Deliver(i int, key string, seq uint64, frame []byte) {
	if i == 0 && seq%64 == 0 {
		// Sampled: a message reaches each holding loop, so measure on
		// loop 0's copy only, one message in 64.
		if ts, ok := proto.FrameTS(frame); ok {
			s.Stats.DeliveryLag.Observe(float64(time.Now().UnixMilli()-ts) / 1000)
		}
	}
	s.loops[i].Load().pushDelivery(key, seq, frame)
}

// Subscribed tells loop i the node's subscription to key is up (fanout.Loops).
func (s *Server) Subscribed(i int, key string, err error) {
	s.loops[i].Load().push(task{kind: tSubscribed, key: key, err: err})
}

// Reset asks loop i to check all its rooms for missed messages (fanout.Loops).
func (s *Server) Reset(i int) {
	if l := s.loops[i].Load(); l != nil {
		l.push(task{kind: tReset})
	}
}

// Snapshot is a consistent-enough view for health endpoints.
type Snapshot struct {
	Conns, Rooms int64
	Loops        int
}

// Snapshot returns counts for /healthz and metrics.
func (s *Server) Snapshot() Snapshot {
	sn := Snapshot{Conns: s.Stats.Conns.Load(), Loops: int(s.nloops.Load())}
	if s.hub != nil {
		sn.Rooms = int64(s.hub.Rooms())
	}
	return sn
}

// gnetLogger routes gnet's log lines into slog. gnet logs one harmless
// "stale connection" line per reset peer, harmless and frequent, so it is
// held at error level.
// The latest error lines are kept as the cause of a failure: the first
// names it (accept: too many open files), the next are the loops exiting.
type gnetLogger struct {
	l    *slog.Logger
	errs *errLines
}

func (g gnetLogger) Debugf(f string, a ...any) {}
func (g gnetLogger) Infof(f string, a ...any)  {}
func (g gnetLogger) Warnf(f string, a ...any)  {}
func (g gnetLogger) Errorf(f string, a ...any) { g.keep("gnet: " + fmt.Sprintf(f, a...)) }
func (g gnetLogger) Fatalf(f string, a ...any) { g.keep("gnet fatal: " + fmt.Sprintf(f, a...)) }

func (g gnetLogger) keep(msg string) {
	g.l.Error(msg)
	g.errs.add(msg)
}

// errLines keeps the latest few lines.
type errLines struct {
	mu    sync.Mutex
	lines []string
}

func (e *errLines) add(msg string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.lines) == 4 {
		copy(e.lines, e.lines[1:])
		e.lines = e.lines[:3]
	}
	e.lines = append(e.lines, msg)
}

func (e *errLines) String() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return strings.Join(e.lines, "; ")
}

var _ fanout.Loops = (*Server)(nil)
var _ persist.Sink = (*Server)(nil)

// rebroadcast is a committed message whose broker publish failed.
type rebroadcast struct {
	key   string
	seq   uint64
	frame []byte
	tries int
	due   time.Time
}

const (
	rebroadcastTries = 8 // about 25 s of retries with the backoff below
	rebroadcastFirst = 100 * time.Millisecond
	rebroadcastMax   = 5 * time.Second
)

// rebroadcastLater queues a failed broadcast for retry without blocking the
// publish worker. Order does not matter: receivers place messages by seq
// and drop what they already have (a retry that comes after a repair from
// the store is such a duplicate).
func (s *Server) rebroadcastLater(key string, seq uint64, frame []byte, err error) {
	select {
	case s.retries <- rebroadcast{key: key, seq: seq, frame: frame, due: time.Now().Add(rebroadcastFirst)}:
	default:
		// Retries full: a long broker outage. The broker's reconnect resets
		// every node, which then reads the rooms' tails from the store.
		s.Stats.BrokerDropped.Add(1)
	}
	s.logBrokerError(key, seq, err)
}

// logBrokerError logs a failed broadcast at most once a second: a broker
// outage fails every publish, and one line each would flood the log.
func (s *Server) logBrokerError(key string, seq uint64, err error) {
	now := time.Now().UnixNano()
	last := s.brokerLogged.Load()
	if now-last < int64(time.Second) || !s.brokerLogged.CompareAndSwap(last, now) {
		return
	}
	s.log.Warn("cannot broadcast committed message; retrying", "room", key, "seq", seq, "err", err,
		"failed_total", s.Stats.BrokerErrors.Load())
}

// rebroadcaster retries failed broadcasts. Its timer runs only while
// some are pending: an idle node does not wake for it.
func (s *Server) rebroadcaster() {
	defer s.wg.Done()
	var pending []rebroadcast
	t := time.NewTimer(rebroadcastFirst)
	t.Stop()
	armed := false
	for {
		select {
		case <-s.done:
			t.Stop()
			return
		case r := <-s.retries:
			pending = append(pending, r)
			if !armed {
				armed = true
				t.Reset(rebroadcastFirst)
			}
		case now := <-t.C:
			armed = false
			keep := pending[:0]
			for _, r := range pending {
				if now.Before(r.due) {
					keep = append(keep, r)
					continue
				}
				err := s.bus.Publish(context.Background(), r.key, r.seq, r.frame)
				if err == nil {
					s.Stats.Rebroadcasts.Add(1)
					continue
				}
				if r.tries++; r.tries >= rebroadcastTries {
					s.Stats.BrokerDropped.Add(1)
					continue
				}
				r.due = now.Add(min(rebroadcastFirst<<r.tries, rebroadcastMax))
				keep = append(keep, r)
			}
			clear(pending[len(keep):])
			pending = keep
			if len(pending) > 0 {
				armed = true
				t.Reset(rebroadcastFirst)
			}
		}
	}
}

// MaxConns is the connection budget in force (0: none).
func (s *Server) MaxConns() int { return s.cfg.MaxConns }
