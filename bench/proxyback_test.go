//go:build linux

package bench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/roost-chat/roost/proto"
)

// The bench backend verifies each call's signature as an app's backend
// would: good ones (also one of two during a rotation) are answered,
// forged, missing, stale or for another body are refused 401 and counted.
func TestProxyBackendVerifiesSignatures(t *testing.T) {
	const secret = "s3cret"
	pb, err := startProxyBackend("127.0.0.1:0", backendConfig{delay: time.Millisecond, secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	defer pb.stop()
	body := []byte(`{"type":"publish","app":"a","user":"u","room":"r","id":"1","body":"x"}`)
	now := time.Now().Unix()
	good := proto.SignBody([]string{secret}, now, body)
	cases := []struct {
		name, ts, sig string
		body          []byte
		want          int
	}{
		{"good", strconv.FormatInt(now, 10), good, body, 200},
		{"rotation, the new secret first", strconv.FormatInt(now, 10), proto.SignBody([]string{"next", secret}, now, body), body, 200},
		{"other secret", strconv.FormatInt(now, 10), proto.SignBody([]string{"other"}, now, body), body, 401},
		{"other body", strconv.FormatInt(now, 10), good, []byte(`{"type":"publish"}`), 401},
		{"unsigned", "", "", body, 401},
		{"no timestamp", "", good, body, 401},
		{"stale", strconv.FormatInt(now-600, 10), proto.SignBody([]string{secret}, now-600, body), body, 401},
		{"truncated", strconv.FormatInt(now, 10), good[:len(good)-1], body, 401},
	}
	for _, c := range cases {
		req, _ := http.NewRequest(http.MethodPost, pb.url+"/publish", bytes.NewReader(c.body))
		if c.ts != "" {
			req.Header.Set("X-Roost-Timestamp", c.ts)
		}
		if c.sig != "" {
			req.Header.Set("X-Roost-Signature", c.sig)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%s: status %d (%s), want %d", c.name, resp.StatusCode, b, c.want)
		}
		if c.want == 200 && string(b) != `{"allow":true}` {
			t.Errorf("%s: answer %s", c.name, b)
		}
	}
	if got := pb.bad.Load(); got != 6 {
		t.Errorf("bad signatures counted %d, want 6", got)
	}
	if s := pb.summary(); !strings.Contains(s, "8 calls answered") || !strings.Contains(s, "6 bad signatures") || !strings.Contains(s, "past their deadline") {
		t.Errorf("summary %q", s)
	}
}

// Without a secret nothing is verified: an unsigned call is allowed.
func TestProxyBackendUnverified(t *testing.T) {
	pb, err := startProxyBackend("127.0.0.1:0", backendConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer pb.stop()
	resp, err := http.Post(pb.url+"/connect", "application/json", strings.NewReader(`{"type":"connect"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || pb.bad.Load() != 0 || strings.Contains(pb.summary(), "bad signatures") {
		t.Errorf("status %d, bad %d, summary %q", resp.StatusCode, pb.bad.Load(), pb.summary())
	}
}

// A precise wait never ends before its deadline.
func TestWaitUntilNotEarly(t *testing.T) {
	for _, d := range []time.Duration{0, 100 * time.Microsecond, time.Millisecond, 3 * time.Millisecond} {
		dl := time.Now().Add(d)
		waitUntil(dl)
		if early := time.Until(dl); early > 0 {
			t.Errorf("wait of %s ended %s early", d, early)
		}
	}
}

// Every way of waiting answers each call, never before its delay, over
// kept-alive connections several at a time, and counts the answers' timing.
func TestProxyBackendWaits(t *testing.T) {
	const delay = 2 * time.Millisecond
	for _, wait := range []string{waitLoop, waitThread, waitPrecise, waitTimer} {
		pb, err := startProxyBackend("127.0.0.1:0", backendConfig{delay: delay, wait: wait, deny: "nope"})
		if err != nil {
			t.Fatal(err)
		}
		cl := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
		errs := make(chan error, 4)
		for g := 0; g < 4; g++ {
			go func() {
				for i := 0; i < 10; i++ {
					body, want := `{"type":"publish","body":"x"}`, `{"allow":true}`
					if i == 3 {
						body, want = `{"type":"publish","body":"nope"}`, `{"allow":false,"code":"forbidden","message":"refused by the bench backend"}`
					}
					t0 := time.Now()
					resp, err := cl.Post(pb.url+"/publish", "application/json", strings.NewReader(body))
					if err != nil {
						errs <- err
						return
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if took := time.Since(t0); took < delay || resp.StatusCode != 200 || string(b) != want {
						errs <- fmt.Errorf("%s: status %d, answer %s after %s", wait, resp.StatusCode, b, took)
						return
					}
				}
				errs <- nil
			}()
		}
		for g := 0; g < 4; g++ {
			if err := <-errs; err != nil {
				t.Error(err)
			}
		}
		cl.CloseIdleConnections()
		pb.stop()
		if s := pb.summary(); !strings.Contains(s, "40 calls answered, 4 refused") || !strings.Contains(s, "(wait "+wait) {
			t.Errorf("%s: summary %q", wait, s)
		}
	}
}

// A call read just before the backend stops can reach the answer thread
// after the thread has ended: it is answered net.ErrClosed at once, so its
// connection's goroutine ends and stop returns.
func TestProxyBackendAnswerAfterStop(t *testing.T) {
	pb, err := startProxyBackend("127.0.0.1:0", backendConfig{delay: time.Hour, wait: waitThread})
	if err != nil {
		t.Fatal(err)
	}
	pb.stop()
	a := &answer{deadline: time.Now(), timed: true, done: make(chan error, 1)}
	pb.sched.add(a)
	select {
	case err := <-a.done:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("answer after stop: %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("an answer added after stop was never answered: its connection's goroutine waits forever")
	}
}

// A request head that does not end is cut off at maxRequestHead: the
// connection is answered 400 and closed rather than read into memory
// without a bound.
func TestProxyBackendBoundsRequestHead(t *testing.T) {
	_, c := dialProxyBackend(t, backendConfig{})
	go func() {
		_, _ = io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nX-Long: ")
		chunk := bytes.Repeat([]byte("a"), 64<<10)
		for i := 0; i < 4*maxRequestHead/len(chunk); i++ {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	}()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("after %d bytes of one header the backend still reads: no bound on a request's head", 4*maxRequestHead)
	}
	// The 400 may be lost to the reset of a close with unread input.
	if len(got) > 0 && !bytes.HasPrefix(got, []byte("HTTP/1.1 400")) {
		t.Fatalf("answer %q, want 400", got)
	}
}

// The loop backend takes a request however its bytes arrive (split
// mid-head and mid-body, two pipelined in one write) and answers them in
// order, each not before its delay from its receipt; Connection: close closes after the
// answer.
func TestProxyBackendLoopSplitAndPipelined(t *testing.T) {
	const delay = 3 * time.Millisecond
	pb, c := dialProxyBackend(t, backendConfig{delay: delay, wait: waitLoop, deny: "nope"})
	req := func(body string, close bool) string {
		h := "POST /publish HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
		if close {
			h += "Connection: close\r\n"
		}
		return h + "Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	}
	one := req(`{"body":"x"}`, false)
	t0 := time.Now()
	for _, part := range []string{one[:10], one[10 : len(one)-4], one[len(one)-4:]} {
		if _, err := io.WriteString(c, part); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if took := time.Since(t0); string(b) != `{"allow":true}` || took < delay {
		t.Fatalf("split request: %s after %s", b, took)
	}
	t0 = time.Now()
	if _, err := io.WriteString(c, req(`{"body":"nope"}`, false)+req(`{"body":"y"}`, true)); err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{`"allow":false`, `{"allow":true}`} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("pipelined %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		// Both were received at once, so both are due at once.
		if took := time.Since(t0); !strings.Contains(string(b), want) || took < delay {
			t.Fatalf("pipelined %d: %s after %s, want %s after %s", i, b, took, want, delay)
		}
	}
	if n, err := br.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("after Connection: close: read %d, %v; want EOF", n, err)
	}
	if s := pb.summary(); !strings.Contains(s, "3 calls answered, 1 refused") || !strings.Contains(s, "(wait loop)") {
		t.Errorf("summary %q", s)
	}
}

// The loop counts each delay from the kernel's receive time, rounded up
// to its slice: what it reports from read to written is the delay and
// at most a slice and a wake-up more, never less.
func TestProxyBackendLoopTiming(t *testing.T) {
	const delay = 2 * time.Millisecond
	const slice = 500 * time.Microsecond
	pb, err := startProxyBackend("127.0.0.1:0", backendConfig{delay: delay, wait: waitLoop, slice: slice})
	if err != nil {
		t.Fatal(err)
	}
	cl := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2}}
	for i := 0; i < 20; i++ {
		resp, err := cl.Post(pb.url+"/publish", "application/json", strings.NewReader(`{"body":"x"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	cl.CloseIdleConnections()
	pb.stop()
	// The histogram's buckets are a few percent wide: hence the 9/10.
	if lo := pb.took.Quantile(0.01); lo < delay*9/10 {
		t.Errorf("answers written %s after their read, before their delay of %s", lo, delay)
	}
	if p50 := pb.took.Quantile(0.5); p50 > delay+slice+5*time.Millisecond {
		t.Errorf("read to written p50 %s, want about %s", p50, delay)
	}
}

// dialProxyBackend starts a backend with cfg and opens one raw connection
// to it; both end with the test.
func dialProxyBackend(t *testing.T, cfg backendConfig) (*proxyServer, net.Conn) {
	t.Helper()
	pb, err := startProxyBackend("127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pb.stop)
	c, err := net.Dial("tcp", strings.TrimPrefix(pb.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return pb, c
}
