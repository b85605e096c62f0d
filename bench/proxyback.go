package bench

import (
	"bytes"
	"context"
	"crypto/hmac"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
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
	fs := flag.NewFlagSet("roost bench proxy-backend", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:0", "`ADDR` to serve on")
	delay := fs.Duration("delay", 5*time.Millisecond, "how long each answer takes")
	deny := fs.String("deny-body", "", "refuse publishes whose body contains this text (empty: allow all)")
	wait := fs.String("wait", "precise", "how the --delay is waited: precise (a timer to just short of the deadline, then a nanosleep of the rest) or timer (a Go timer alone, which can wake a millisecond late)")
	secret := fs.String("secret", "", "verify each call's X-Roost-Signature against the app's `SECRET` (default $ROOST_SECRET; empty: not verified); a call that fails is answered 401 and counted")
	life := fs.Duration("for", 10*time.Minute, "stop after this long")
	probe := fs.String("probe", "", "instead of serving, call the backend at `URL` as a node would (--rate calls per second in bursts of --burst, for --for, signed with --secret) and print the latency: what the backend and the HTTP round trip cost without a node")
	rate := fs.Float64("rate", 1000, "with --probe: calls per second")
	burst := fs.Int("burst", 30, "with --probe: calls sent at once")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "roost bench proxy-backend: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *secret == "" {
		*secret = os.Getenv("ROOST_SECRET")
	}
	if *probe != "" {
		return probeBackend(*probe, *rate, *burst, *life, *secret, stdout, stderr)
	}
	if *wait != "precise" && *wait != "timer" {
		fmt.Fprintf(stderr, "roost bench proxy-backend: --wait is precise or timer, not %q\n", *wait)
		return 2
	}
	if *delay < 0 {
		fmt.Fprintln(stderr, "roost bench proxy-backend: --delay must not be negative")
		return 2
	}
	pb, err := startProxyBackend(*listen, backendConfig{delay: *delay, deny: *deny, precise: *wait == "precise", secret: *secret})
	if err != nil {
		fmt.Fprintln(stderr, "roost bench proxy-backend:", err)
		return 1
	}
	fmt.Fprintln(stdout, pb.url)
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
	srv                *http.Server
	cfg                backendConfig
	calls, denied, bad atomic.Int64

	mu   sync.Mutex
	late Hist // ns each wait ended past its deadline: the backend's own error on --delay
}

// backendConfig is what a proxy-backend does with each call.
type backendConfig struct {
	delay   time.Duration
	deny    string // refuse publishes whose body contains it (empty: none)
	precise bool   // wait the delay out with waitUntil, not a Go timer alone
	secret  string // verify X-Roost-Signature against it (empty: not verified)
}

// maxSkew is how far a call's X-Roost-Timestamp may be from the
// backend's clock, as a real backend would bound replays.
const maxSkew = 5 * time.Minute

// startProxyBackend serves on addr: every POST is answered after
// cfg.delay, counted from when its request was read, allowed unless its
// body contains cfg.deny (non-empty); with cfg.secret, a call whose
// signature does not verify is answered 401 at once.
func startProxyBackend(addr string, cfg backendConfig) (*proxyServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	ps := &proxyServer{url: "http://" + ln.Addr().String(), cfg: cfg}
	allow, refuse := []byte(`{"allow":true}`), []byte(`{"allow":false,"code":"forbidden","message":"refused by the bench backend"}`)
	ps.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		deadline := time.Now().Add(cfg.delay)
		ps.calls.Add(1)
		if cfg.secret != "" && !verifySignature(cfg.secret, r.Header, body, time.Now()) {
			ps.bad.Add(1)
			http.Error(w, "bad or missing X-Roost-Signature", http.StatusUnauthorized)
			return
		}
		if cfg.delay > 0 {
			if cfg.precise {
				waitUntil(deadline)
			} else {
				time.Sleep(cfg.delay)
			}
			late := time.Since(deadline)
			ps.mu.Lock()
			ps.late.Record(late.Nanoseconds())
			ps.mu.Unlock()
		}
		w.Header().Set("Content-Type", "application/json")
		if cfg.deny != "" && bytes.Contains(body, []byte(cfg.deny)) {
			ps.denied.Add(1)
			_, _ = w.Write(refuse)
			return
		}
		_, _ = w.Write(allow)
	})}
	go func() { _ = ps.srv.Serve(ln) }()
	return ps, nil
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

// stop ends the backend.
func (ps *proxyServer) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = ps.srv.Shutdown(ctx)
}

// summary is the backend's counts, and how late its waits ended.
func (ps *proxyServer) summary() string {
	s := fmt.Sprintf("%d calls answered, %d refused", ps.calls.Load(), ps.denied.Load())
	if ps.cfg.secret != "" {
		s += fmt.Sprintf(", %d bad signatures", ps.bad.Load())
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.late.Count() > 0 {
		s += fmt.Sprintf("; waits of %s ended past their deadline by p50 %s p99 %s p999 %s max %s", ps.cfg.delay,
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
