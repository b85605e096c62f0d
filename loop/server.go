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
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"
	"github.com/panjf2000/gnet/v2/pkg/logging"

	"github.com/roost-chat/roost/fanout"
	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
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
	Apps           map[string][]byte // app id -> HS256 secret (production mode)
}

// Defaults returns the documented defaults.
func Defaults() Config {
	return Config{
		Listen:         "127.0.0.1:8080",
		MaxFrame:       64 << 10,
		OutboundLimit:  1 << 20,
		IdleInterval:   25 * time.Second,
		Loops:          1,
		FlushInterval:  5 * time.Millisecond,
		UpgradeTimeout: 10 * time.Second,
		MaxRooms:       256,
		Readers:        8,
		GapWindow:      250 * time.Millisecond,
		RetryMin:       500 * time.Millisecond,
		RetryMax:       5 * time.Second,
	}
}

// Publisher hands committed messages to the broker (pubsub.Broker fits).
type Publisher interface {
	Publish(ctx context.Context, key string, seq uint64, frame []byte) error
}

// Submitter takes publishes to commit (persist.Pool fits).
type Submitter interface {
	Submit(req *persist.PubRequest) error
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

	addr    string // resolved listen address
	eng     gnet.Engine
	booted  chan struct{}
	stopped chan struct{}
	runErr  error

	loopsMu sync.Mutex
	loops   [fanout.MaxLoops]atomic.Pointer[loopState]
	nloops  atomic.Int32

	reads chan readJob
	clock atomic.Int64 // Unix ms, refreshed by the ticker goroutine
	done  chan struct{}
	wg    sync.WaitGroup

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
	BrokerErrors  atomic.Uint64
	Overloaded    atomic.Uint64
	UpgradeErrors atomic.Uint64
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
		done:    make(chan struct{}),
	}
	s.clock.Store(time.Now().UnixMilli())
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
	case c.Readers < 1:
		return errors.New("readers must be positive: set --readers")
	case c.RetryMax <= c.RetryMin:
		return errors.New("retry window empty: RetryMax must exceed RetryMin")
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
	for i := 0; i < s.cfg.Readers; i++ {
		s.wg.Add(1)
		go s.reader()
	}
	s.wg.Add(1)
	go s.ticker()
	go func() {
		defer close(s.stopped)
		s.runErr = gnet.Run(s, "tcp://"+addr,
			gnet.WithMulticore(s.cfg.Loops > 1),
			gnet.WithNumEventLoop(s.cfg.Loops),
			gnet.WithReusePort(true),
			gnet.WithTCPNoDelay(gnet.TCPNoDelay),
			gnet.WithLogger(gnetLogger{s.log}),
			gnet.WithLogLevel(logging.ErrorLevel),
		)
	}()
	select {
	case <-s.booted:
		return nil
	case <-s.stopped:
		return fmt.Errorf("cannot listen on %s: %w", addr, s.runErr)
	}
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

// Drain closes every connection with code and a jittered retry hint
// (1001 or 1013), spread over window so clients do not reconnect in one
// storm. It returns when every loop has sent its closes.
func (s *Server) Drain(code int, window time.Duration) {
	n := int(s.nloops.Load())
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		l := s.loops[i].Load()
		wg.Add(1)
		l.push(task{kind: tDrain, n: uint64(code), seq: uint64(window), done: wg.Done})
	}
	wg.Wait()
}

// Stop stops the engine, the ticker and the readers.
func (s *Server) Stop(ctx context.Context) error {
	close(s.done)
	var err error
	select {
	case <-s.booted:
		err = s.eng.Stop(ctx)
	default:
	}
	s.wg.Wait()
	<-s.stopped
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
	s.loops[n].Store(l)
	s.nloops.Store(int32(n + 1))
	return l
}

// ticker posts flush ticks and housekeeping to the loops. gnet's OnTick
// runs off-loop too, so it could only do the same; a goroutine of our own
// keeps the tick independent of gnet's options.
func (s *Server) ticker() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.FlushInterval)
	defer t.Stop()
	lastSweep := time.Now()
	for {
		select {
		case <-s.done:
			return
		case now := <-t.C:
			s.clock.Store(now.UnixMilli())
			sweep := now.Sub(lastSweep) >= time.Second
			if sweep {
				lastSweep = now
			}
			n := int(s.nloops.Load())
			for i := 0; i < n; i++ {
				l := s.loops[i].Load()
				switch {
				case sweep:
					l.push(task{kind: tSweep})
				case l.needFlush.Load():
					l.push(task{kind: tFlush})
				}
			}
		}
	}
}

// retryMS is a jittered reconnect delay for 1013 closes.
func (s *Server) retryMS() int {
	lo, hi := s.cfg.RetryMin.Milliseconds(), s.cfg.RetryMax.Milliseconds()
	return int(lo + rand.Int64N(hi-lo))
}

// Committed is called by the publish pool's workers (persist.Sink), in seq
// order per room: the frame goes to the broker first, then the ack to the
// publisher's loop, so an ack always means "stored and on its way".
func (s *Server) Committed(req *persist.PubRequest, res *persist.PubResult) {
	if res.Err == nil && !res.Duplicate {
		if err := s.bus.Publish(context.Background(), req.Key, res.Seq, res.Frame); err != nil {
			// Stored but not broadcast: receivers repair the gap from the
			// store when the next message of the room shows it.
			s.Stats.BrokerErrors.Add(1)
			s.log.Warn("cannot broadcast committed message", "room", req.Key, "seq", res.Seq, "err", err)
		}
	}
	c := req.Origin.(*conn)
	c.l.push(task{kind: tAck, conn: c, req: req, seq: res.Seq, err: res.Err})
}

// Deliver queues a message for loop i (fanout.Loops).
func (s *Server) Deliver(i int, key string, seq uint64, frame []byte) {
	s.loops[i].Load().push(task{kind: tDeliver, key: key, seq: seq, frame: frame})
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
// "stale connection" line per reset peer (GNET-NOTES 9), so it is held at
// error level.
type gnetLogger struct{ l *slog.Logger }

func (g gnetLogger) Debugf(f string, a ...any) {}
func (g gnetLogger) Infof(f string, a ...any)  {}
func (g gnetLogger) Warnf(f string, a ...any)  {}
func (g gnetLogger) Errorf(f string, a ...any) { g.l.Error("gnet: " + fmt.Sprintf(f, a...)) }
func (g gnetLogger) Fatalf(f string, a ...any) { g.l.Error("gnet fatal: " + fmt.Sprintf(f, a...)) }

var _ fanout.Loops = (*Server)(nil)
var _ persist.Sink = (*Server)(nil)
var _ = proto.OpJoin
