package bench

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
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
	life := fs.Duration("for", 10*time.Minute, "stop after this long")
	probe := fs.String("probe", "", "instead of serving, call the backend at `URL` as a node would (--rate calls per second in bursts of --burst, for --for) and print the latency: what the backend and the HTTP round trip cost without a node")
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
	if *probe != "" {
		return probeBackend(*probe, *rate, *burst, *life, stdout, stderr)
	}
	pb, err := startProxyBackend(*listen, *delay, *deny)
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
	calls, denied := pb.stop()
	fmt.Fprintf(stderr, "roost bench proxy-backend: %d calls answered, %d refused\n", calls, denied)
	return 0
}

// proxyServer is a running proxy hook backend.
type proxyServer struct {
	url           string
	srv           *http.Server
	calls, denied atomic.Int64
}

// startProxyBackend serves on addr: every POST is answered after delay,
// allowed unless its body contains deny (non-empty).
func startProxyBackend(addr string, delay time.Duration, deny string) (*proxyServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	ps := &proxyServer{url: "http://" + ln.Addr().String()}
	allow, refuse := []byte(`{"allow":true}`), []byte(`{"allow":false,"code":"forbidden","message":"refused by the bench backend"}`)
	ps.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		ps.calls.Add(1)
		if delay > 0 {
			time.Sleep(delay)
		}
		w.Header().Set("Content-Type", "application/json")
		if deny != "" && bytes.Contains(body, []byte(deny)) {
			ps.denied.Add(1)
			_, _ = w.Write(refuse)
			return
		}
		_, _ = w.Write(allow)
	})}
	go func() { _ = ps.srv.Serve(ln) }()
	return ps, nil
}

// stop ends the backend and returns its counts.
func (ps *proxyServer) stop() (calls, denied int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = ps.srv.Shutdown(ctx)
	return ps.calls.Load(), ps.denied.Load()
}

// probeBackend calls url in bursts, as the bench's publishers make a node
// do, over a pool of kept-alive connections, and prints the latency.
func probeBackend(url string, rate float64, burst int, life time.Duration, stdout, stderr io.Writer) int {
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
				resp, err := cl.Post(url, "application/json", bytes.NewReader(body))
				if err != nil {
					failed.Add(1)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
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
