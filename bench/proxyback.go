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

func containsBody(b []byte, s string) bool {
	return bytes.Contains(b, []byte(s))
}
