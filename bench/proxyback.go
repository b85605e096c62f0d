//go:build linux

package bench

import (
	"bufio"
	"bytes"
	"container/heap"
	"crypto/hmac"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/roost-chat/roost/proto"
)

// proxyBackend is `roost bench proxy-backend`: an app backend for the
// proxy hooks that allows every call after --delay, to measure what the
// hooks cost a node (docs/benchmarks.md). It stops by itself after --for.
func proxyBackend(args []string, stdout, stderr io.Writer) int {
	fs := modeFlags("proxy-backend", stderr)
	listen := fs.String("listen", "127.0.0.1:0", "`ADDR` to serve on")
	delay := fs.Duration("delay", 5*time.Millisecond, "how long each answer takes")
	deny := fs.String("deny-body", "", "refuse publishes whose body contains this text (empty: allow all)")
	wait := fs.String("wait", waitLoop, "how the --delay is waited: loop (one thread reads every connection, counts each delay from the kernel's receive time of the request and writes the answer when due, to a --slice), thread (one thread sleeps to just short of each deadline, spins the rest and writes the answer), precise (each call a Go timer to 2 ms short, then a nanosleep) or timer (a Go timer alone, which can wake a millisecond late)")
	slice := fs.Duration("slice", defaultSlice, "with --wait loop: deadlines are rounded up to this, so that answers due within one leave in one wake-up (each at most this late)")
	lead := fs.Duration("lead", defaultLead, "with --wait loop: how long before a slice the thread wakes and spins the rest (0: it sleeps to the slice)")
	spin := fs.Duration("spin", defaultSpin, "with --wait thread: how long before a deadline the thread stops sleeping and spins")
	secret := fs.String("secret", "", "verify each call's X-Roost-Signature against the app's `SECRET` (default $ROOST_SECRET; empty: not verified); a call that fails is answered 401 and counted")
	life := fs.Duration("for", 10*time.Minute, "stop after this long")
	probe := fs.String("probe", "", "instead of serving, call the backend at `URL` as a node would (--rate calls per second in bursts of --burst, for --for, signed with --secret) and print the latency: what the backend and the HTTP round trip cost without a node")
	rate := fs.Float64("rate", 1000, "with --probe: calls per second")
	burst := fs.Int("burst", 30, "with --probe: calls sent at once")
	if code, ok := parseMode(fs, args); !ok {
		return code
	}
	if *secret == "" {
		*secret = os.Getenv("ROOST_SECRET")
	}
	if *probe != "" {
		return probeBackend(*probe, *rate, *burst, *life, *secret, stdout, stderr)
	}
	if *wait != waitLoop && *wait != waitThread && *wait != waitPrecise && *wait != waitTimer {
		fmt.Fprintf(stderr, "roost bench proxy-backend: --wait is loop, thread, precise or timer, not %q\n", *wait)
		return 2
	}
	if *delay < 0 {
		fmt.Fprintln(stderr, "roost bench proxy-backend: --delay must not be negative")
		return 2
	}
	// Fewer collections: a stop of the world waits for every thread of
	// the process, the answer thread too, and the others run at the
	// load's priority on cores the load keeps busy.
	debug.SetGCPercent(800)
	pb, err := startProxyBackend(*listen, backendConfig{delay: *delay, deny: *deny, wait: *wait, spin: *spin, slice: *slice, lead: *lead, secret: *secret})
	if err != nil {
		fmt.Fprintln(stderr, "roost bench proxy-backend:", err)
		return 1
	}
	fmt.Fprintln(stdout, pb.url)
	fmt.Fprintln(stderr, "roost bench proxy-backend:", schedPolicy())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case <-sig:
	case <-time.After(*life):
	}
	pb.stop()
	fmt.Fprintln(stderr, "roost bench proxy-backend:", pb.summary())
	return 0
}

// proxyServer is a running proxy hook backend.
type proxyServer struct {
	url                string
	ln                 net.Listener
	cfg                backendConfig
	calls, denied, bad atomic.Int64
	sched              *answerer // cfg.wait == waitThread: writes the answers at their deadlines
	loop               *netLoop  // cfg.wait == waitLoop: reads the calls and writes their answers

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
	late  Hist // ns each answer was written past its deadline: the backend's own error on --delay
	took  Hist // ns from a call read to its answer written: what the backend's --delay came to
}

// How a backend waits out its --delay.
const (
	// waitLoop: one thread serves every connection and counts each
	// delay from the kernel's receive time of the call (proxyloop.go).
	waitLoop = "loop"
	// waitThread: one OS thread holds every answer due and writes each
	// at its deadline itself, sleeping to just short of the next one and
	// spinning the rest. A
	// goroutine per call that sleeps and then writes needs, once its
	// sleep ends, a P and a CPU before it can write: on a machine whose
	// cores are shared with the node and the load, that is where the
	// answers of a burst ended up to 2 ms late at p99.
	waitThread = "thread"
	// waitPrecise: each call's goroutine sleeps with a Go timer to 2 ms
	// short of its deadline and a nanosleep of the rest, then writes.
	waitPrecise = "precise"
	// waitTimer: each call's goroutine sleeps with a Go timer alone,
	// which can wake a millisecond late.
	waitTimer = "timer"
)

// backendConfig is what a proxy-backend does with each call.
type backendConfig struct {
	delay time.Duration
	deny  string // refuse publishes whose body contains it (empty: none)
	// wait: how delay is waited, waitLoop (the zero value), waitThread,
	// waitPrecise or waitTimer.
	wait   string
	spin   time.Duration // waitThread: how long before a deadline the thread stops sleeping and spins (0: defaultSpin)
	slice  time.Duration // waitLoop: deadlines are rounded up to it (0: defaultSlice)
	lead   time.Duration // waitLoop: wake this long before a slice and spin the rest
	secret string        // verify X-Roost-Signature against it (empty: not verified)
}

// defaultSpin covers what a sleep of a real-time thread oversleeps on
// this kind of VM (a timer interrupt and a context switch, tens of µs);
// each µs more is CPU taken from the load on the cores the backend
// shares with it.
const defaultSpin = 50 * time.Microsecond

// maxSkew is how far a call's X-Roost-Timestamp may be from the
// backend's clock, as a real backend would bound replays.
const maxSkew = 5 * time.Minute

var (
	answerAllow  = httpAnswer("200 OK", "application/json", `{"allow":true}`)
	answerRefuse = httpAnswer("200 OK", "application/json", `{"allow":false,"code":"forbidden","message":"refused by the bench backend"}`)
	answerBadSig = httpAnswer("401 Unauthorized", "text/plain; charset=utf-8", "bad or missing X-Roost-Signature\n")
	answerBad    = []byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
)

// httpAnswer is a whole HTTP/1.1 response, written with one write(2).
func httpAnswer(status, ctype, body string) []byte {
	return fmt.Appendf(nil, "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s", status, ctype, len(body), body)
}

// startProxyBackend serves on addr: every POST is answered after
// cfg.delay, counted from when its request was read, allowed unless its
// body contains cfg.deny (non-empty); with cfg.secret, a call whose
// signature does not verify is answered 401 at once.
//
// It speaks HTTP/1.1 itself (one request at a time per connection, kept
// alive), not through net/http, so that an answer is one write(2) made
// at its deadline by whoever waited for it.
func startProxyBackend(addr string, cfg backendConfig) (*proxyServer, error) {
	if cfg.wait == "" {
		cfg.wait = waitLoop
	}
	if cfg.spin <= 0 {
		cfg.spin = defaultSpin
	}
	if cfg.slice <= 0 {
		cfg.slice = defaultSlice
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	ps := &proxyServer{url: "http://" + ln.Addr().String(), ln: ln, cfg: cfg, conns: map[net.Conn]struct{}{}}
	if cfg.wait == waitThread && cfg.delay > 0 {
		if ps.sched, err = newAnswerer(ps); err != nil {
			ln.Close()
			return nil, err
		}
	}
	if cfg.wait == waitLoop {
		if ps.loop, err = newNetLoop(ps); err != nil {
			ln.Close()
			return nil, err
		}
	}
	ps.wg.Add(1)
	go ps.accept()
	return ps, nil
}

func (ps *proxyServer) accept() {
	defer ps.wg.Done()
	for {
		nc, err := ps.ln.Accept()
		if err != nil {
			return
		}
		if ps.loop != nil {
			ps.loop.adopt(nc)
			continue
		}
		ps.mu.Lock()
		ps.conns[nc] = struct{}{}
		ps.mu.Unlock()
		ps.wg.Add(1)
		go ps.serve(nc)
	}
}

// stampReader remembers when its last read returned bytes: when the
// request it completed was read. While a request's head is read, left
// bounds what it may take from the connection (http.ReadRequest has no
// bound of its own: a head without its end would grow without one).
type stampReader struct {
	r    io.Reader
	at   time.Time
	left int64
}

// maxRequestHead bounds a request's line and headers, as net/http's
// default MaxHeaderBytes does; a node's calls take a few hundred bytes.
const maxRequestHead = 1 << 20

var errHeadTooLarge = errors.New("request head too large")

func (s *stampReader) Read(b []byte) (int, error) {
	if s.left <= 0 {
		return 0, errHeadTooLarge
	}
	if int64(len(b)) > s.left {
		b = b[:s.left]
	}
	n, err := s.r.Read(b)
	s.left -= int64(n)
	if n > 0 {
		s.at = time.Now()
	}
	return n, err
}

// serve answers nc's requests one at a time, each once the one before it
// was answered (HTTP/1.1 without pipelining, as the node and the probe
// call).
func (ps *proxyServer) serve(nc net.Conn) {
	defer ps.wg.Done()
	defer func() {
		nc.Close()
		ps.mu.Lock()
		delete(ps.conns, nc)
		ps.mu.Unlock()
	}()
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	sr := &stampReader{r: nc}
	br := bufio.NewReaderSize(sr, 8<<10)
	a := &answer{rc: rc, done: make(chan error, 1)}
	for {
		sr.left = maxRequestHead
		req, err := http.ReadRequest(br)
		sr.left = math.MaxInt64 // the body is bounded below
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				_, _ = nc.Write(answerBad)
			}
			return
		}
		body, err := io.ReadAll(io.LimitReader(req.Body, 1<<20))
		req.Body.Close()
		if err != nil {
			return
		}
		a.read = sr.at
		a.deadline = a.read.Add(ps.cfg.delay)
		ps.calls.Add(1)
		switch {
		case ps.cfg.secret != "" && !verifySignature(ps.cfg.secret, req.Header, body, time.Now()):
			ps.bad.Add(1)
			a.b, a.timed = answerBadSig, false
		case ps.cfg.deny != "" && bytes.Contains(body, []byte(ps.cfg.deny)):
			ps.denied.Add(1)
			a.b, a.timed = answerRefuse, true
		default:
			a.b, a.timed = answerAllow, true
		}
		if !a.timed || ps.cfg.delay <= 0 {
			a.deadline = time.Now()
			if ps.cfg.delay <= 0 && a.timed {
				a.deadline = a.read
			}
			err = a.write(ps)
		} else if ps.sched != nil {
			ps.sched.add(a)
			err = <-a.done
		} else {
			if ps.cfg.wait == waitPrecise {
				waitUntil(a.deadline)
			} else {
				time.Sleep(time.Until(a.deadline))
			}
			err = a.write(ps)
		}
		if err != nil || req.Close {
			return
		}
	}
}

// answer is one call's answer, due at deadline.
type answer struct {
	rc       syscall.RawConn
	b        []byte
	read     time.Time // when the call was read
	deadline time.Time
	timed    bool       // waited for: its timing is recorded
	done     chan error // waitThread: written
}

// write writes a's answer with one write(2) on the caller's thread and
// records its timing.
func (a *answer) write(ps *proxyServer) error {
	var werr error
	err := a.rc.Write(func(fd uintptr) bool {
		b := a.b
		for len(b) > 0 {
			n, err := unix.Write(int(fd), b)
			if err == unix.EINTR {
				continue
			}
			if err == unix.EAGAIN {
				// The connection's send buffer is full: only a client
				// that stopped reading gets here; the netpoller waits.
				a.b = b
				return false
			}
			if err != nil {
				werr = err
				return true
			}
			b = b[n:]
		}
		return true
	})
	if a.timed {
		now := time.Now()
		ps.mu.Lock()
		ps.late.Record(now.Sub(a.deadline).Nanoseconds())
		ps.took.Record(now.Sub(a.read).Nanoseconds())
		ps.mu.Unlock()
	}
	if err != nil {
		return err
	}
	return werr
}

// answerer is the waitThread: one goroutine locked to its OS thread
// that writes every answer at its deadline. It sleeps in ppoll(2) on an
// eventfd (an answer due before its wake-up wakes it; the kernel's
// hrtimer ends the sleep, the thread's timer slack set to 1 ns) until
// cfg.spin before the next deadline, then spins on the clock to the
// deadline and writes. Answers due together are written back to back.
// No goroutine wake-up stands between a deadline and its write, only the
// thread's own return from ppoll, which needs a free P (newAnswerer
// raises GOMAXPROCS so that one is).
type answerer struct {
	ps  *proxyServer
	efd int
	mu  sync.Mutex
	in  []*answer // added since the thread last looked
	// wake: when the thread wakes up by itself (the zero time: it does
	// not, it waits for an answer to come). An answer due later than
	// that is only added: with a burst of calls in flight, a wake-up of
	// the thread per call would cost the CPU it shares with the load.
	wake time.Time
	// closed: the thread has taken its last look at in (under mu); an
	// answer added after that is answered net.ErrClosed by add itself,
	// or its connection's goroutine would wait for it forever (and stop
	// with it, in ps.wg.Wait).
	closed bool
	stop   atomic.Bool
	gone   chan struct{}
}

func newAnswerer(ps *proxyServer) (*answerer, error) {
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	s := &answerer{ps: ps, efd: efd, gone: make(chan struct{})}
	// The thread's own sleeps return on time only with a P to come back
	// to: with GOMAXPROCS at the CPUs of a taskset of one, the thread in
	// ppoll and a connection's goroutine would take turns.
	if runtime.GOMAXPROCS(0) < 4 {
		runtime.GOMAXPROCS(4)
	}
	go s.run()
	return s, nil
}

var one = [8]byte{1}

func (s *answerer) add(a *answer) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		a.done <- net.ErrClosed
		return
	}
	s.in = append(s.in, a)
	if s.wake.IsZero() || a.deadline.Before(s.wake) {
		s.wake = time.Time{}
		// Under mu: the thread has not ended, so close has not closed
		// efd (its number could be another file's by then).
		_, _ = unix.Write(s.efd, one[:]) // EAGAIN: the counter is already set, the thread wakes anyway
	}
	s.mu.Unlock()
}

func (s *answerer) close() {
	s.stop.Store(true)
	_, _ = unix.Write(s.efd, one[:])
	<-s.gone
	unix.Close(s.efd)
}

// answerHeap orders answers by deadline.
type answerHeap []*answer

func (h answerHeap) Len() int           { return len(h) }
func (h answerHeap) Less(i, j int) bool { return h[i].deadline.Before(h[j].deadline) }
func (h answerHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *answerHeap) Push(x any)        { *h = append(*h, x.(*answer)) }
func (h *answerHeap) Pop() any {
	old := *h
	a := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return a
}

// run is the thread. It is not made real-time (SCHED_FIFO): a Go
// thread at real-time priority that waits for a P held by a thread of
// its own process queued behind it on the same CPU spins until the
// kernel throttles real-time threads (950 ms of each second), and so did
// the answers.
func (s *answerer) run() {
	runtime.LockOSThread()
	defer close(s.gone)
	// The kernel may end a sleep up to the timer slack (50 µs) late to
	// batch wake-ups; this thread's sleeps are its answers' timing.
	_ = unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
	var due answerHeap
	var buf [8]byte
	pfd := []unix.PollFd{{Fd: int32(s.efd), Events: unix.POLLIN}}
	for {
		s.mu.Lock()
		for _, a := range s.in {
			heap.Push(&due, a)
		}
		clear(s.in)
		s.in = s.in[:0]
		var sleep time.Duration
		if len(due) > 0 {
			sleep = time.Until(due[0].deadline) - s.ps.cfg.spin
			s.wake = due[0].deadline.Add(-s.ps.cfg.spin)
		} else {
			s.wake = time.Time{}
		}
		s.closed = s.stop.Load()
		s.mu.Unlock()
		if s.closed {
			for _, a := range due {
				a.done <- net.ErrClosed
			}
			return
		}
		if len(due) == 0 {
			_, _ = unix.Ppoll(pfd, nil, nil)
			_, _ = unix.Read(s.efd, buf[:])
			continue
		}
		if sleep > 0 {
			ts := unix.NsecToTimespec(sleep.Nanoseconds())
			if n, _ := unix.Ppoll(pfd, &ts, nil); n > 0 {
				_, _ = unix.Read(s.efd, buf[:])
			}
			continue
		}
		next := due[0].deadline
		for time.Now().Before(next) {
		}
		for len(due) > 0 && !time.Now().Before(due[0].deadline) {
			a := heap.Pop(&due).(*answer)
			a.done <- a.write(s.ps)
		}
	}
}

// schedPolicy says how the kernel schedules this process, so that a
// run's figures say how the backend was run (its priority against the
// node's and the load's on the cores they share).
func schedPolicy() string {
	a, err := unix.SchedGetAttr(0, 0)
	if err != nil {
		return "scheduling policy unknown: " + err.Error()
	}
	names := map[uint32]string{unix.SCHED_NORMAL: "SCHED_OTHER", unix.SCHED_FIFO: "SCHED_FIFO", unix.SCHED_RR: "SCHED_RR", unix.SCHED_BATCH: "SCHED_BATCH", unix.SCHED_IDLE: "SCHED_IDLE"}
	n := names[a.Policy]
	if n == "" {
		n = fmt.Sprint("policy ", a.Policy)
	}
	var set unix.CPUSet
	cpus := "?"
	if unix.SchedGetaffinity(0, &set) == nil {
		cpus = fmt.Sprint(set.Count())
	}
	return fmt.Sprintf("scheduled %s priority %d nice %d on %s CPU(s), GOMAXPROCS %d", n, a.Priority, a.Nice, cpus, runtime.GOMAXPROCS(0))
}

// verifySignature reports whether h's X-Roost-Signature holds a valid
// signature of body with secret, with an X-Roost-Timestamp within maxSkew
// of now (docs/protocol.md, Proxy hooks). During a rotation the header
// holds one signature per secret: any one matching is enough.
func verifySignature(secret string, h http.Header, body []byte, now time.Time) bool {
	ts, err := strconv.ParseInt(h.Get("X-Roost-Timestamp"), 10, 64)
	if err != nil {
		return false
	}
	if d := now.Sub(time.Unix(ts, 0)); d > maxSkew || d < -maxSkew {
		return false
	}
	want := []byte(proto.SignBody([]string{secret}, ts, body))
	for _, got := range strings.Split(h.Get("X-Roost-Signature"), ",") {
		if hmac.Equal([]byte(strings.TrimSpace(got)), want) {
			return true
		}
	}
	return false
}

// preciseMargin is how far before its deadline a wait leaves the Go
// timer for a nanosleep: a timer parked in the runtime's poller can wake
// up to a millisecond late (and more on a busy machine), a nanosleep
// within the kernel's timer slack (50 µs).
const preciseMargin = 2 * time.Millisecond

// waitUntil returns at deadline, not later than the kernel's timer slack
// on an idle CPU: a Go timer covers the wait but its last preciseMargin,
// and a nanosleep (which blocks this goroutine's thread, the runtime runs
// others meanwhile) the rest.
func waitUntil(deadline time.Time) {
	if d := time.Until(deadline) - preciseMargin; d > 0 {
		time.Sleep(d)
	}
	for {
		d := time.Until(deadline)
		if d <= 0 {
			return
		}
		ts := unix.NsecToTimespec(d.Nanoseconds())
		_ = unix.Nanosleep(&ts, nil) // EINTR (a signal): the loop sleeps what is left
	}
}

// stop ends the backend: no more calls are read, and the answers still
// due are not written.
func (ps *proxyServer) stop() {
	ps.ln.Close()
	ps.mu.Lock()
	for nc := range ps.conns {
		nc.Close()
	}
	ps.mu.Unlock()
	if ps.sched != nil {
		ps.sched.close()
	}
	ps.wg.Wait() // accept has returned: nothing more is adopted
	if ps.loop != nil {
		ps.loop.close()
	}
}

// summary is the backend's counts, and how long its answers took: from
// a call read to its answer written, and how far past its deadline.
func (ps *proxyServer) summary() string {
	s := fmt.Sprintf("%d calls answered, %d refused", ps.calls.Load(), ps.denied.Load())
	if ps.cfg.secret != "" {
		s += fmt.Sprintf(", %d bad signatures", ps.bad.Load())
	}
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) == nil && ps.calls.Load() > 0 {
		// What the backend took from the cores it shares with the node
		// and the load.
		cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		s += fmt.Sprintf("; CPU %.2fs (%.1f µs per call)", cpu.Seconds(), float64(cpu.Microseconds())/float64(ps.calls.Load()))
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.took.Count() > 0 {
		s += fmt.Sprintf("; answers after %s (wait %s): read to written p50 %s p99 %s p999 %s max %s; past their deadline p50 %s p99 %s p999 %s max %s",
			ps.cfg.delay, ps.cfg.wait,
			fmtDur(ps.took.Quantile(0.5)), fmtDur(ps.took.Quantile(0.99)), fmtDur(ps.took.Quantile(0.999)), fmtDur(ps.took.Max()),
			fmtDur(ps.late.Quantile(0.5)), fmtDur(ps.late.Quantile(0.99)), fmtDur(ps.late.Quantile(0.999)), fmtDur(ps.late.Max()))
	}
	return s
}

// probeBackend calls url in bursts, as the bench's publishers make a node
// do, over a pool of kept-alive connections, and prints the latency.
// With a secret each call is signed as a node signs it.
func probeBackend(url string, rate float64, burst int, life time.Duration, secret string, stdout, stderr io.Writer) int {
	if !(rate > 0) || burst < 1 || life > 10*time.Minute {
		fmt.Fprintln(stderr, "roost bench proxy-backend --probe: want --rate > 0, --burst >= 1, --for <= 10m")
		return 2
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 32
	cl := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	var h Hist
	var mu sync.Mutex
	var wg sync.WaitGroup
	var failed atomic.Int64
	body := []byte(`{"type":"publish","app":"probe","user":"u","room":"r","id":"m","body":"x"}`)
	every := time.Duration(float64(burst) / rate * float64(time.Second))
	end := time.Now().Add(life)
	for next := time.Now(); next.Before(end); next = next.Add(every) {
		time.Sleep(time.Until(next))
		for i := 0; i < burst; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				t0 := time.Now()
				req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				if secret != "" {
					ts := t0.Unix()
					req.Header.Set("X-Roost-Timestamp", strconv.FormatInt(ts, 10))
					req.Header.Set("X-Roost-Signature", proto.SignBody([]string{secret}, ts, body))
				}
				resp, err := cl.Do(req)
				if err != nil {
					failed.Add(1)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					failed.Add(1)
					return
				}
				d := time.Since(t0)
				mu.Lock()
				h.Record(d.Nanoseconds())
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	fmt.Fprintf(stdout, "%d calls (%d failed): p50 %s p90 %s p99 %s p999 %s max %s\n", h.Count(), failed.Load(),
		fmtDur(h.Quantile(0.5)), fmtDur(h.Quantile(0.9)), fmtDur(h.Quantile(0.99)), fmtDur(h.Quantile(0.999)), fmtDur(h.Max()))
	return 0
}
