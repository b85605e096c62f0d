//go:build linux

package bench

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gobwas/ws"
	"golang.org/x/sys/unix"

	"github.com/roost-chat/roost/proto"
)

// The engine drives every bench connection from a few epoll loops, one per
// GOMAXPROCS, never a goroutine per connection: at tens of thousands of
// connections a goroutine each would cost the bench more CPU and memory
// than the node it measures. Each loop owns its connections outright (no
// locks on the receive path), reads into one shared buffer, decodes in
// place, records into its own histograms, and writes each connection's
// pending frames once per iteration.

const (
	loopTick     = time.Millisecond // epoll timeout: the publishing granularity
	readBufSize  = 256 << 10
	maxOutBuffer = 4 << 20 // a publisher whose node stopped reading is paused, not grown
)

// connection states
const (
	stConnecting = iota
	stUpgrading
	stJoining
	stReady
	stClosed
	stAway // closed by the node or the network, waiting to reconnect (--reconnect)
)

// reconnect policies
const (
	reconnectOff  = iota
	reconnectSame // back to the node it was on
	reconnectNext // each attempt to the next --url: a killed node's clients move over
)

// target is one node URL.
type target struct {
	host      string // Host header
	addr      unix.SockaddrInet4
	pathQuery string // path and query without user/app
}

func parseTarget(raw string) (target, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return target{}, fmt.Errorf("cannot parse --url %q: %w", raw, err)
	}
	if u.Scheme != "ws" {
		return target{}, fmt.Errorf("cannot use --url %q: only ws:// is supported (run the node with --insecure)", raw)
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		return target{}, fmt.Errorf("cannot use --url %q: host needs a port: %w", raw, err)
	}
	ip := net.ParseIP(host).To4()
	if ip == nil {
		return target{}, fmt.Errorf("cannot use --url %q: host must be an IPv4 address", raw)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p <= 0 || p > 65535 {
		return target{}, fmt.Errorf("cannot use --url %q: bad port", raw)
	}
	t := target{host: u.Host, addr: unix.SockaddrInet4{Port: p}}
	copy(t.addr.Addr[:], ip)
	t.pathQuery = u.EscapedPath()
	if t.pathQuery == "" {
		t.pathQuery = "/ws"
	}
	t.pathQuery += "?"
	if u.RawQuery != "" {
		t.pathQuery += u.RawQuery + "&"
	}
	return t, nil
}

func parseSource(s string) (unix.SockaddrInet4, error) {
	ip := net.ParseIP(s).To4()
	if ip == nil {
		return unix.SockaddrInet4{}, fmt.Errorf("cannot use --src %q: not an IPv4 address", s)
	}
	var a unix.SockaddrInet4
	copy(a.Addr[:], ip)
	return a, nil
}

// connSpec says what one connection does.
type connSpec struct {
	user      string
	target    int
	src       int   // index into sources, -1 for the kernel's choice
	room      int32 // -1: joins nothing
	join      bool
	publish   bool
	receivers int // joined members of the publisher's room (for expected deliveries)
	burst     int // its share of --burst
}

// conn is one bench connection; only its loop touches it after add.
type conn struct {
	fd     int
	state  uint8
	dirty  bool
	sse    bool // listens over SSE (--transport sse)
	spec   *connSpec
	target int // the --url this socket went to (the spec's, unless a reconnect moved it)
	room   []byte
	in     []byte
	out    []byte
	ck     SeqChecker

	// reconnection (--reconnect): the conn struct outlives its sockets, so
	// that its checker and its unacked publishes carry over
	away     bool  // lost its first socket: handshake failures retry instead of failing the run
	closedAt int64 // when the last socket was lost
	retryAt  int64
	attempts int
	joinSent int64 // when the last join was sent: older messages are catch-up
	epoch    []byte

	// publisher state
	resendIDs []uint64
	resendAt  int64
	refusals  int // refusals in a row: the wait before sending again doubles with each
	tokens    float64
	lastFill  int64
	nextID    uint64
	inflight  []sendSlot // ring indexed by id, grown when a slot is still in flight
	ackMax    uint64
	burstSent int // of its spec.burst
}

type sendSlot struct {
	id     uint64
	t      int64
	size   int32
	resent bool
	burst  bool // one of the --burst's publishes
}

// levelStats is what one loop (or one process) counted in one level. It is
// the unit merged across loops and processes.
type levelStats struct {
	Sent         uint64 `json:"sent"`          // publishes sent in the window
	Acked        uint64 `json:"acked"`         // of those, acked
	Expected     uint64 `json:"expected"`      // deliveries the window's publishes owe
	Delivered    uint64 `json:"delivered"`     // deliveries of window publishes received
	RecvFrames   uint64 `json:"recv_frames"`   // msg frames received during the window
	BenchDropped uint64 `json:"bench_dropped"` // publishes the bench could not send on time
	Lat          Hist   `json:"-"`
	AckLat       Hist   `json:"-"`
	Closes       map[int]uint64
	Errors       map[string]uint64
	Gaps         uint64 `json:"gaps"`
	Missing      uint64 `json:"missing"`
	Duplicates   uint64 `json:"duplicates"`
	Reordered    uint64 `json:"reordered"`
	// per room index: highest acked seq and lowest in-order seq of an open
	// member, to check every ack against receipts
	AckMax map[int32]uint64 `json:"ack_max,omitempty"`
	// since connect, whatever the window: to compare with the node's counters
	TotalSent   uint64           `json:"total_sent"`
	TotalFrames uint64           `json:"total_frames"` // text frames received
	LastMin     map[int32]uint64 `json:"last_min,omitempty"`
	// per room index: the member holding LastMin, to say who missed what
	LastWho map[int32]Lagger `json:"last_who,omitempty"`

	// reconnection, since connect
	Rejoins  uint64 `json:"rejoins"`   // connections joined again after losing their socket
	Unrecov  uint64 `json:"unrecov"`   // rejoins told recovered:false
	ToldLost uint64 `json:"told_lost"` // seqs those rejoins said will not follow
	Resent   uint64 `json:"resent"`    // publishes sent again (same id) after a lost socket or an err
	Away     uint64 `json:"away"`      // connections not joined when the level ended
	Replayed uint64 `json:"replayed"`  // window deliveries that arrived as catch-up
	Series   []slot `json:"-"`

	// --burst: its publishes sent in the window (in Sent too), acked, and
	// the last one's ack (Unix ns)
	BurstSent    uint64 `json:"burst_sent"`
	BurstAcked   uint64 `json:"burst_acked"`
	BurstLastAck int64  `json:"burst_last_ack_ns"`

	// --read-marks: marks sent in the window, and answers received
	ReadMarks   uint64 `json:"read_marks"`
	ReadAnswers uint64 `json:"read_answers"`
}

func newLevelStats() *levelStats {
	return &levelStats{Closes: map[int]uint64{}, Errors: map[string]uint64{}}
}

func (s *levelStats) merge(o *levelStats) {
	s.Sent += o.Sent
	s.Acked += o.Acked
	s.Expected += o.Expected
	s.Delivered += o.Delivered
	s.RecvFrames += o.RecvFrames
	s.BenchDropped += o.BenchDropped
	s.Lat.Merge(&o.Lat)
	s.AckLat.Merge(&o.AckLat)
	for k, v := range o.Closes {
		s.Closes[k] += v
	}
	for k, v := range o.Errors {
		s.Errors[k] += v
	}
	s.TotalSent += o.TotalSent
	s.TotalFrames += o.TotalFrames
	s.Gaps += o.Gaps
	s.Missing += o.Missing
	s.Duplicates += o.Duplicates
	s.Reordered += o.Reordered
	s.Rejoins += o.Rejoins
	s.Unrecov += o.Unrecov
	s.ToldLost += o.ToldLost
	s.Resent += o.Resent
	s.Away += o.Away
	s.Replayed += o.Replayed
	s.Series = mergeSlots(s.Series, o.Series)
	s.BurstSent += o.BurstSent
	s.BurstAcked += o.BurstAcked
	s.BurstLastAck = max(s.BurstLastAck, o.BurstLastAck)
	s.ReadMarks += o.ReadMarks
	s.ReadAnswers += o.ReadAnswers
	for r, v := range o.AckMax {
		if s.AckMax == nil {
			s.AckMax = map[int32]uint64{}
		}
		if v > s.AckMax[r] {
			s.AckMax[r] = v
		}
	}
	for r, v := range o.LastMin {
		if s.LastMin == nil {
			s.LastMin = map[int32]uint64{}
		}
		if cur, ok := s.LastMin[r]; !ok || v < cur {
			s.LastMin[r] = v
			if w, ok := o.LastWho[r]; ok {
				if s.LastWho == nil {
					s.LastWho = map[int32]Lagger{}
				}
				s.LastWho[r] = w
			}
		}
	}
}

// Lagger is the member of a room furthest behind at the end of a level:
// where it listened and when it last joined, to place a missed ack in the
// run's faults.
type Lagger struct {
	User    string  `json:"user"`
	Node    int     `json:"node"`     // index of the --url its socket went to
	Last    uint64  `json:"last"`     // its highest seq in order
	JoinedS float64 `json:"joined_s"` // its last join, seconds after the engine started
	Rejoin  bool    `json:"rejoined"`
}

// engine owns the loops and the run's phase.
type engine struct {
	targets []target
	sources []unix.SockaddrInet4
	rooms   []string
	app     string
	secret  []byte // non-nil: connect with a token of app minted per connection
	sse     bool   // receivers listen over SSE (--transport sse)
	signals bool   // publishers send signals (delivery --signals): no id, no ack, no seq

	loops []*loop
	sem   chan struct{}

	ready    atomic.Int64
	failed   atomic.Int64
	errMu    sync.Mutex
	firstErr error

	// phase, read by the loops every iteration
	pubOn    atomic.Bool
	rateBits atomic.Uint64 // per-publisher msgs/s as float64 bits
	winStart atomic.Int64
	winEnd   atomic.Int64
	// --burst: when it starts (Unix ns; 0: none) and how long it takes
	burstStart, burstOver atomic.Int64
	epoch                 atomic.Uint64
	stop                  atomic.Bool

	sizeFn func(rng *uint64) int // body size of the next publish

	readMarks bool // --read-marks: receivers mark each message read

	reconnect          int
	placed             int   // targets[:placed] are --url, the rest --reconnect-url
	retryMin, retryMax int64 // ns: the jitter of a reconnect without a node's hint

	// --series: set before the snapshot that starts a level
	serStart, serStep atomic.Int64
	serLen            atomic.Int64

	wg sync.WaitGroup
}

func newEngine(targets []target, sources []unix.SockaddrInet4, rooms []string, app string, secret []byte, loops, dialConc int, sizeFn func(*uint64) int) (*engine, error) {
	if len(secret) == 0 {
		secret = nil
	}
	e := &engine{targets: targets, sources: sources, rooms: rooms, app: app, secret: secret, sizeFn: sizeFn,
		sem: make(chan struct{}, dialConc)}
	e.winStart.Store(math.MaxInt64)
	e.winEnd.Store(math.MaxInt64)
	for i := 0; i < loops; i++ {
		l, err := newLoop(e, uint64(i)+uint64(time.Now().UnixNano()))
		if err != nil {
			e.close()
			return nil, err
		}
		e.loops = append(e.loops, l)
	}
	for _, l := range e.loops {
		e.wg.Add(1)
		go l.run()
	}
	return e, nil
}

func (e *engine) fail(err error) {
	e.failed.Add(1)
	e.errMu.Lock()
	if e.firstErr == nil {
		e.firstErr = err
	}
	e.errMu.Unlock()
}

// connect opens every spec's connection, at most cap(sem) handshakes in
// flight (a burst beyond the node's accept backlog would only cost SYN
// retransmits), and waits until each is ready or failed.
func (e *engine) connect(specs []*connSpec, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	go func() {
		for i, s := range specs {
			if e.stop.Load() {
				return
			}
			e.sem <- struct{}{}
			fd, err := e.dial(s)
			if err != nil {
				<-e.sem
				e.fail(err)
				continue
			}
			c := &conn{fd: fd, spec: s, target: s.target, sse: e.sse && s.join && !s.publish}
			if s.room >= 0 {
				c.room = []byte(e.rooms[s.room])
			}
			e.loops[i%len(e.loops)].add(c)
		}
	}()
	want := int64(len(specs))
	for e.ready.Load()+e.failed.Load() < want {
		if time.Now().After(deadline) {
			return fmt.Errorf("cannot connect: %d of %d ready after %v (raise --connect-timeout)", e.ready.Load(), want, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if f := e.failed.Load(); f > 0 {
		e.errMu.Lock()
		defer e.errMu.Unlock()
		return fmt.Errorf("cannot connect %d of %d connections: first error: %w", f, want, e.firstErr)
	}
	return nil
}

func (e *engine) dial(s *connSpec) (int, error) { return e.dialTo(s, s.target) }

func (e *engine) dialTo(s *connSpec, target int) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("cannot create socket: %w", err)
	}
	_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	// receipt times from the kernel: see rx
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("cannot enable receive timestamps: %w", err)
	}
	if s.src >= 0 {
		// several source addresses multiply the 28k ephemeral ports of one
		// (source, destination) pair
		_ = unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT, 1)
		sa := e.sources[s.src]
		if err := unix.Bind(fd, &sa); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("cannot bind source %v: %w", net.IP(sa.Addr[:]), err)
		}
	}
	ta := e.targets[target].addr
	if err := unix.Connect(fd, &ta); err != nil && !errors.Is(err, unix.EINPROGRESS) {
		unix.Close(fd)
		return -1, fmt.Errorf("cannot connect to %s: %w", e.targets[target].host, err)
	}
	return fd, nil
}

func (e *engine) setRate(perPublisher float64) { e.rateBits.Store(math.Float64bits(perPublisher)) }

// snapshot takes every loop's stats for the level that just ended and
// starts fresh ones.
func (e *engine) snapshot(verify bool) *levelStats {
	for _, l := range e.loops {
		l.verify.Store(verify)
	}
	e.epoch.Add(1)
	total := newLevelStats()
	for _, l := range e.loops {
		total.merge(<-l.snap)
	}
	return total
}

// live sums the loops' running counters for the progress line.
func (e *engine) live() (sent, recv, errs uint64, p99 time.Duration) {
	for _, l := range e.loops {
		sent += l.liveSent.Load()
		recv += l.liveRecv.Load()
		errs += l.liveErrs.Load()
		if v := time.Duration(l.liveP99.Load()); v > p99 {
			p99 = v
		}
	}
	return
}

// liveDrained reports whether every window publish is acked and delivered
// (only meaningful when all members live in this process).
func (e *engine) liveDrained() bool {
	var sent, acked, exp, del uint64
	for _, l := range e.loops {
		sent += l.liveWinSent.Load()
		acked += l.liveWinAcked.Load()
		exp += l.liveWinExp.Load()
		del += l.liveWinDel.Load()
	}
	return acked >= sent && del >= exp
}

// iterations reads every loop's iteration count.
func (e *engine) iterations() []uint64 {
	out := make([]uint64, len(e.loops))
	for i, l := range e.loops {
		out[i] = l.iter.Load()
	}
	return out
}

// iteratedSince reports whether every loop finished two iterations since
// iterations returned before: then one ran wholly after that moment.
func (e *engine) iteratedSince(before []uint64) bool {
	for i, l := range e.loops {
		if l.iter.Load() < before[i]+2 {
			return false
		}
	}
	return true
}

func (e *engine) close() {
	e.stop.Store(true)
	e.wg.Wait()
	for _, l := range e.loops {
		l.closeAll()
	}
}

// loop is one epoll event loop.
type loop struct {
	e                 *engine
	epfd              int
	events            []unix.EpollEvent
	buf               []byte
	scratch           []byte // one pub payload before framing
	rx                rx
	byFd              []*conn // the loop's connections by descriptor (nil: none); descriptors are small and dense
	pubs              []*conn
	dirty             []*conn
	away              []*conn // waiting to reconnect
	spare             []*conn // the other buffer of away, for redial
	resendq           []*conn // publishers with publishes refused for now (err overloaded, internal)
	rng               uint64
	serStart, serStep int64

	mu       sync.Mutex
	incoming []*conn

	st         *levelStats
	publishing bool
	sec        Hist // this second's latencies, for the live p99
	secStart   int64
	epochSeen  uint64
	snap       chan *levelStats
	verify     atomic.Bool

	liveSent, liveRecv, liveErrs                        atomic.Uint64
	liveP99                                             atomic.Int64
	iter                                                atomic.Uint64
	liveWinSent, liveWinAcked, liveWinExp, liveWinDel   atomic.Uint64
	winSent, winAcked, winExp, winDel, sent, recv, nerr uint64
	textFrames                                          uint64
}

func newLoop(e *engine, seed uint64) (*loop, error) {
	fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("cannot create epoll: %w", err)
	}
	return &loop{e: e, epfd: fd, events: make([]unix.EpollEvent, 512), buf: make([]byte, readBufSize),
		rng: seed | 1, st: newLevelStats(), snap: make(chan *levelStats, 1)}, nil
}

func (l *loop) add(c *conn) {
	l.mu.Lock()
	l.incoming = append(l.incoming, c)
	l.mu.Unlock()
}

func (l *loop) rand() uint64 {
	l.rng ^= l.rng << 13
	l.rng ^= l.rng >> 7
	l.rng ^= l.rng << 17
	return l.rng
}

func (l *loop) mask() [4]byte {
	v := uint32(l.rand())
	return [4]byte{byte(v), byte(v >> 8), byte(v >> 16), byte(v >> 24)}
}

func (l *loop) run() {
	defer l.e.wg.Done()
	var last int64
	for !l.e.stop.Load() {
		l.takeIncoming()
		// publishers need the tick; a loop of receivers only wakes for
		// their bytes, and for hand-overs within 10 ms
		timeout := 10 * loopTick
		if len(l.pubs) > 0 && l.e.pubOn.Load() {
			timeout = loopTick
		}
		n, err := epollWait(l.epfd, l.events, int(timeout/time.Millisecond))
		if err != nil && !errors.Is(err, unix.EINTR) {
			// only a bad descriptor or argument gets here
			panic("BUG: epoll_wait: " + err.Error())
		}
		for i := 0; i < n; i++ {
			ev := l.events[i]
			var c *conn
			if fd := int(ev.Fd); fd < len(l.byFd) {
				c = l.byFd[fd]
			}
			if c == nil {
				continue
			}
			l.handle(c, ev.Events)
		}
		now := time.Now().UnixNano()
		l.redial(now)
		l.resendDue(now)
		if l.e.pubOn.Load() {
			l.publish(now)
			l.publishing = true
		} else if l.publishing {
			l.publishing = false
			l.owed()
		}
		l.flush()
		l.publishLive(now)
		l.iter.Add(1)
		if ep := l.e.epoch.Load(); ep != l.epochSeen {
			l.epochSeen = ep
			l.handOver()
		}
		// At most one pass per tick while sockets are ready. A node writes
		// its members one after another (300 take ~1.3 ms), so a loop that
		// went back to epoll at once woke ~100 times per node tick for a
		// few sockets each: 24,000 wake-ups a second at 1,000 msg/s in the
		// 300-member room, a fifth of the bench's CPU. Receipt times come
		// from the kernel (rx), so waiting here does not add to them.
		if n > 0 {
			if d := last + int64(loopTick) - now; d > 0 {
				nanosleep(d)
				now += d
			}
		}
		last = now
	}
}

func (l *loop) takeIncoming() {
	l.mu.Lock()
	in := l.incoming
	l.incoming = nil
	l.mu.Unlock()
	for _, c := range in {
		for c.fd >= len(l.byFd) {
			l.byFd = append(l.byFd, nil)
		}
		l.byFd[c.fd] = c
		ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLRDHUP | unix.EPOLLET, Fd: int32(c.fd)}
		if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, c.fd, &ev); err != nil {
			l.abort(c, fmt.Errorf("cannot register with epoll: %w", err))
		}
	}
}

// abort fails a connection that never became ready; one that had been
// ready and lost its socket tries again later.
func (l *loop) abort(c *conn, err error) {
	if c.state == stClosed || c.state == stAway {
		return
	}
	wasReady := c.state == stReady
	l.drop(c)
	if c.away {
		l.st.Errors["reconnect_failed"]++
		l.goAway(c, 0)
		return
	}
	if !wasReady {
		<-l.e.sem
		l.e.fail(err)
	}
}

// goAway schedules a reconnection: after the node's hint when it gave one,
// else a jittered delay that doubles with each failed attempt.
func (l *loop) goAway(c *conn, hint int64) {
	now := time.Now().UnixNano()
	if !c.away || c.attempts == 0 {
		c.closedAt = now
	}
	c.away = true
	d := hint
	if d <= 0 {
		lo, hi := l.e.retryMin, l.e.retryMax
		if c.attempts > 0 {
			lo = min(lo<<min(c.attempts, 6), hi)
		}
		d = lo
		if hi > lo {
			d += int64(l.rand() % uint64(hi-lo))
		}
	}
	c.attempts++
	c.state = stAway
	c.retryAt = now + d
	c.lastFill = 0 // the bucket starts afresh when it is back: no catch-up burst
	l.away = append(l.away, c)
}

// redial opens a new socket for every away connection whose time came.
func (l *loop) redial(now int64) {
	if len(l.away) == 0 {
		return
	}
	list := l.away
	l.away = l.spare[:0]
	for _, c := range list {
		if c.retryAt > now || l.e.stop.Load() {
			l.away = append(l.away, c)
			continue
		}
		target := c.spec.target
		if l.e.reconnect == reconnectNext {
			if n := len(l.e.targets) - l.e.placed; n > 0 && l.e.placed > 0 {
				target = l.e.placed + (c.spec.target+c.attempts-1)%n
			} else {
				target = (target + c.attempts) % len(l.e.targets)
			}
		}
		fd, err := l.e.dialTo(c.spec, target)
		if err != nil {
			l.st.Errors["reconnect_failed"]++
			l.goAway(c, 0)
			continue
		}
		c.fd, c.state, c.target = fd, stConnecting, target
		for c.fd >= len(l.byFd) {
			l.byFd = append(l.byFd, nil)
		}
		l.byFd[c.fd] = c
		ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLRDHUP | unix.EPOLLET, Fd: int32(c.fd)}
		if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, c.fd, &ev); err != nil {
			l.drop(c)
			l.goAway(c, 0)
		}
	}
	l.spare = list[:0]
}

// rejoined is a reconnection joined again: the time it took, and every
// publish not acked on the lost socket sent again with its id, so that
// the node stores it once whether or not the first one reached it.
func (l *loop) rejoined(c *conn) {
	now := time.Now().UnixNano()
	l.st.Rejoins++
	if s := l.slotAt(now); s != nil {
		s.Rejoined++
		s.RejoinTime.record(now - c.closedAt)
	}
	c.attempts = 0
	c.resendIDs = c.resendIDs[:0]
	if !c.spec.publish {
		return
	}
	var ids []uint64
	for _, s := range c.inflight {
		if s.id != 0 {
			ids = append(ids, s.id)
		}
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		s := &c.inflight[id&uint64(len(c.inflight)-1)]
		s.resent = true
		l.appendPubFrame(c, id, s.t, int(s.size))
		l.st.Resent++
	}
	if len(ids) > 0 {
		l.markDirty(c)
	}
}

// pubFailed handles an err answering one of c's publishes: one the node
// could not take now (overloaded, internal: its database went away) is
// sent again with the same id after a short jittered wait, as a client
// would, so that the run's verdict is about what was lost, not refused
// for now (the refusals are counted by code); others are given up.
func (l *loop) pubFailed(c *conn, f *proto.ServerFrame) {
	if !c.spec.publish {
		return
	}
	switch string(f.Code) {
	case "overloaded", "internal", "rate_limited":
	default:
		return
	}
	id, ok := parseUint(f.Ref)
	if !ok || c.inflight[id&uint64(len(c.inflight)-1)].id != id {
		return
	}
	c.resendIDs = append(c.resendIDs, id)
	if c.resendAt == 0 {
		// 100-300 ms, doubling with each refusal in a row up to 6.4-19.2 s:
		// an overloaded node is not hammered by its own refusals
		c.refusals = min(c.refusals+1, 7)
		base := int64(100*time.Millisecond) << (c.refusals - 1)
		c.resendAt = time.Now().UnixNano() + base + int64(l.rand()%uint64(2*base))
		l.resendq = append(l.resendq, c)
	}
}

// resendDue sends again the refused publishes whose wait is over.
func (l *loop) resendDue(now int64) {
	if len(l.resendq) == 0 {
		return
	}
	keep := l.resendq[:0]
	for _, c := range l.resendq {
		if c.resendAt > now {
			keep = append(keep, c)
			continue
		}
		c.resendAt = 0
		if c.state != stReady {
			continue // a rejoin sends every unacked publish again
		}
		for _, id := range c.resendIDs {
			if s := &c.inflight[id&uint64(len(c.inflight)-1)]; s.id == id {
				s.resent = true
				l.appendPubFrame(c, id, s.t, int(s.size))
				l.st.Resent++
			}
		}
		c.resendIDs = c.resendIDs[:0]
		l.markDirty(c)
	}
	l.resendq = keep
}

// slotAt is the --series slot of time t, nil when there is none.
func (l *loop) slotAt(t int64) *slot {
	if l.serStep <= 0 || t < l.serStart {
		return nil
	}
	i := (t - l.serStart) / l.serStep
	if i >= int64(len(l.st.Series)) {
		return nil
	}
	return &l.st.Series[i]
}

func (l *loop) drop(c *conn) {
	c.state = stClosed
	_ = unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, c.fd, nil)
	unix.Close(c.fd)
	if c.fd >= 0 && c.fd < len(l.byFd) {
		l.byFd[c.fd] = nil
	}
	c.in, c.out = nil, nil
}

// closed records a ready connection the node closed; hint is the node's
// reconnect delay (ns) from the close reason, 0 for none.
func (l *loop) closed(c *conn, code int, hint int64) {
	if c.state != stReady {
		l.abort(c, fmt.Errorf("connection closed during handshake (code %d)", code))
		return
	}
	l.st.Closes[code]++
	l.nerr++
	if s := l.slotAt(time.Now().UnixNano()); s != nil {
		s.Closes++
	}
	l.drop(c)
	if l.e.reconnect != reconnectOff && !l.e.stop.Load() {
		c.attempts = 0
		c.away = false
		l.goAway(c, hint)
	}
}

func (l *loop) becameReady(c *conn) {
	c.state = stReady
	if c.away {
		l.rejoined(c)
		return
	}
	if c.spec.publish {
		c.inflight = make([]sendSlot, 16)
		c.tokens = float64(l.rand()%1000) / 1000 // spread the first sends
		l.pubs = append(l.pubs, c)
	}
	<-l.e.sem
	l.e.ready.Add(1)
}

func (l *loop) handle(c *conn, events uint32) {
	if c.state == stConnecting {
		if events&(unix.EPOLLOUT|unix.EPOLLERR|unix.EPOLLHUP) == 0 {
			return
		}
		if v, err := unix.GetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_ERROR); err != nil || v != 0 {
			if err == nil {
				err = unix.Errno(v)
			}
			l.abort(c, fmt.Errorf("cannot connect to %s: %w", l.e.targets[c.target].host, err))
			return
		}
		ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLET, Fd: int32(c.fd)}
		_ = unix.EpollCtl(l.epfd, unix.EPOLL_CTL_MOD, c.fd, &ev)
		t := &l.e.targets[c.target]
		if c.sse {
			c.out = appendSSERequest(c.out, t.host, t.pathQuery, c.room, l.e.identity(c.spec.user), c.away, c.ck.Last())
		} else {
			c.out = appendUpgrade(c.out, t.host, t.pathQuery+l.e.identity(c.spec.user))
		}
		c.state = stUpgrading
		l.markDirty(c)
		return
	}
	if events&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) == 0 {
		return
	}
	for l.read(c) {
	}
}

// read makes one read and handles what it brought. Sockets are
// edge-triggered: a level-triggered epoll polls every socket it reported
// once more on the next wait, 5% of the bench's CPU at 1,000 msg/s. A read
// that did not fill the buffer emptied the socket (new bytes raise a new
// edge), so one read per wake-up is the rule; read reports true when the
// buffer filled and there may be more.
func (l *loop) read(c *conn) (more bool) {
	n := copy(l.buf, c.in)
	r, now, err := l.rx.recv(c.fd, l.buf[n:])
	if err != nil {
		if errors.Is(err, unix.EINTR) {
			return true
		}
		if !errors.Is(err, unix.EAGAIN) {
			l.closed(c, 1006, 0)
		}
		return false
	}
	if r == 0 {
		l.closed(c, 1006, 0)
		return false
	}
	more = n+r == len(l.buf)
	if now == 0 {
		// no stamp: the kernel enables receive timestamps for the machine
		// from a work queue, so the first segments after the first socket
		// asked (the upgrade, at worst a run's first frames) carry none
		now = time.Now().UnixNano()
	}
	b := l.buf[:n+r]
	if c.state == stUpgrading && c.sse {
		hn, ok := parseSSEResponse(b)
		if hn == 0 {
			c.in = append(c.in[:0], b...)
			return more
		}
		if !ok {
			l.abort(c, refused("SSE stream refused", b, hn, l.e.secret != nil))
			return false
		}
		b = b[hn:]
		c.joinSent = now
		c.state = stJoining
	} else if c.state == stUpgrading {
		hn, ok := parseUpgradeResponse(b)
		if hn == 0 {
			c.in = append(c.in[:0], b...)
			return more
		}
		if !ok {
			l.abort(c, refused("upgrade refused", b, hn, l.e.secret != nil))
			return false
		}
		b = b[hn:]
		if c.spec.join {
			c.joinSent = now
			if c.away {
				c.out = append(c.out, rejoinFrame(c.room, c.ck.Last(), c.epoch, l.mask())...)
			} else {
				c.out = append(c.out, joinFrame(c.room, l.mask())...)
			}
			l.markDirty(c)
			c.state = stJoining
		} else {
			l.becameReady(c)
		}
	}
	var rest []byte
	if c.sse {
		rest = l.sseEvents(c, b, now)
	} else {
		rest = l.frames(c, b, now)
	}
	if c.state == stClosed {
		return false
	}
	if len(rest) > len(l.buf)/2 {
		l.closed(c, 1009, 0)
		return false
	}
	c.in = append(c.in[:0], rest...)
	return more
}

// refused names a refused upgrade or SSE request: its status line and the
// node's reason, the body of the answer (in the same read: the node writes
// a refusal at once and closes). A 401 to a bench without a secret is a
// node in token mode, and the error says what it wants.
func refused(what string, b []byte, headLen int, haveSecret bool) error {
	line := b[:headLen]
	if i := indexCRLF(line); i >= 0 {
		line = line[:i]
	}
	msg := fmt.Sprintf("%s: %q", what, line)
	if body := bytes.TrimSpace(b[headLen:]); len(body) > 0 {
		msg += fmt.Sprintf(" (%q)", body[:min(len(body), 200)])
	}
	if !haveSecret && bytes.Contains(line, []byte(" 401 ")) {
		msg += ": the node wants tokens; give --app A with the app's secret (--secret-file F, ROOST_SECRET or --secret S)"
	}
	return errors.New(msg)
}

func indexCRLF(b []byte) int {
	for i := 0; i+1 < len(b); i++ {
		if b[i] == '\r' && b[i+1] == '\n' {
			return i
		}
	}
	return -1
}

// rejoinFrame asks for every message after since, in the history epoch
// names.
func rejoinFrame(room []byte, since uint64, epoch []byte, mask [4]byte) []byte {
	p := make([]byte, 0, 64+len(room)+len(epoch))
	p = append(p, `{"op":"join","room":"`...)
	p = append(p, room...)
	p = append(p, `","since":`...)
	p = strconv.AppendUint(p, since, 10)
	if len(epoch) > 0 {
		p = append(p, `,"epoch":"`...)
		p = append(p, epoch...)
		p = append(p, '"')
	}
	p = append(p, '}')
	return proto.AppendClientFrame(nil, ws.OpText, mask, p)
}

func joinFrame(room []byte, mask [4]byte) []byte {
	p := make([]byte, 0, 32+len(room))
	p = append(p, `{"op":"join","room":"`...)
	p = append(p, room...)
	p = append(p, `"}`...)
	return proto.AppendClientFrame(nil, ws.OpText, mask, p)
}

// frames handles every whole frame in b and returns the incomplete tail.
// This is the receive path: no allocation, one decode per frame, the
// payload read in place.
func (l *loop) frames(c *conn, b []byte, now int64) []byte {
	var f proto.ServerFrame
	for len(b) > 0 {
		// nearly every frame is a whole unmasked text frame under 64 KiB:
		// two or four header bytes read here, not a full header parse
		if len(b) >= 4 && b[0] == 0x80|byte(ws.OpText) && b[1] <= 126 {
			hn, n := 2, int(b[1])
			if n == 126 {
				hn, n = 4, int(b[2])<<8|int(b[3])
			}
			if len(b)-hn < n {
				return b
			}
			l.text(c, b[hn:hn+n], now, &f)
			b = b[hn+n:]
			if c.state == stClosed {
				return nil
			}
			continue
		}
		h, hn, err := proto.ParseFrameHeader(b)
		if err != nil || h.Masked {
			l.st.Errors["bad_frame"]++
			l.closed(c, 1002, 0)
			return nil
		}
		if hn == 0 || int64(len(b)-hn) < h.Length {
			return b
		}
		payload := b[hn : hn+int(h.Length)]
		b = b[hn+int(h.Length):]
		switch h.OpCode {
		case ws.OpText:
			if !h.Fin {
				// the protocol has the node send whole frames only
				l.textFrames++
				l.st.Errors["fragmented"]++
				l.nerr++
				continue
			}
			l.text(c, payload, now, &f)
		case ws.OpPing:
			c.out = proto.AppendClientFrame(c.out, ws.OpPong, l.mask(), payload)
			l.markDirty(c)
		case ws.OpClose:
			code := 1005
			var hint int64
			if len(payload) >= 2 {
				code = int(payload[0])<<8 | int(payload[1])
				hint = retryHint(payload[2:])
			}
			l.closed(c, code, hint)
			return nil
		case ws.OpPong:
		default:
			l.st.Errors["unexpected_opcode"]++
			l.nerr++
		}
		if c.state == stClosed {
			return nil
		}
	}
	return b
}

// sseEvents handles every whole event in b (through its blank line) and
// returns the incomplete tail: each event's data is the JSON object a
// WebSocket frame would carry (the bench's bodies hold no line break, so
// one data line), handled as one. Comments, id and retry are skipped.
func (l *loop) sseEvents(c *conn, b []byte, now int64) []byte {
	var f proto.ServerFrame
	for {
		if data, n := sseMsgFast(b); n > 0 {
			l.text(c, data, now, &f)
			if c.state == stClosed {
				return nil
			}
			b = b[n:]
			continue
		}
		end := bytes.Index(b, []byte("\n\n"))
		if end < 0 {
			return b
		}
		ev := b[:end+1]
		b = b[end+2:]
		if i := bytes.Index(ev, []byte("data: ")); i >= 0 && (i == 0 || ev[i-1] == '\n') {
			data := ev[i+len("data: "):]
			if j := bytes.IndexByte(data, '\n'); j >= 0 {
				data = data[:j]
			}
			l.text(c, data, now, &f)
			if c.state == stClosed {
				return nil
			}
		}
	}
}

// sseMsgFast reads the event a node sends for a message, "event: msg",
// one data line, an optional id line and the blank line, scanning the data
// once; n is 0 for anything else or an incomplete event (the general path
// then decides).
func sseMsgFast(b []byte) (data []byte, n int) {
	const pre = "event: msg\ndata: "
	if !bytes.HasPrefix(b, []byte(pre)) {
		return nil, 0
	}
	d := b[len(pre):]
	j := bytes.IndexByte(d, '\n')
	if j < 0 {
		return nil, 0
	}
	rest := d[j+1:]
	switch {
	case len(rest) > 0 && rest[0] == '\n':
		return d[:j], len(pre) + j + 2
	case bytes.HasPrefix(rest, []byte("id: ")):
		k := bytes.IndexByte(rest, '\n')
		if k < 0 || k+1 >= len(rest) || rest[k+1] != '\n' {
			return nil, 0
		}
		return d[:j], len(pre) + j + 1 + k + 2
	}
	return nil, 0
}

// text handles one whole text frame; f is scratch for the slow path.
func (l *loop) text(c *conn, payload []byte, now int64, f *proto.ServerFrame) {
	l.textFrames++
	if seq, stamp, ok := msgFast(payload, c.room); ok {
		l.onMsg(c, seq, stamp, now)
		return
	}
	if err := proto.DecodeServer(payload, f); err != nil {
		l.st.Errors["undecodable"]++
		l.nerr++
		return
	}
	l.onFrame(c, f, payload, now)
}

func (l *loop) inWindow(t int64) bool {
	return t >= l.e.winStart.Load() && t < l.e.winEnd.Load()
}

// onMsg counts one received msg: its seq in order, its latency when it was
// published in the window.
func (l *loop) onMsg(c *conn, seq uint64, stamp int64, now int64) {
	fresh := c.ck.Observe(seq)
	l.recv++
	if l.inWindow(now) {
		l.st.RecvFrames++
	}
	s := l.slotAt(now)
	if s != nil {
		s.Frames++
	}
	if !fresh || stamp == 0 {
		return
	}
	if l.e.readMarks && !c.spec.publish {
		l.markRead(c, seq, now)
	}
	live := stamp >= c.joinSent
	if s != nil {
		if live {
			s.Live++
			s.Lat.record(now - stamp)
		} else {
			s.Replayed++
		}
	}
	if l.inWindow(stamp) {
		l.st.Delivered++
		l.winDel++
		if !live {
			l.st.Replayed++
		}
		l.st.Lat.Record(now - stamp)
		l.sec.Record(now - stamp)
	}
}

func (l *loop) onFrame(c *conn, f *proto.ServerFrame, payload []byte, now int64) {
	switch string(f.Op) {
	case "msg":
		l.onMsg(c, f.Seq, bodyStamp(f.Body), now)
	case "ack":
		id, ok := parseUint(f.ID)
		if !ok {
			l.st.Errors["foreign_ack"]++
			return
		}
		if f.Seq > c.ackMax {
			c.ackMax = f.Seq
		}
		s := &c.inflight[id&uint64(len(c.inflight)-1)]
		if s.id != id {
			return
		}
		s.id = 0
		c.refusals = 0
		if l.inWindow(s.t) {
			l.st.Acked++
			l.winAcked++
			if s.burst {
				// the burst's own acks are counted, not mixed into the
				// others' latencies (burst.go)
				l.st.BurstAcked++
				l.st.BurstLastAck = max(l.st.BurstLastAck, now)
			} else {
				l.st.AckLat.Record(now - s.t)
			}
		}
		if sl := l.slotAt(now); sl != nil {
			sl.Acked++
			if s.resent {
				sl.AckedAgain++
			} else if !s.burst {
				sl.AckLat.record(now - s.t)
			}
		}
	case "joined":
		if c.state == stJoining {
			if !c.away {
				c.ck.Start(f.Seq)
				c.epoch, _, _ = joinedResume(payload)
				c.epoch = append([]byte(nil), c.epoch...)
			} else {
				epoch, lost, from := joinedResume(payload)
				c.epoch = append(c.epoch[:0], epoch...)
				if lost {
					// the node says which seqs will not follow: the member
					// was told, so they are not gaps
					l.st.Unrecov++
					if s := l.slotAt(now); s != nil {
						s.Unrecov++
					}
					if last := c.ck.Last(); from > last+1 {
						l.st.ToldLost += from - last - 1
					}
					c.ck.Start(from - 1)
				}
			}
			l.becameReady(c)
		}
	case "err":
		l.st.Errors[string(f.Code)]++
		l.nerr++
		if s := l.slotAt(now); s != nil {
			s.ErrFrames++
		}
		if c.state == stJoining {
			l.abort(c, fmt.Errorf("join refused: %s", f.Code))
			return
		}
		l.pubFailed(c, f)
	case "signal":
		// At most once and without a seq: counted and timed, never checked
		// for order.
		l.recv++
		if l.inWindow(now) {
			l.st.RecvFrames++
		}
		if s := l.slotAt(now); s != nil {
			s.Frames++
		}
		if stamp := bodyStamp(f.Body); l.inWindow(stamp) {
			l.st.Delivered++
			l.winDel++
			l.st.Lat.Record(now - stamp)
			l.sec.Record(now - stamp)
		}
	case "read":
		if l.inWindow(now) {
			l.st.ReadAnswers++
		}
	case "pong", "left":
	default:
		l.st.Errors["unexpected_op"]++
		l.nerr++
	}
}

// publish runs every publisher's token bucket: the rate holds on average
// without a timer or sleep per message. A publisher delayed by a scheduling
// stall catches up (its messages carry their real send time, so latency
// stays honest), but one behind by more than half a second of messages
// reports the excess as bench_dropped: the bench, not the node, fell behind.
func (l *loop) publish(now int64) {
	rate := math.Float64frombits(l.e.rateBits.Load())
	if rate <= 0 {
		return
	}
	if bs := l.e.burstStart.Load(); bs > 0 && now >= bs {
		l.publishBurst(now, bs)
	}
	if now >= l.e.winEnd.Load() {
		// nothing after the window: every publish is in it or long acked
		// when the level drains
		return
	}
	burst := math.Max(2, rate*0.5)
	perNs := rate / 1e9
	inWin := l.inWindow(now)
	for _, c := range l.pubs {
		if c.state != stReady {
			continue
		}
		if c.lastFill == 0 {
			c.lastFill = now
		}
		c.tokens += float64(now-c.lastFill) * perNs
		c.lastFill = now
		if c.tokens > burst+1 {
			if inWin {
				l.st.BenchDropped += uint64(c.tokens - burst)
			}
			c.tokens = burst
		}
		if c.tokens < 1 {
			continue
		}
		if len(c.out) > maxOutBuffer {
			if inWin {
				l.st.BenchDropped += uint64(c.tokens)
			}
			c.tokens = 0
			continue
		}
		for c.tokens >= 1 {
			c.tokens--
			l.appendPub(c, now)
			if inWin {
				l.st.Sent++
				l.winSent++
				recv := uint64(c.spec.receivers)
				if l.e.signals && c.spec.join && recv > 0 {
					recv-- // a signal skips its sending connection
				}
				l.st.Expected += recv
				l.winExp += recv
			}
			if s := l.slotAt(now); s != nil {
				s.Sent++
			}
			l.sent++
		}
		l.markDirty(c)
	}
}

// owed counts, when publishing stops, what each publisher's bucket had
// earned by the end of the window but never sent because this loop was
// not scheduled in time: the bench's shortfall, not the node's.
func (l *loop) owed() {
	rate := math.Float64frombits(l.e.rateBits.Load())
	end := l.e.winEnd.Load()
	for _, c := range l.pubs {
		if c.state != stReady || c.lastFill == 0 {
			continue
		}
		if c.lastFill < end {
			c.tokens += float64(end-c.lastFill) * rate / 1e9
		}
		if c.tokens >= 1 {
			l.st.BenchDropped += uint64(c.tokens)
		}
		c.tokens, c.lastFill = 0, 0
	}
}

// appendPub appends one pub frame whose body is {"p":"xx…","t":NOW} padded
// to the configured size, and remembers its send time for the ack.
func (l *loop) appendPub(c *conn, now int64) {
	if l.e.signals {
		l.appendSignalFrame(c, now, l.e.sizeFn(&l.rng))
		return
	}
	c.nextID++
	id := c.nextID
	slot := &c.inflight[id&uint64(len(c.inflight)-1)]
	if slot.id != 0 && len(c.inflight) < 1<<16 {
		c.growInflight()
		slot = &c.inflight[id&uint64(len(c.inflight)-1)]
	}
	size := l.e.sizeFn(&l.rng)
	*slot = sendSlot{id: id, t: now, size: int32(size)}
	l.appendPubFrame(c, id, now, size)
}

// identity is the query naming a connection's user: a token of its own
// when the bench has the app's secret (minted at connect, off the measured
// path), else ?user=&app= for an insecure node.
func (e *engine) identity(user string) string {
	if e.secret == nil {
		return "user=" + user + "&app=" + e.app
	}
	tok, err := proto.SignToken(e.secret, e.app, user, time.Now().Add(24*time.Hour), nil)
	if err != nil {
		panic("BUG: cannot sign a bench token: " + err.Error())
	}
	return "token=" + tok
}

// appendPubFrame appends the pub frame of publish id, sent at now.
func (l *loop) appendPubFrame(c *conn, id uint64, now int64, size int) {
	var num [20]byte
	ids := strconv.AppendUint(num[:0], id, 10)
	var tsb [20]byte
	ts := strconv.AppendInt(tsb[:0], now, 10)
	// the stamp goes last so the receive path finds it at the frame's end
	// without walking the body (see msgFast)
	const pre, mid, bodyPre, bodyMid, end = `{"op":"pub","room":"`, `","id":"`, `","body":{"p":"`, `","t":`, `}}`
	pad := size - (len(`{"p":"`) + len(bodyMid) + len(ts) + len(`}`))
	if pad < 0 {
		pad = 0
	}
	p := l.scratch[:0]
	p = append(p, pre...)
	p = append(p, c.room...)
	p = append(p, mid...)
	p = append(p, ids...)
	p = append(p, bodyPre...)
	for i := 0; i < pad; i++ {
		p = append(p, 'x')
	}
	p = append(p, bodyMid...)
	p = append(p, ts...)
	p = append(p, end...)
	l.scratch = p
	c.out = proto.AppendClientFrame(c.out, ws.OpText, l.mask(), p)
}

// appendSignalFrame appends a signal frame whose body is {"p":"xx…","t":NOW}
// padded to size (at most the node's 1 KiB for a signal body).
func (l *loop) appendSignalFrame(c *conn, now int64, size int) {
	var tsb [20]byte
	ts := strconv.AppendInt(tsb[:0], now, 10)
	const pre, bodyPre, bodyMid, end = `{"op":"signal","room":"`, `","body":{"p":"`, `","t":`, `}}`
	pad := min(size, 1000) - (len(`{"p":"`) + len(bodyMid) + len(ts) + len(`}`))
	p := l.scratch[:0]
	p = append(p, pre...)
	p = append(p, c.room...)
	p = append(p, bodyPre...)
	for i := 0; i < pad; i++ {
		p = append(p, 'x')
	}
	p = append(p, bodyMid...)
	p = append(p, ts...)
	p = append(p, end...)
	l.scratch = p
	c.out = proto.AppendClientFrame(c.out, ws.OpText, l.mask(), p)
}

func (c *conn) growInflight() {
	old := c.inflight
	c.inflight = make([]sendSlot, 2*len(old))
	for _, s := range old {
		if s.id != 0 {
			c.inflight[s.id&uint64(len(c.inflight)-1)] = s
		}
	}
}

// flush writes each dirty connection's pending frames with one write.
func (l *loop) flush() {
	keep := l.dirty[:0]
	for _, c := range l.dirty {
		c.dirty = false
		if c.state == stClosed || c.state == stAway || c.state == stConnecting || len(c.out) == 0 {
			continue
		}
		n, err := rawWrite(c.fd, c.out)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				c.dirty = true
				keep = append(keep, c)
				continue
			}
			l.closed(c, 1006, 0)
			continue
		}
		if n < len(c.out) {
			c.out = c.out[:copy(c.out, c.out[n:])]
			c.dirty = true
			keep = append(keep, c)
			continue
		}
		c.out = c.out[:0]
	}
	l.dirty = keep
}

// markDirty lists c for the next flush, once however many frames it queued.
func (l *loop) markDirty(c *conn) {
	if !c.dirty {
		c.dirty = true
		l.dirty = append(l.dirty, c)
	}
}

func (l *loop) publishLive(now int64) {
	l.liveSent.Store(l.sent)
	l.liveRecv.Store(l.recv)
	l.liveErrs.Store(l.nerr)
	l.liveWinSent.Store(l.winSent)
	l.liveWinAcked.Store(l.winAcked)
	l.liveWinExp.Store(l.winExp)
	l.liveWinDel.Store(l.winDel)
	if now-l.secStart >= int64(time.Second) {
		l.liveP99.Store(int64(l.sec.Quantile(0.99)))
		l.sec.Reset()
		l.secStart = now
	}
}

// handOver gives the finished level's stats to snapshot.
func (l *loop) handOver() {
	st := l.st
	st.TotalSent, st.TotalFrames = l.sent, l.textFrames
	for _, c := range l.away {
		st.Away++
		st.Gaps += c.ck.Gaps
		st.Missing += c.ck.Missing
		st.Duplicates += c.ck.Duplicates
		st.Reordered += c.ck.Reordered
	}
	for _, c := range l.byFd {
		if c == nil {
			continue
		}
		st.Gaps += c.ck.Gaps
		st.Missing += c.ck.Missing
		st.Duplicates += c.ck.Duplicates
		st.Reordered += c.ck.Reordered
		if c.state != stReady {
			if c.away {
				st.Away++
			}
			continue
		}
		if !l.verify.Load() || c.spec.room < 0 {
			continue
		}
		if c.spec.publish && c.ackMax > 0 {
			if st.AckMax == nil {
				st.AckMax = map[int32]uint64{}
			}
			if c.ackMax > st.AckMax[c.spec.room] {
				st.AckMax[c.spec.room] = c.ackMax
			}
		}
		if c.spec.join {
			if st.LastMin == nil {
				st.LastMin = map[int32]uint64{}
			}
			if cur, ok := st.LastMin[c.spec.room]; !ok || c.ck.Last() < cur {
				st.LastMin[c.spec.room] = c.ck.Last()
				if st.LastWho == nil {
					st.LastWho = map[int32]Lagger{}
				}
				st.LastWho[c.spec.room] = Lagger{User: c.spec.user, Node: c.target, Last: c.ck.Last(),
					JoinedS: float64(c.joinSent-l.e.serStart.Load()) / 1e9, Rejoin: c.away}
			}
		}
	}
	l.st = newLevelStats()
	l.serStart, l.serStep = l.e.serStart.Load(), l.e.serStep.Load()
	if n := l.e.serLen.Load(); n > 0 && l.serStep > 0 {
		l.st.Series = make([]slot, n)
	}
	l.winSent, l.winAcked, l.winExp, l.winDel = 0, 0, 0, 0
	l.snap <- st
}

func (l *loop) closeAll() {
	for _, c := range l.byFd {
		if c != nil {
			unix.Close(c.fd)
		}
	}
	l.mu.Lock()
	for _, c := range l.incoming {
		unix.Close(c.fd)
	}
	l.incoming = nil
	l.mu.Unlock()
	l.byFd = nil
	unix.Close(l.epfd)
}
