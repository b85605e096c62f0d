// Package loop owns the client connections: the gnet event loops, the HTTP
// upgrade, RFC 6455 framing, the protocol commands, and the hand-offs
// between the loops and the goroutines that commit, read and broadcast.
//
// A connection belongs to exactly one loop for its whole life and is
// touched only on that loop's goroutine; there is no goroutine per
// connection. Work produced elsewhere (deliveries from the broker, acks from
// the publish pool, store reads) reaches a loop through that loop's inbox:
// one queue, one wake-up per batch. Outbound frames are queued per
// connection in the loop's outbound queue (fanout/outq, which fanout fills)
// and written once per flush tick: many frames, one writev.
//
// By file: loop.go the loop's state and its task switch; inbox.go the
// inbox; tick.go when the flush runs; flush.go the flush and its passes;
// write.go the socket writes (loop/internal/uring batches them); park.go
// connections waiting for their transport, and closing handshakes;
// sweep.go idle pings and timeouts (idle_linux.go: their pongs on the
// ring); conn.go a connection's frames and commands; realaddr.go the
// client's address behind a proxy (PROXY header, X-Forwarded-For).
package loop

import (
	"bufio"
	"bytes"
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

	"github.com/golang-jwt/jwt/v5"
	"github.com/panjf2000/gnet/v2"
	"github.com/panjf2000/gnet/v2/pkg/logging"
	"github.com/panjf2000/gnet/v2/pkg/pool/goroutine"

	"github.com/roost-chat/roost/fanout"
	"github.com/roost-chat/roost/fanout/hist"
	"github.com/roost-chat/roost/fanout/outq"
	"github.com/roost-chat/roost/fanout/proxy"
	"github.com/roost-chat/roost/fanout/tenancy"
	"github.com/roost-chat/roost/loop/internal/uring"
	"github.com/roost-chat/roost/loop/realip"
	"github.com/roost-chat/roost/proto"
)

// Config is the node's settings as main fills them from flags. It embeds
// fanout's (Loops, OutboundLimit, MaxRooms, Readers, GapWindow); Validate
// checks both.
type Config struct {
	fanout.Config
	Listen         string        // host:port of the client listener
	Insecure       bool          // ?user=&app= instead of a JWT; loopback only
	MaxFrame       int           // largest client message, bytes (1009 above)
	IdleInterval   time.Duration // server ping after this much silence; close after twice
	FlushInterval  time.Duration // outbound batching tick
	UpgradeTimeout time.Duration // a connection must finish its upgrade within this
	RetryMin       time.Duration // jittered reconnect hint of 1013 closes: [RetryMin, RetryMax)
	RetryMax       time.Duration
	// SSEMaxAge ends an SSE stream after about this long (0: never), with
	// a retry hint, so that long-lived listeners spread over nodes added
	// since.
	SSEMaxAge time.Duration
	// InboxLimit bounds a loop's inbox: a delivery that finds this many
	// tasks queued is not queued (its room is read from the store
	// instead), and new publishes on the loop get err overloaded.
	InboxLimit int
	// ShedAfter: while a loop's publishes take longer than this from read
	// to commit (smoothed), it answers new ones err overloaded (0: never).
	ShedAfter time.Duration
	// ProxyInFlight is the most proxy hook calls of one app in flight
	// from this node at once: the HTTP connections its backend sees from
	// it. ProxyQueue is the most calls of one app waiting behind those;
	// past it a call is not made and the app's fail mode answers.
	ProxyInFlight int
	ProxyQueue    int
	Apps          map[string][]byte // app id -> HS256 secret (--app-secret)
	// Registry: apps come from a registry (SetApps) too, so a node with
	// no Apps is still in token mode.
	Registry bool
	// Limits are the defaults of every app's limits (the registry
	// overrides them per app). MaxRooms is the ceiling of rooms per
	// connection: an app's max_rooms can lower it, not raise it.
	Limits tenancy.Limits
	// Leeway is the clock skew allowed on a token's exp, nbf and iat.
	Leeway time.Duration
	// JWKSRefresh is how often an app's JWKS is fetched again (0:
	// DefaultJWKSRefresh); a token with a kid the set lacks asks for one
	// fetch sooner.
	JWKSRefresh time.Duration
	// InsecureMaxApps caps the apps made on first use in insecure mode
	// (each is a metric series and a map entry); 0: no cap.
	InsecureMaxApps int
	// SignalRate and SignalBurst are one connection's signals per second
	// and the most it may send at once (err rate_limited past them;
	// SignalRate 0: no limit).
	SignalRate  float64
	SignalBurst int
	// MaxConns is the connection budget: TCP connections the client
	// listener holds at once, upgraded or not (0: no budget). main derives
	// it from RLIMIT_NOFILE minus a reserve, so that accept never meets
	// EMFILE. A connection past it is closed at once and counted.
	MaxConns int
	// MaxConnsPerIP caps the connections of one source address (0: no
	// cap), so that one host cannot take the whole budget.
	MaxConnsPerIP int
	// ProxyProtocol: every connection starts with a PROXY protocol
	// header (v1 or v2) naming the client; one that does not is closed.
	ProxyProtocol bool
	// TrustedProxies are the peers whose X-Forwarded-For and X-Real-IP
	// are believed on the upgrade request (empty: nobody's).
	TrustedProxies realip.Trusted
	// ReusePort lets several processes share the listen port
	// (SO_REUSEPORT across processes). Off, a port already in use fails
	// Start with "address already in use".
	ReusePort bool
	// IOURing lets each loop hand its one-frame writes to the kernel in
	// batches through an io_uring of its own (Linux 5.12 and later; where
	// the kernel refuses one the loop sends as without). Off: one send(2)
	// per frame.
	IOURing bool
	// NodeID names this node to operators and clients: it is sent as the
	// X-Roost-Node header of every upgrade response, so a client (or a
	// support engineer with its logs) can tell which node it is on.
	NodeID string
	// ClientScript is served at /roost.js in every mode and DemoPage at /
	// in insecure mode (main embeds both; nil serves nothing).
	ClientScript []byte
	DemoPage     []byte
}

// AppLimits are the defaults of every app's limits as the registry's
// snapshots resolve them (tenancy.NewSnapshot): Limits, with the node's
// --signal-rate and --signal-burst as the defaults of both chat buckets
// (signals; read, unread and receipts requests), which an app's registry
// entry may set apart.
func (c *Config) AppLimits() tenancy.Limits {
	lim := c.Limits
	lim.SignalRate, lim.SignalBurst = c.SignalRate, int64(c.SignalBurst)
	lim.ReadRate, lim.ReadBurst = c.SignalRate, int64(c.SignalBurst)
	return lim
}

// Defaults returns the documented defaults.
func Defaults() Config {
	return Config{
		Config: fanout.Config{
			Loops:         1,
			OutboundLimit: 1 << 20,
			MaxRooms:      256,
			Readers:       8,
			ReadQueue:     4096,
			GapWindow:     250 * time.Millisecond,
		},
		Listen:          "127.0.0.1:8080",
		MaxFrame:        64 << 10,
		IdleInterval:    25 * time.Second,
		IOURing:         true,
		FlushInterval:   4 * time.Millisecond, // p99 under 10 ms at 1,000 msg/s in a 330-member room; see docs/benchmarks.md
		UpgradeTimeout:  10 * time.Second,
		RetryMin:        500 * time.Millisecond,
		RetryMax:        5 * time.Second,
		ShedAfter:       time.Second,
		InboxLimit:      65536,
		ProxyInFlight:   proxy.DefaultInFlight,
		ProxyQueue:      proxy.DefaultQueue,
		Limits:          tenancy.DefaultLimits(),
		Leeway:          5 * time.Second,
		InsecureMaxApps: 100,
		SignalRate:      DefaultSignalRate,
		SignalBurst:     DefaultSignalBurst,
	}
}

// Server is the client side of a node: the gnet engine and its loops, in
// front of the publish path (fanout).
type Server struct {
	gnet.BuiltinEventEngine

	cfg  Config
	log  *slog.Logger
	fan  *fanout.Node
	apps *apps
	jwt  *jwt.Parser
	// hists are the loops' own histograms (Stats holds them as
	// Observers).
	hists histograms
	// proxy asks the apps' backends (their proxy hooks, proxy.go).
	proxy *proxy.Pool
	// nodeHeader ends every 101 response: "X-Roost-Node: ID\r\n\r\n".
	nodeHeader []byte
	// script and demo are the files of Config.ClientScript and DemoPage.
	script, demo *staticFile
	// realLater: a proxy may speak for clients (ProxyProtocol or
	// TrustedProxies), so a connection's address is settled at its
	// request head, not at accept (realaddr.go).
	realLater bool

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

	done     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup

	Stats Stats
}

// Stats are the node's counters, updated without locks.
type Stats struct {
	Conns      atomic.Int64  // open WebSocket connections
	SSEConns   atomic.Int64  // open SSE streams
	SSEOpened  atomic.Uint64 // SSE streams opened
	SSEMaxAge  atomic.Uint64 // SSE streams ended by SSEMaxAge
	Upgrading  atomic.Int64
	Accepted   atomic.Uint64
	FramesOut  atomic.Uint64 // frames handed to the kernel or gnet
	BytesOut   atomic.Uint64
	Writes     atomic.Uint64 // writev calls (frames/writes = batch size)
	FramesIn   atomic.Uint64
	Publishes  atomic.Uint64
	Acks       atomic.Uint64
	Overloaded atomic.Uint64 // publishes answered overloaded (queue or inbox full, draining, shed)
	Shed       atomic.Uint64 // of Overloaded: publishes refused by ShedAfter
	// InboxFull: of Overloaded, publishes refused because their loop's
	// inbox held InboxLimit tasks. InboxOverflow: deliveries not queued for
	// the same reason; their rooms were read from the store instead.
	InboxFull     atomic.Uint64
	InboxOverflow atomic.Uint64
	UpgradeErrors atomic.Uint64
	RefusedBudget atomic.Uint64 // connections closed at accept: MaxConns reached
	RefusedPerIP  atomic.Uint64 // connections closed at accept (behind a proxy naming the client: at its request head): MaxConnsPerIP reached
	InFlight      atomic.Int64  // publishes submitted and not yet answered
	Disconnected  atomic.Uint64 // connections closed by Disconnect (the server API's disconnect, from any node)
	// Ticks and Sweeps count the loops' timer wake-ups (flush ticks, idle
	// sweeps): an idle node shows none.
	Ticks  atomic.Uint64
	Sweeps atomic.Uint64
	// ShortTicks: of Ticks, those run at the shortened period (judgeTick),
	// which shows whether a loop's tick is halved at a given load.
	ShortTicks atomic.Uint64
	Pings      atomic.Uint64 // server pings sent (idle connections)
	// PongsHeld: idle connections whose pong was left in the socket for
	// the next sweep (idle_linux.go); PongsTaken: pongs that sweep took.
	PongsHeld  atomic.Uint64
	PongsTaken atomic.Uint64
	Ring       uring.Stats // the loops' io_uring batches

	// RefusedProxyHeader: connections closed because --proxy-protocol is
	// set and they did not start with a valid PROXY header.
	RefusedProxyHeader atomic.Uint64

	// Histograms: the loops' own (RegisterMetrics writes them), and the
	// loops' phases of fanout's roost_ack_phase_seconds. Observe takes no
	// lock and allocates nothing.
	WriteFrames fanout.Observer // frames per writev: the batch size of one write
	AckLatency  fanout.Observer // seconds from a pub frame read to its ack queued
	// The loop's share of an ack's time (fanout.AckPhases has the publish
	// path's): seconds from the publish path's answer to the ack queued
	// (the loop's inbox), and from the ack queued to its write to the
	// socket (the flush).
	AckInbox fanout.Observer
	AckWrite fanout.Observer

	// InboxDepth[i] is how many tasks loop i took in its latest inbox drain:
	// a loop falling behind shows as a growing number here.
	InboxDepth [fanout.MaxLoops]atomic.Int64
}

// histograms are the loops' own histograms, registered by
// RegisterMetrics.
type histograms struct {
	writeFrames *hist.Histogram // frames per writev: the batch size of one write
	ackLatency  *hist.Histogram // seconds from a pub frame read to its ack queued
}

// writeFramesBuckets are the bounds of roost_write_frames.
var writeFramesBuckets = []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}

type noObserver struct{}

func (noObserver) Observe(float64) {}

// monoEpoch anchors the publish stamps: time.Since reads the monotonic
// clock, so a wall-clock step cannot produce a negative latency.
var monoEpoch = time.Now()

// pubStamp is the loop's side of one publish, its fanout.Origin: the
// publishing connection, when its frame was read, and (filled by
// Published) the outcome. Stamps are recycled through their loop's free
// list (loop only), so a publish allocates none in steady state.
type pubStamp struct {
	c   *conn
	req *fanout.PubRequest
	t0  time.Duration // since monoEpoch
	seq uint64
	err error
}

// Published hands the outcome of a publish to its connection's loop
// (fanout.Origin). A publish worker calls it; the push publishes the
// outcome fields to the loop.
func (ps *pubStamp) Published(req *fanout.PubRequest) {
	ps.seq, ps.err = req.Seq, req.Err
	ps.c.l.push(task{kind: tAck, ack: ps})
}

// stamp returns a stamp for req, a publish of c read now. Loop only.
func (l *loopState) stamp(c *conn, req *fanout.PubRequest) *pubStamp {
	var ps *pubStamp
	if n := len(l.stamps); n > 0 {
		ps = l.stamps[n-1]
		l.stamps[n-1] = nil
		l.stamps = l.stamps[:n-1]
	} else {
		ps = new(pubStamp)
	}
	ps.c, ps.req, ps.t0 = c, req, time.Since(monoEpoch)
	l.inflight++
	l.srv.Stats.InFlight.Add(1)
	return ps
}

// unstamp recycles ps and returns how long ago its frame was read; with
// answered it also feeds that into commitLag. Loop only; ps must not be
// used afterwards.
func (l *loopState) unstamp(ps *pubStamp, answered bool) time.Duration {
	d := time.Since(monoEpoch) - ps.t0
	*ps = pubStamp{}
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

// New builds the client side of a node in front of fan, whose Config must
// be cfg.Config. It checks cfg first (Validate).
func New(cfg Config, fan *fanout.Node, log *slog.Logger) (*Server, error) {
	if errs := cfg.Validate(); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		cfg:     cfg,
		log:     log,
		fan:     fan,
		apps:    newApps(&cfg, log),
		jwt:     newTokenParser(cfg.Leeway),
		booted:  make(chan struct{}),
		stopped: make(chan struct{}),
		done:    make(chan struct{}),

		gnetErrs: new(errLines),
	}
	s.perIP.n = make(map[netip.Addr]int32)
	if fan != nil {
		s.apps.online = fan.Online // connection events (fanout/connevents.go)
	}
	s.realLater = cfg.ProxyProtocol || cfg.TrustedProxies.Any()
	s.proxy = proxy.New(proxy.Config{Workers: cfg.ProxyInFlight, Queue: cfg.ProxyQueue, Log: log})
	s.hists = histograms{
		writeFrames: hist.New("roost_write_frames", writeFramesBuckets),
		ackLatency:  hist.New("roost_ack_latency_seconds", hist.LatencyBuckets),
	}
	s.Stats.WriteFrames, s.Stats.AckLatency = s.hists.writeFrames, s.hists.ackLatency
	s.Stats.AckInbox, s.Stats.AckWrite = noObserver{}, noObserver{}
	if fan != nil {
		s.Stats.AckInbox, s.Stats.AckWrite = fan.LoopAckPhases()
	}
	if cfg.NodeID != "" {
		s.nodeHeader = []byte("X-Roost-Node: " + cfg.NodeID + "\r\n\r\n")
	}
	// A new node version may bring a new client: browsers revalidate
	// (cheaply, by ETag) after five minutes.
	s.script = newStaticFile(cfg.ClientScript, "text/javascript; charset=utf-8", "public, max-age=300")
	s.demo = newStaticFile(cfg.DemoPage, "text/html; charset=utf-8", "no-cache")
	if fan != nil {
		fan.SetUserLoops(s.loopsOf)
	}
	return s, nil
}

// Validate checks every setting of the node and returns one error per bad
// value, each naming the flag to change.
func (c *Config) Validate() []error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if host, _, err := net.SplitHostPort(c.Listen); err != nil {
		bad("invalid --listen %q: want host:port", c.Listen)
	} else if ip := net.ParseIP(host); c.Insecure && host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		bad("invalid --listen %q with --insecure: insecure mode listens on loopback only (use 127.0.0.1:PORT or drop --insecure)", c.Listen)
	}
	if c.Limits.MaxTokenTTL < 0 {
		bad("invalid --max-token-ttl %s: want 0 (no bound) or more", c.Limits.MaxTokenTTL)
	}
	if c.JWKSRefresh < 0 || c.JWKSRefresh > 0 && c.JWKSRefresh < time.Second {
		bad("invalid --jwks-refresh %s: want at least 1s", c.JWKSRefresh)
	}
	if c.Leeway < 0 || c.Leeway > time.Hour {
		bad("invalid --token-leeway %s: want 0 to 1h", c.Leeway)
	}
	if c.InsecureMaxApps < 0 {
		bad("invalid --insecure-max-apps %d: want 0 (no cap) or more", c.InsecureMaxApps)
	}
	if l := &c.Limits; l.MaxConns < 0 || l.MaxUserConns < 0 || l.PubBurst < 0 || l.MaxMsg < 0 {
		bad("invalid limits: --app-max-conns, --user-max-conns, --pub-burst and --max-msg want 0 (off) or more")
	}
	if l := &c.Limits; !(l.PubRate >= 0) || !(l.AppPubRate >= 0) {
		bad("invalid rates: --pub-rate and --app-pub-rate want 0 (off) or more per second")
	} else if l.PubRate > 0 && l.PubBurst < 1 {
		bad("invalid --pub-burst %d: want at least 1 with --pub-rate %g", l.PubBurst, l.PubRate)
	}
	if !c.Insecure && len(c.Apps) == 0 && !c.Registry {
		bad("no apps for --listen %q: give --apps FILE, --database-url, or --app-secret APP=SECRET (in ROOST_APP_SECRET), or run with --insecure on a loopback address", c.Listen)
	}
	for id, sec := range c.Apps {
		if !proto.ValidAppID([]byte(id)) || len(sec) == 0 {
			bad("invalid --app-secret entry for app %q: want APP=SECRET with APP matching [A-Za-z0-9_.-]{1,64}", id)
		}
	}
	if c.MaxFrame < 125 || c.MaxFrame > 16<<20 {
		bad("invalid --max-frame %d: want 125 to 16777216 bytes", c.MaxFrame)
	}
	if c.OutboundLimit < 4<<10 || c.OutboundLimit > outq.MaxLimit {
		bad("invalid --outbound-limit %d: want 4096 to %d bytes", c.OutboundLimit, outq.MaxLimit)
	}
	if c.IdleInterval < 100*time.Millisecond {
		bad("invalid --idle %s: want at least 100ms", c.IdleInterval)
	}
	if c.Loops < 1 || c.Loops > fanout.MaxLoops {
		bad("invalid --loops %d: want 1 to %d", c.Loops, fanout.MaxLoops)
	}
	if c.FlushInterval < 100*time.Microsecond || c.FlushInterval > time.Second {
		bad("invalid --flush %s: want 100µs to 1s", c.FlushInterval)
	}
	if c.InboxLimit < 16 {
		bad("invalid --inbox-limit %d: want at least 16", c.InboxLimit)
	}
	if c.ProxyInFlight < 1 || c.ProxyInFlight > proxy.MaxInFlight {
		bad("invalid --proxy-inflight %d: want 1 to %d", c.ProxyInFlight, proxy.MaxInFlight)
	}
	if c.ProxyQueue < 1 || c.ProxyQueue > proxy.MaxQueue {
		bad("invalid --proxy-queue %d: want 1 to %d", c.ProxyQueue, proxy.MaxQueue)
	}
	if c.ShedAfter < 0 || (c.ShedAfter > 0 && c.ShedAfter < 10*time.Millisecond) {
		bad("invalid --shed-after %s: want 0 (never) or at least 10ms", c.ShedAfter)
	}
	if c.UpgradeTimeout <= 0 {
		bad("invalid --upgrade-timeout %s: want a positive duration", c.UpgradeTimeout)
	}
	if c.MaxRooms < 1 {
		bad("invalid --max-rooms %d: want at least 1", c.MaxRooms)
	}
	if c.MaxConns < 0 {
		bad("invalid --max-conns %d: want 0 (from the open-file limit) or more", c.MaxConns)
	}
	if c.MaxConnsPerIP < 0 {
		bad("invalid --max-conns-per-ip %d: want 0 (no cap) or more", c.MaxConnsPerIP)
	}
	if c.Readers < 1 || c.Readers > 1024 {
		bad("invalid --readers %d: want 1 to 1024", c.Readers)
	}
	if c.ReadQueue < 1 || c.ReadQueue > 1<<20 {
		bad("invalid --read-queue %d: want 1 to 1048576", c.ReadQueue)
	}
	if c.GapWindow <= 0 {
		bad("invalid --gap-window %s: want a positive duration", c.GapWindow)
	}
	if c.RetryMin < time.Millisecond {
		bad("invalid --retry-min %s: want at least 1ms", c.RetryMin)
	}
	if c.SSEMaxAge < 0 {
		bad("invalid --sse-max-age %s: want 0 (never) or a positive duration", c.SSEMaxAge)
	}
	if c.RetryMax <= c.RetryMin {
		bad("invalid --retry-max %s: want more than --retry-min (%s)", c.RetryMax, c.RetryMin)
	}
	if !validNodeID(c.NodeID) {
		bad("invalid --node-id %q: want up to 128 of [A-Za-z0-9_.:-]", c.NodeID)
	}
	return errs
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
	// gnet's global goroutine pool serves only Register and Enroll
	// (outbound or adopted connections), which the server never calls;
	// running, it wakes the process twice a second for its clock and its
	// idle-worker purge. Released, an idle node does not wake for it.
	goroutine.DefaultWorkerPool.Release()
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
	host, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return nil
	}
	port, err := strconv.ParseUint(ps, 10, 16)
	if err != nil {
		return nil
	}
	// Listeners on the same port but another address (127.0.0.2:P beside
	// 127.0.0.1:P) do not share our clients; a wildcard on either side does.
	var ip netip.Addr
	if ta, err := net.ResolveTCPAddr("tcp", net.JoinHostPort(host, ps)); err == nil {
		ip, _ = netip.AddrFromSlice(ta.IP)
		ip = ip.Unmap()
	}
	var listening []string
	rd := bufio.NewReaderSize(nil, procBuf)
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		listening = procListeners(f, rd, port, ip, listening)
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

// procBuf bounds what one read of /proc/net/tcp{,6} holds: lines are 150
// (tcp) or 180 (tcp6) bytes, so 32 KiB takes some 200 lines a read.
const procBuf = 32 << 10

// procListeners appends the inodes of the sockets of table f (in the
// format of /proc/net/tcp{,6}) that listen on port at ip (or a wildcard on
// either side) to out. It streams the table through rd: on a host with
// hundreds of thousands of sockets, reading it whole left tens of MB of
// garbage in a fresh node's heap. Only LISTEN lines are decoded, and only
// those on port cost an allocation (the inode kept). A line longer than
// rd's buffer is decoded from the part the buffer holds (the ten fields
// read come first) and the rest skipped. Where f cannot be read, what
// was found so far stands.
func procListeners(f string, rd *bufio.Reader, port uint64, ip netip.Addr, out []string) []string {
	fh, err := os.Open(f)
	if err != nil {
		return out
	}
	defer fh.Close()
	rd.Reset(fh)
	for first := true; ; first = false {
		line, err := rd.ReadSlice('\n')
		if len(line) > 0 && !first { // the first line is the header
			out = procLine(line, port, ip, out)
		}
		for err == bufio.ErrBufferFull { // the rest of a long line
			_, err = rd.ReadSlice('\n')
		}
		if err != nil {
			return out
		}
	}
}

// procLine appends the inode of line (of /proc/net/tcp{,6}) to out when
// the socket listens on port at ip or a wildcard on either side.
func procLine(line []byte, port uint64, ip netip.Addr, out []string) []string {
	var fl [10][]byte // fields 0..9: sl, local, remote, st, ..., inode
	n := 0
	for i := 0; i < len(line) && n < len(fl); {
		for i < len(line) && procSpace(line[i]) {
			i++
		}
		j := i
		for j < len(line) && !procSpace(line[j]) {
			j++
		}
		if j > i {
			fl[n] = line[i:j]
			n++
		}
		i = j
	}
	if n < len(fl) || string(fl[3]) != "0A" { // 0A: LISTEN
		return out
	}
	hexIP, hexPort, ok := bytes.Cut(fl[1], []byte{':'})
	if p, pok := procHex(hexPort); !ok || !pok || p != port {
		return out
	}
	if theirs, ok := procAddr(hexIP); ok && ip.IsValid() && !ip.IsUnspecified() && !theirs.IsUnspecified() && theirs != ip {
		return out
	}
	return append(out, string(fl[9]))
}

// procSpace is the ASCII white space strings.Fields splits at (the
// tables are ASCII).
func procSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'
}

// procHex parses up to 16 hex digits (a port of /proc/net/tcp) without
// the string conversion strconv would need.
func procHex(h []byte) (uint64, bool) {
	if len(h) == 0 || len(h) > 16 {
		return 0, false
	}
	var v uint64
	for _, c := range h {
		d, ok := hexDigit(c)
		if !ok {
			return 0, false
		}
		v = v<<4 | uint64(d)
	}
	return v, true
}

func hexDigit(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
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

// procAddr decodes an address of /proc/net/tcp{,6}: the bytes of the
// address in hex, each 32-bit word in host (little-endian) order.
func procAddr[S ~string | ~[]byte](h S) (netip.Addr, bool) {
	if len(h) != 8 && len(h) != 32 {
		return netip.Addr{}, false
	}
	var b [16]byte
	n := len(h) / 2
	for i := 0; i < n; i++ {
		hi, ok1 := hexDigit(h[2*i])
		lo, ok2 := hexDigit(h[2*i+1])
		if !ok1 || !ok2 {
			return netip.Addr{}, false
		}
		// byte i of the hex string is byte (i/4)*4 + 3 - i%4 of the address
		b[i/4*4+3-i%4] = hi<<4 | lo
	}
	if n == 4 {
		return netip.AddrFrom4([4]byte{b[0], b[1], b[2], b[3]}), true
	}
	return netip.AddrFrom16(b).Unmap(), true
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
	if !s.eachLoop(drainRound{}) { // code 0: refuse, close nothing yet
		return // the loops are gone, and their connections with them
	}
	for s.Stats.InFlight.Load() > 0 && time.Since(start) < window/2 && !s.Dead() {
		time.Sleep(2 * time.Millisecond) // off the hot path: once per shutdown
	}
	rest := window - time.Since(start)
	rounds := max(1, min(int(rest/(100*time.Millisecond)), 50))
	step := rest / time.Duration(rounds)
	for r := rounds; r >= 1; r-- {
		if !s.eachLoop(drainRound{code: code, roundsLeft: r}) {
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

// eachLoop runs round on every loop and waits until all have run it. It
// reports false, without waiting, when the engine has stopped: a task
// pushed to a loop that no longer runs never runs.
func (s *Server) eachLoop(round drainRound) bool {
	n := int(s.nloops.Load())
	var wg sync.WaitGroup
	round.done = wg.Done
	for i := 0; i < n; i++ {
		wg.Add(1)
		r := round
		s.loops[i].Load().push(task{kind: tDrain, drain: &r})
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
		s.proxy.Close()
		s.apps.jwks.stop()
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

// Snapshot is a consistent-enough view for health endpoints.
type Snapshot struct {
	Conns, Rooms int64
	Loops        int // the event loops running: every configured one once gnet has booted
}

// Snapshot returns counts for /healthz and metrics.
func (s *Server) Snapshot() Snapshot {
	sn := Snapshot{Conns: s.Stats.Conns.Load(), Rooms: int64(s.fan.Rooms())}
	// gnet starts every configured loop at boot; a loop's state here is made
	// only at its first connection, so counting those would call an idle
	// node's loops missing.
	select {
	case <-s.booted:
		sn.Loops = s.cfg.Loops
	default:
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

// MaxConns is the connection budget in force (0: none).
func (s *Server) MaxConns() int { return s.cfg.MaxConns }
