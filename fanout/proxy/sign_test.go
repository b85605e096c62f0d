package proxy

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/roost-chat/roost/proto"
)

// verifier is an app's backend that checks every call as docs/protocol.md
// tells a backend to, written from the docs rather than from the signer:
// a timestamp within five minutes, and one of the comma-separated
// signatures equal to sha256=HEX(HMAC-SHA256(secret, TIMESTAMP "." BODY))
// for a secret it knows. A call that fails gets 401 and no verdict.
type verifier struct {
	srv     *httptest.Server
	mu      sync.Mutex
	secrets []string
	ok, bad int
	sigs    []int // signatures per call
}

func newVerifier(t *testing.T, secrets ...string) *verifier {
	t.Helper()
	v := &verifier{secrets: secrets}
	v.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		sigs := strings.Split(r.Header.Get("X-Roost-Signature"), ",")
		good := v.verify(r.Header.Get("X-Roost-Timestamp"), sigs, body)
		v.mu.Lock()
		v.sigs = append(v.sigs, len(sigs))
		if good {
			v.ok++
		} else {
			v.bad++
		}
		v.mu.Unlock()
		if !good {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		io.WriteString(w, `{"allow":true}`)
	}))
	t.Cleanup(v.srv.Close)
	return v
}

func (v *verifier) verify(ts string, sigs []string, body []byte) bool {
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || time.Since(time.Unix(sec, 0)).Abs() > 5*time.Minute {
		return false
	}
	for _, sg := range sigs {
		for _, s := range v.secrets {
			m := hmac.New(sha256.New, []byte(s))
			m.Write([]byte(ts + "."))
			m.Write(body)
			if hmac.Equal([]byte(sg), []byte("sha256="+hex.EncodeToString(m.Sum(nil)))) {
				return true
			}
		}
	}
	return false
}

func (v *verifier) counts() (ok, bad int, sigs []int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.ok, v.bad, append([]int(nil), v.sigs...)
}

// ask makes n calls to t concurrently and returns them answered.
func ask(t *testing.T, p *Pool, tg Target, n int) []*Call {
	t.Helper()
	done := make(chan *Call, n)
	calls := make([]*Call, n)
	for i := range calls {
		calls[i] = &Call{Kind: Publish, App: "chat", User: "alice", Room: "r", ID: "m" + strconv.Itoa(i),
			Body: []byte(`{"text":"hello ` + strconv.Itoa(i) + `"}`), Done: func(c *Call) { done <- c }}
		if !p.Ask(calls[i], tg) {
			t.Fatalf("call %d not queued: %+v", i, calls[i])
		}
	}
	for range calls {
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("a call was not answered")
		}
	}
	return calls
}

const (
	current  = "current-secret-0123456789"
	previous = "previous-secret-0123456789"
)

// Every call is signed with the app's secret, and a backend checking it
// allows them all: the workers' kept signing state never signs one call
// with what another left behind (many calls, several workers, each
// reusing its signer).
func TestProxyCallsSigned(t *testing.T) {
	v := newVerifier(t, current)
	p := New(Config{Workers: 4})
	defer p.Close()
	for _, c := range ask(t, p, Target{URL: v.srv.URL, Timeout: 2 * time.Second, Secret: current}, 200) {
		if c.Result != Allowed || !c.Allow {
			t.Fatalf("call %s: %v %q", c.ID, ResultNames[c.Result], c.Message)
		}
	}
	ok, bad, sigs := v.counts()
	if ok != 200 || bad != 0 {
		t.Fatalf("backend verified %d, rejected %d of 200", ok, bad)
	}
	for _, n := range sigs {
		if n != 1 {
			t.Fatalf("signatures per call: %v, want 1 outside a rotation", sigs)
		}
	}
}

// During a rotation each call carries two signatures, so that a backend
// that knows only the new secret, or still only the old one, verifies
// every call; once the previous secret expires its signature goes, and a
// backend that never learnt the new secret rejects.
func TestProxyCallsSignedDuringRotation(t *testing.T) {
	p := New(Config{Workers: 2})
	defer p.Close()
	tg := Target{Timeout: 2 * time.Second, Secret: current, PreviousSecret: previous, PreviousUntil: time.Now().Add(time.Hour)}
	for _, knows := range []string{current, previous} {
		v := newVerifier(t, knows)
		tg.URL = v.srv.URL
		for _, c := range ask(t, p, tg, 20) {
			if c.Result != Allowed {
				t.Fatalf("backend knowing %s: call %s %v", knows, c.ID, ResultNames[c.Result])
			}
		}
		_, _, sigs := v.counts()
		for _, n := range sigs {
			if n != 2 {
				t.Fatalf("signatures per call: %v, want 2 during the rotation", sigs)
			}
		}
	}
	old := newVerifier(t, previous)
	tg.URL, tg.PreviousUntil = old.srv.URL, time.Now().Add(-time.Second)
	for _, c := range ask(t, p, tg, 5) {
		if c.Result != Failed || c.Allow || c.Code != proto.CodeOverloaded {
			t.Fatalf("expired previous secret: call %s %v allow=%v", c.ID, ResultNames[c.Result], c.Allow)
		}
	}
	if _, bad, sigs := old.counts(); bad != 5 || sigs[0] != 1 {
		t.Fatalf("backend knowing only the expired secret: %d rejected, %v signatures", bad, sigs)
	}
}

// A backend rejects what roost did not sign: a call signed with another
// secret gets its 401, which the pool takes as a failure (the app's fail
// mode answers: closed refuses), and a forged call without a signature,
// with a stale timestamp, or with its body changed after signing is
// rejected too.
func TestProxyBadSignatureRejected(t *testing.T) {
	v := newVerifier(t, current)
	p := New(Config{})
	defer p.Close()
	for _, c := range ask(t, p, Target{URL: v.srv.URL, Timeout: 2 * time.Second, Secret: "some-other-secret-0123456789"}, 3) {
		if c.Result != Failed || c.Allow {
			t.Fatalf("wrongly signed call answered %v allow=%v", ResultNames[c.Result], c.Allow)
		}
	}
	if _, bad, _ := v.counts(); bad != 3 {
		t.Fatalf("backend rejected %d of 3 wrongly signed calls", bad)
	}
	body := `{"type":"publish","app":"chat","user":"mallory","room":"r"}`
	now := time.Now().Unix()
	forge := func(ts int64, sig, sent string) int {
		req, _ := http.NewRequest(http.MethodPost, v.srv.URL, strings.NewReader(sent))
		req.Header.Set("X-Roost-Timestamp", strconv.FormatInt(ts, 10))
		if sig != "" {
			req.Header.Set("X-Roost-Signature", sig)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for name, code := range map[string]int{
		"unsigned":     forge(now, "", body),
		"stale":        forge(now-600, proto.SignBody([]string{current}, now-600, []byte(body)), body),
		"body changed": forge(now, proto.SignBody([]string{current}, now, []byte(body)), strings.Replace(body, "mallory", "alice", 1)),
	} {
		if code != http.StatusUnauthorized {
			t.Errorf("%s call: backend answered %d, want 401", name, code)
		}
	}
	if code := forge(now, proto.SignBody([]string{current}, now, []byte(body)), body); code != http.StatusOK {
		t.Fatalf("the same call rightly signed: %d", code)
	}
}

// BenchmarkSignCall: what signing adds to one call, on the worker: a
// worker's kept signer and buffer (sign) against signing the webhook's
// way (a fresh HMAC per secret, App.Secrets' slice, Header.Set), for a
// 300-byte call with one secret and with two during a rotation.
func BenchmarkSignCall(b *testing.B) {
	body := []byte(`{"type":"publish","app":"chat","user":"alice","room":"r","id":"m1","body":` +
		`"` + strings.Repeat("x", 216) + `","client":"127.0.0.1:40000"}`)
	for _, rot := range []bool{false, true} {
		tg := Target{Secret: current}
		app := proto.App{Secret: current}
		name := "secrets=1"
		if rot {
			tg.PreviousSecret, tg.PreviousUntil = previous, time.Now().Add(time.Hour)
			app.PreviousSecret, app.PreviousUntil = previous, tg.PreviousUntil
			name = "secrets=2"
		}
		b.Run("kept/"+name, func(b *testing.B) {
			var sg signing
			h := http.Header{}
			b.ReportAllocs()
			for b.Loop() {
				sg.sign(h, &tg, body, time.Now())
			}
		})
		b.Run("fresh/"+name, func(b *testing.B) {
			h := http.Header{}
			b.ReportAllocs()
			for b.Loop() {
				now := time.Now()
				h.Set("X-Roost-Timestamp", strconv.FormatInt(now.Unix(), 10))
				h.Set("X-Roost-Signature", proto.SignBody(app.Secrets(now), now.Unix(), body))
			}
		})
	}
}

// BenchmarkCall: one whole call, asked and answered by a local backend,
// signed and not (no secret), one at a time: the signature's share of a
// call's cost.
func BenchmarkCall(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, `{"allow":true}`)
	}))
	defer srv.Close()
	for _, name := range []string{"unsigned", "signed", "signed-nethttp"} {
		tg := Target{URL: srv.URL, Timeout: 5 * time.Second}
		if name != "unsigned" {
			tg.Secret = current
		}
		cfg := Config{Workers: 1}
		if name == "signed-nethttp" {
			// What calls cost through net/http's Transport (an https
			// target's way) rather than the direct client.
			tr := http.DefaultTransport.(*http.Transport).Clone()
			cfg.Client = &http.Client{Transport: tr}
		}
		b.Run(name, func(b *testing.B) {
			p := New(cfg)
			defer p.Close()
			done := make(chan *Call, 1)
			c := &Call{Kind: Publish, App: "chat", User: "alice", Room: "r", ID: "m1",
				Body: []byte(`"` + strings.Repeat("x", 216) + `"`), Client: "127.0.0.1:40000", Done: func(c *Call) { done <- c }}
			b.ReportAllocs()
			for b.Loop() {
				p.Ask(c, tg)
				if (<-done).Result != Allowed {
					b.Fatal(ResultNames[c.Result])
				}
			}
		})
	}
}
