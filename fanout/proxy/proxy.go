// Package proxy asks an app's backend whether to accept a connection or a
// publish (docs/protocol.md, Proxy hooks): a POST of a small JSON, answered
// {"allow":true} or {"allow":false,"code":..,"message":..}.
//
// The event loops never wait for a backend. A loop hands a Call to Ask,
// which queues it without blocking, and gets the verdict back through the
// Call's Done, which a loop implements by pushing to its own inbox. Each
// app has its own bounded queue and its own workers (started on demand,
// gone when idle), so that a slow or dead backend fills only its own
// app's queue: other apps' calls never wait behind it. HTTP connections
// are kept alive between calls (one pooled transport).
package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/bytedance/sonic"

	"github.com/roost-chat/roost/fanout/hist"
	"github.com/roost-chat/roost/fanout/hooknet"
	"github.com/roost-chat/roost/proto"
)

// Kind is what a call asks about.
type Kind uint8

const (
	Connect Kind = iota
	Publish
	numKinds
)

// KindNames label the kinds in metrics and in the JSON sent.
var KindNames = [numKinds]string{"connect", "publish"}

// Result is how a call ended.
type Result uint8

const (
	Allowed Result = iota // the backend said yes
	Denied                // the backend said no
	Timeout               // no answer within the timeout
	Failed                // unreachable, a non-2xx status, or an answer that does not parse
	Full                  // the app's queue was full: not asked at all
	numResults
)

// ResultNames label the results in metrics.
var ResultNames = [numResults]string{"allowed", "denied", "timeout", "error", "queue_full"}

// Target is one hook of an app, as its registry entry resolves.
type Target struct {
	URL      string
	Timeout  time.Duration
	FailOpen bool
	// InFlight, when positive, replaces the pool's Workers for this app
	// (the app's own setting).
	InFlight int
	// The app's secrets sign each call as webhooks are signed
	// (proto.Signer); the previous one until PreviousUntil, during a
	// rotation. No secret: not signed.
	Secret, PreviousSecret string
	PreviousUntil          time.Time
}

// secrets are t's secrets valid at now, in s's room.
func (t *Target) secrets(now time.Time, s *[2]string) []string {
	s[0] = t.Secret
	if t.PreviousSecret != "" && now.Before(t.PreviousUntil) {
		s[1] = t.PreviousSecret
		return s[:2]
	}
	return s[:1]
}

// Call is one question to a backend and, once Done runs, its answer.
// The fields above the answer are the caller's and must not change until
// Done; Body is borrowed for as long.
type Call struct {
	Kind   Kind
	App    string
	User   string
	Room   string // publish
	ID     string // publish: the client's id
	Body   []byte // publish: the body, a raw JSON value
	Client string // the client's address, host:port

	// Done is called once with the answer, on a worker goroutine. It must
	// not block (a loop pushes to its inbox).
	Done func(*Call)
	// Ref is the caller's, untouched here (a loop's pending publish).
	Ref any

	// The answer. Allow is what to do: the backend's verdict, or the
	// app's fail mode when the backend did not give one.
	Allow   bool
	Result  Result
	Code    proto.Code // refused: the err code (forbidden unless the backend gave another)
	Message string     // refused: why, at most MaxMessage bytes

	target Target
	asked  time.Time
}

// MaxMessage bounds a refusal's message: it must fit a close frame's
// reason (123 bytes) with room to spare.
const MaxMessage = 100

// The pool's sizes per app: the defaults, and the most a node accepts
// (each call in flight is a goroutine and an HTTP connection, each one
// waiting a Call held with its publish).
const (
	DefaultInFlight = 32
	DefaultQueue    = 1024
	MaxInFlight     = proto.MaxProxyInFlight
	MaxQueue        = 1 << 20
)

// Config sizes the pool.
type Config struct {
	// Workers is the most calls in flight per app (0: DefaultInFlight):
	// the HTTP connections one app's backend sees from this node.
	Workers int
	// Queue is the most calls of one app not yet taken by a worker (0:
	// DefaultQueue), those a worker was just started for included: a
	// burst needs room here even while workers are free. Past it a call
	// is answered at once with Full and the app's fail mode.
	Queue int
	Log   *slog.Logger
	// Client, when set, makes every call (tests, a custom transport);
	// else plain-HTTP calls are made directly (direct.go) and https ones
	// through a kept-alive net/http pool.
	Client *http.Client
}

// Stats counts calls by kind and result. Any goroutine.
type Stats struct {
	Calls [numKinds][numResults]atomic.Uint64
}

// Pool asks the backends. Any goroutine may call its methods.
type Pool struct {
	cfg    Config
	log    *slog.Logger
	client *http.Client
	Stats  Stats
	// latency: each call's seconds, asked to answered
	// (roost_proxy_call_seconds).
	latency *hist.Histogram

	// direct: plain-HTTP calls are made by the workers themselves
	// (direct.go), not through client.
	direct bool

	mu     sync.Mutex
	apps   map[string]*appQueue
	closed bool
	stop   chan struct{}
}

// appQueue is one app's calls waiting and its workers.
type appQueue struct {
	ch      chan *Call
	running atomic.Int32 // workers started and not yet gone
	idle    atomic.Int32 // workers waiting for a call
	failing atomic.Bool  // a failure was logged and no success since (logs once per outage)

	// mu guards parked and closed: the workers waiting on a kept
	// connection for a call written to it (handoff.go), and whether the
	// pool closed (none may park then).
	mu     sync.Mutex
	parked []*worker
	closed bool
}

// idleExit is how long a worker waits for a call before it goes: an app
// whose clients stopped costs no goroutine after that.
const idleExit = 30 * time.Second

// New returns a pool.
func New(cfg Config) *Pool {
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultInFlight
	}
	if cfg.Queue <= 0 {
		cfg.Queue = DefaultQueue
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	c := cfg.Client
	if c == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.DialContext = hooknet.Default.Dialer().DialContext
		// Keep idle every connection the calls used at once (apps
		// sharing a backend host, an app's own InFlight above Workers),
		// so that a steady flow of calls reuses them instead of dialling;
		// what is kept is bounded by what was in use, and closes after
		// IdleConnTimeout.
		tr.MaxIdleConns = 0
		tr.MaxIdleConnsPerHost = MaxInFlight
		tr.IdleConnTimeout = 90 * time.Second
		// A redirect is the backend's answer, and not a 2xx one: followed,
		// a 301-303 would turn the POST into a GET of another URL, unsigned
		// for it, where the direct client (and the docs) fail the call.
		c = &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		}}
	}
	return &Pool{cfg: cfg, log: cfg.Log, client: c, direct: cfg.Client == nil && directOK(),
		latency: hist.New("roost_proxy_call_seconds", hist.LatencyBuckets),
		apps:    map[string]*appQueue{}, stop: make(chan struct{})}
}

// Ask queues c for t's backend and never blocks. It reports false when c
// was not queued (the app's queue is full, or the pool is closed): c then
// holds its answer already (Full, with t's fail mode) and Done is not
// called. Otherwise Done is called once, within t.Timeout and a little.
func (p *Pool) Ask(c *Call, t Target) bool {
	if t.Timeout <= 0 {
		t.Timeout = proto.DefaultProxyTimeout
	}
	c.target, c.asked = t, time.Now()
	q := p.queue(c.App)
	if q == nil {
		p.answer(c, Full, 0, "")
		return false
	}
	if p.direct && p.handOff(q, c) {
		return true
	}
	select {
	case q.ch <- c:
	default:
		p.answer(c, Full, 0, "")
		return false
	}
	// Start a worker unless enough are waiting or the app has its
	// maximum. Calls queued, not just none idle: a worker counted idle may
	// not have run yet to take the call before this one (on a busy node
	// the loops hold the CPU), and a burst would otherwise wait for the
	// few idle ones in turn.
	most := p.cfg.Workers
	if t.InFlight > 0 {
		most = min(t.InFlight, MaxInFlight)
	}
	for int(q.idle.Load()) < len(q.ch) {
		r := q.running.Load()
		if int(r) >= most {
			break
		}
		if q.running.CompareAndSwap(r, r+1) {
			go p.work(q)
			break
		}
	}
	if int(q.idle.Load()) < len(q.ch) && int(q.running.Load()) >= most {
		// Parked workers do not take calls from the queue.
		p.kick(q)
	}
	return true
}

func (p *Pool) queue(app string) *appQueue {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	q := p.apps[app]
	if q == nil {
		q = &appQueue{ch: make(chan *Call, p.cfg.Queue)}
		p.apps[app] = q
	}
	return q
}

// Close stops the workers once their current call is answered; calls
// still queued are not answered (the node is stopping).
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed {
		p.closed = true
		close(p.stop)
		for _, q := range p.apps {
			q.mu.Lock()
			q.closed = true
			q.mu.Unlock()
			p.closeParked(q)
		}
	}
}

// signing is a worker's own: its signer and the buffer it signs into,
// kept from one call to the next.
type signing struct {
	signer proto.Signer
	sig    []byte
}

// sign sets h's X-Roost-Timestamp and X-Roost-Signature for body, sent
// at now, so that a backend can tell the node's calls from forged ones
// (docs/protocol.md, Proxy hooks). A target without a secret is not
// signed (every registry app has one).
func (sg *signing) sign(h http.Header, t *Target, body []byte, now time.Time) {
	ts, sig, ok := sg.values(t, body, now)
	if !ok {
		return
	}
	// One string and one slice for both values: the header needs
	// strings, and each conversion or slice is an allocation.
	v := string(sg.sig)
	vs := make([]string, 2)
	vs[0], vs[1] = v[:len(ts)], v[len(ts):len(ts)+len(sig)]
	h["X-Roost-Timestamp"] = vs[0:1:1]
	h["X-Roost-Signature"] = vs[1:2:2]
}

// values are the X-Roost-Timestamp and X-Roost-Signature of body sent at
// now, in sg's buffer (valid until the next call); not ok: t has no
// secret, the call is not signed.
func (sg *signing) values(t *Target, body []byte, now time.Time) (ts, sig []byte, ok bool) {
	if t.Secret == "" {
		return nil, nil, false
	}
	var sec [2]string
	sg.sig = strconv.AppendInt(sg.sig[:0], now.Unix(), 10)
	n := len(sg.sig)
	sg.sig = sg.signer.Append(sg.sig, t.secrets(now, &sec), now.Unix(), body)
	return sg.sig[:n], sg.sig[n:], true
}

func (p *Pool) work(q *appQueue) {
	w := newWorker()
	defer w.d.close()
	idle := time.NewTimer(idleExit)
	defer idle.Stop()
	for {
		if p.direct && len(w.d.conns) > 0 {
			switch p.park(q, w) {
			case parkAgain:
				continue
			case parkExit:
				q.running.Add(-1)
				return
			}
			idle.Reset(idleExit)
		}
		q.idle.Add(1)
		select {
		case c := <-q.ch:
			q.idle.Add(-1)
			p.do(q, c, &w.sg, &w.d)
			idle.Reset(idleExit)
		case <-idle.C:
			q.idle.Add(-1)
			if len(q.ch) > 0 {
				// A call came as this worker was leaving (Ask saw it
				// idle and started none): stay.
				idle.Reset(idleExit)
				continue
			}
			q.running.Add(-1)
			return
		case <-p.stop:
			q.idle.Add(-1)
			q.running.Add(-1)
			return
		}
	}
}

// request is the JSON a backend receives.
type request struct {
	Type   string          `json:"type"`
	App    string          `json:"app"`
	User   string          `json:"user"`
	Room   string          `json:"room,omitempty"`
	ID     string          `json:"id,omitempty"`
	Body   json.RawMessage `json:"body,omitempty"`
	Client string          `json:"client,omitempty"`
}

// response is the JSON a backend answers.
type response struct {
	Allow   *bool  `json:"allow"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

// answerAllow is the answer most calls get, as a backend usually writes it.
const answerAllow = `{"allow":true}`

// maxAnswer bounds what is read of an answer.
const maxAnswer = 4 << 10

func (p *Pool) do(q *appQueue, c *Call, sg *signing, d *direct) {
	t0 := c.asked
	t := &c.target
	body, err := sonic.Marshal(&request{Type: KindNames[c.Kind], App: c.App, User: c.User, Room: c.Room, ID: c.ID, Body: c.Body, Client: c.Client})
	if err != nil {
		p.fail(q, c, Failed, err, t0)
		return
	}
	if p.direct {
		if e := d.endpoint(c.Kind, t.URL); e.ok {
			b, err := d.roundTrip(e, c, body, sg, c.asked.Add(t.Timeout))
			p.finish(q, c, b, err, t0)
			return
		}
	}
	// The timeout counts from the ask: a call that waited in the queue
	// past it is answered without being made.
	ctx, cancel := context.WithDeadline(context.Background(), c.asked.Add(t.Timeout))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.URL, bytes.NewReader(body))
	if err != nil {
		p.fail(q, c, Failed, err, t0)
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "roost-proxy")
	req.Header.Set("X-Roost-App", c.App)
	sg.sign(req.Header, t, body, time.Now())
	resp, err := p.client.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			p.fail(q, c, Timeout, err, t0)
		} else {
			p.fail(q, c, Failed, err, t0)
		}
		return
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
	// The rest is drained (bounded) so that the connection is reused.
	_, _ = io.CopyN(io.Discard, resp.Body, 64<<10)
	resp.Body.Close()
	switch {
	case err != nil && errors.Is(err, context.DeadlineExceeded):
		p.fail(q, c, Timeout, err, t0)
		return
	case err != nil:
		p.fail(q, c, Failed, err, t0)
		return
	case resp.StatusCode/100 != 2:
		p.fail(q, c, Failed, errors.New("status "+resp.Status), t0)
		return
	}
	p.verdict(q, c, b, t0)
}

// finish answers c with what a direct call returned.
func (p *Pool) finish(q *appQueue, c *Call, b []byte, err error, t0 time.Time) {
	switch {
	case err != nil && isTimeout(err):
		p.fail(q, c, Timeout, err, t0)
	case err != nil:
		p.fail(q, c, Failed, err, t0)
	default:
		p.verdict(q, c, b, t0)
	}
}

// verdict answers c with the backend's answer b (a 2xx body).
func (p *Pool) verdict(q *appQueue, c *Call, b []byte, t0 time.Time) {
	if len(b) > maxAnswer {
		p.fail(q, c, Failed, errors.New("answer larger than 4 KiB"), t0)
		return
	}
	if string(b) == answerAllow {
		// The usual answer, without the decoder's allocations.
		q.failing.Store(false)
		p.answer(c, Allowed, 0, "")
		p.done(c, t0)
		return
	}
	var r response
	if err := sonic.Unmarshal(b, &r); err != nil || r.Allow == nil {
		p.fail(q, c, Failed, errors.New(`answer is not {"allow":true|false,...}`), t0)
		return
	}
	q.failing.Store(false)
	if *r.Allow {
		p.answer(c, Allowed, 0, "")
	} else {
		// Cloned: the decoder's strings may share b, which the direct
		// client reuses for the next answer.
		p.answer(c, Denied, codeOf(r.Code), strings.Clone(r.Message))
	}
	p.done(c, t0)
}

// fail answers c with t's fail mode and logs the first failure of an
// outage (a dead backend would otherwise log once per call).
func (p *Pool) fail(q *appQueue, c *Call, r Result, err error, t0 time.Time) {
	if !q.failing.Swap(true) {
		p.log.Warn("proxy call failed; the app's fail mode answers until its backend does", "app", c.App,
			"kind", KindNames[c.Kind], "url", c.target.URL, "err", err, "fail_open", c.target.FailOpen)
	}
	p.answer(c, r, 0, "")
	p.done(c, t0)
}

func (p *Pool) done(c *Call, t0 time.Time) {
	p.latency.Observe(time.Since(t0).Seconds())
	c.Done(c)
}

// answer fills c's verdict and counts it. A failure (Timeout, Failed,
// Full) allows with FailOpen, else refuses with overloaded: the client
// tries again later, as after any transient refusal.
func (p *Pool) answer(c *Call, r Result, code proto.Code, msg string) {
	c.Result = r
	p.Stats.Calls[c.Kind][r].Add(1)
	switch r {
	case Allowed:
		c.Allow = true
	case Denied:
		c.Allow, c.Code = false, code
		if c.Code == 0 {
			c.Code = proto.CodeForbidden
		}
		c.Message = clip(msg)
		if c.Message == "" {
			c.Message = "refused by the app"
		}
	default:
		c.Allow = c.target.FailOpen
		c.Code = proto.CodeOverloaded
		c.Message = "the app's " + KindNames[c.Kind] + " check did not answer: retry later"
	}
}

// codeOf maps a backend's code to an err code; one the protocol does not
// have becomes forbidden.
func codeOf(name string) proto.Code {
	for c := proto.CodeBadRequest; c <= proto.CodeInternal; c++ {
		if c.String() == name {
			return c
		}
	}
	return proto.CodeForbidden
}

// clip cuts s to MaxMessage bytes on a rune boundary, and replaces what
// is not UTF-8 (it goes into a close reason, which must be).
func clip(s string) string {
	if !utf8.ValidString(s) {
		s = string(bytes.ToValidUTF8([]byte(s), []byte("?")))
	}
	if len(s) <= MaxMessage {
		return s
	}
	i := MaxMessage
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i]
}
