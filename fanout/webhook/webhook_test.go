package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
	"github.com/roost-chat/roost/proto/prototest"
)

// receiver is a real HTTP server that checks every POST's signatures and
// records the (room, seq) of every event in arrival order.
type receiver struct {
	t       *testing.T
	secrets []string

	mu       sync.Mutex
	fail     int // answer this many POSTs with 500 first
	posts    int
	events   int
	seen     map[string][]uint64 // room -> seqs in arrival order
	sigCount map[int]int         // signatures per POST -> POSTs
	badSig   string
}

func newReceiver(t *testing.T, secrets ...string) *receiver {
	return &receiver{t: t, secrets: secrets, seen: map[string][]uint64{}, sigCount: map[int]int{}}
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	ts := r.Header.Get("X-Roost-Timestamp")
	sigs := strings.Split(r.Header.Get("X-Roost-Signature"), ",")
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.sigCount[len(sigs)]++
	// Every current secret signs; each signature must verify with one.
	for _, sg := range sigs {
		ok := false
		for _, s := range rc.secrets {
			m := hmac.New(sha256.New, []byte(s))
			m.Write([]byte(ts + "." + string(body)))
			if hmac.Equal([]byte(sg), []byte("sha256="+hex.EncodeToString(m.Sum(nil)))) {
				ok = true
			}
		}
		if !ok && rc.badSig == "" {
			rc.badSig = sg
		}
	}
	if rc.fail > 0 {
		rc.fail--
		http.Error(w, "not now", http.StatusInternalServerError)
		return
	}
	var p struct {
		App    string `json:"app"`
		Events []struct {
			Type string          `json:"type"`
			Room string          `json:"room"`
			Seq  uint64          `json:"seq"`
			Body json.RawMessage `json:"body"`
		} `json:"events"`
	}
	if err := json.Unmarshal(body, &p); err != nil || p.App != "chat" {
		rc.t.Errorf("bad webhook body %.200s: %v", body, err)
		return
	}
	rc.posts++
	for _, e := range p.Events {
		if e.Type != "msg" {
			rc.t.Errorf("event type %q", e.Type)
		}
		rc.seen[e.Room] = append(rc.seen[e.Room], e.Seq)
		rc.events++
	}
}

// check reports whether each room got 1..n, in order, each at least once
// (a retried batch may repeat, never reorder).
func (rc *receiver) check(rooms []string, n uint64) error {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.badSig != "" {
		return fmt.Errorf("a signature did not verify: %s", rc.badSig)
	}
	for _, room := range rooms {
		next := uint64(1)
		for _, s := range rc.seen[room] {
			switch {
			case s == next:
				next++
			case s < next: // a redelivery
			default:
				return fmt.Errorf("room %s: seq %d arrived before %d", room, s, next)
			}
		}
		if next != n+1 {
			return fmt.Errorf("room %s: got up to %d of %d", room, next-1, n)
		}
	}
	return nil
}

func app(url string, secrets ...string) proto.App {
	a := proto.App{ID: "chat", Secret: secrets[0], Webhook: &proto.Webhook{URL: url, Rooms: []string{"r*"}, Timeout: proto.Duration(2 * time.Second)}}
	if len(secrets) > 1 {
		a.PreviousSecret, a.PreviousUntil = secrets[1], time.Now().Add(time.Hour)
	}
	return a
}

// hand gives d each new message of the committed rows as fanout does,
// with its frame: frames[i], or encoded here once when frames is nil.
func hand(d *Dispatcher, rows []*persist.Row, frames [][]byte) {
	for i, r := range rows {
		if r.Err != nil || r.Duplicate {
			continue
		}
		var f []byte
		if frames != nil {
			f = frames[i]
		} else {
			_, room := proto.SplitKey(r.Key)
			f = proto.AppendMsgFrame(nil, room, r.Seq, r.ID, r.From, r.TS, r.Body)
		}
		d.Committed(r.Key, r.Seq, r.TS, f)
	}
}

// commit feeds d batches as the publish pool would: n messages in each of
// rooms, interleaved, plus messages of a room the webhook does not want.
func commit(d *Dispatcher, rooms []string, n int) {
	var reqs []*persist.Row
	flush := func() {
		hand(d, reqs, nil)
		reqs = reqs[:0]
	}
	for i := 1; i <= n; i++ {
		for _, room := range append(rooms, "other") {
			reqs = append(reqs, &persist.Row{Key: proto.RoomKey("chat", room), From: "alice", ID: []byte(fmt.Sprint("m-", i)), Body: []byte(`{"n":` + fmt.Sprint(i) + `}`),
				Stored: persist.Stored{Seq: uint64(i), TS: time.Now().UnixMilli()}})
		}
		if len(reqs) >= 64 {
			flush()
		}
	}
	flush()
}

// TestBurstDeliveredInOrderSigned: a 10,000-message burst over three rooms
// reaches a real receiver that fails its first POSTs: every message at
// least once, in seq order per room, in batches, each POST signed with
// both secrets of a rotation.
func TestBurstDeliveredInOrderSigned(t *testing.T) {
	secrets := []string{"current-secret-0123456789", "previous-secret-0123456789"}
	rc := newReceiver(t, secrets...)
	rc.fail = 3
	srv := &http.Server{Handler: rc}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })

	cfg := Defaults()
	cfg.RetryMin, cfg.RetryMax = 10*time.Millisecond, 100*time.Millisecond
	d := New(cfg)
	defer d.Close()
	d.SetApps([]proto.App{app("http://"+ln.Addr().String()+"/hook", secrets...)})
	rooms := []string{"r1", "r2", "r3"}
	start := time.Now()
	commit(d, rooms, 10_000/len(rooms)+1)
	n := uint64(10_000/len(rooms) + 1)
	prototest.WaitFor(t, 20*time.Second, func() error { return rc.check(rooms, n) })
	took := time.Since(start)
	// The receiver records a batch before its answer reaches the
	// dispatcher, which then lets the batch go: owed reaches 0 just after.
	prototest.WaitFor(t, 2*time.Second, func() error {
		if o := d.Stats.Owed.Load(); o != 0 {
			return fmt.Errorf("owed %d", o)
		}
		return nil
	})
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.sigCount[2] == 0 || rc.sigCount[1] != 0 {
		t.Fatalf("signatures per POST: %v, want 2 on every POST during the rotation", rc.sigCount)
	}
	if _, ok := rc.seen["other"]; ok {
		t.Fatal("a room outside the webhook's patterns was delivered")
	}
	if rc.posts*10 > rc.events {
		t.Fatalf("%d POSTs for %d events: the burst was not batched", rc.posts, rc.events)
	}
	if d.Stats.Failures.Load() < 3 || d.Stats.Owed.Load() != 0 || d.Stats.Dropped.Load() != 0 {
		t.Fatalf("stats: failures %d, owed %d, dropped %d", d.Stats.Failures.Load(), d.Stats.Owed.Load(), d.Stats.Dropped.Load())
	}
	t.Logf("%d events in %d POSTs, %v", rc.events, rc.posts, took)
}

// TestReceiverDownThenBack: with nothing listening (connection refused),
// events wait and are retried with backoff; once a receiver listens on
// the address again everything arrives, in order.
func TestReceiverDownThenBack(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // down
	cfg := Defaults()
	cfg.RetryMin, cfg.RetryMax = 20*time.Millisecond, 200*time.Millisecond
	d := New(cfg)
	defer d.Close()
	d.SetApps([]proto.App{app("http://"+addr+"/hook", "current-secret-0123456789")})
	commit(d, []string{"r"}, 500)
	time.Sleep(1500 * time.Millisecond)
	if f := d.Stats.Failures.Load(); f < 3 {
		t.Fatalf("%d failed POSTs while the receiver was down, want retries", f)
	}
	if o := d.Stats.Owed.Load(); o != 500 {
		t.Fatalf("owed %d while down, want 500", o)
	}
	// The app's own backlog and lag, as the admin page and metrics read it.
	var backlogs []Backlog
	d.EachBacklog(time.Now(), func(b Backlog) { backlogs = append(backlogs, b) })
	// What waits behind the batch being posted depends on how the batches
	// fell: none, or events committed over a second ago.
	if len(backlogs) != 1 || backlogs[0].App != "chat" || backlogs[0].Owed < 0 || backlogs[0].Owed > 500 ||
		(backlogs[0].Owed > 0 && (backlogs[0].Bytes <= 0 || backlogs[0].Oldest < time.Second)) {
		t.Fatalf("backlog while down: %+v, want the app, its waiting events over a second old", backlogs)
	}
	rc := newReceiver(t, "current-secret-0123456789")
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("cannot listen on %s again: %v", addr, err)
	}
	srv := &http.Server{Handler: rc}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	prototest.WaitFor(t, 10*time.Second, func() error { return rc.check([]string{"r"}, 500) })
}

// TestRedirectIsAFailure: a receiver that answers a redirect has not
// taken the batch. Followed, the 302 would turn the POST into a GET of a
// page that answers 200, and the batch would count as delivered.
func TestRedirectIsAFailure(t *testing.T) {
	var gets, posts atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			gets.Add(1)
			w.WriteHeader(http.StatusOK)
			return
		}
		posts.Add(1)
		http.Redirect(w, r, "/elsewhere", http.StatusFound)
	}))
	defer srv.Close()
	cfg := Defaults()
	cfg.RetryMin, cfg.RetryMax = 20*time.Millisecond, 100*time.Millisecond
	d := New(cfg)
	defer d.Close()
	d.SetApps([]proto.App{app(srv.URL+"/hook", "current-secret-0123456789")})
	commit(d, []string{"r"}, 10)
	prototest.WaitFor(t, 5*time.Second, func() error {
		if f := d.Stats.Failures.Load(); f < 2 {
			return fmt.Errorf("%d failures after %d POSTs", f, posts.Load())
		}
		return nil
	})
	if g := gets.Load(); g != 0 {
		t.Fatalf("the redirect was followed: %d GETs", g)
	}
	if o := d.Stats.Owed.Load(); o != 10 {
		t.Fatalf("owed %d after redirects, want all 10", o)
	}
}

// TestSlowReceiverTimesOut: a receiver slower than the webhook's timeout
// counts as a failure and the batch is sent again.
func TestSlowReceiverTimesOut(t *testing.T) {
	rc := newReceiver(t, "current-secret-0123456789")
	var slow sync.Once
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		stall := false
		slow.Do(func() { stall = true })
		if stall {
			time.Sleep(700 * time.Millisecond)
		}
		rc.ServeHTTP(w, r)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	cfg := Defaults()
	cfg.RetryMin = 10 * time.Millisecond
	d := New(cfg)
	defer d.Close()
	a := app("http://"+ln.Addr().String(), "current-secret-0123456789")
	a.Webhook.Timeout = proto.Duration(300 * time.Millisecond)
	d.SetApps([]proto.App{a})
	commit(d, []string{"r"}, 20)
	prototest.WaitFor(t, 10*time.Second, func() error { return rc.check([]string{"r"}, 20) })
	if d.Stats.Failures.Load() == 0 {
		t.Fatal("the stalled POST was not counted as a failure")
	}
}

func TestBackoffGrowsWithJitter(t *testing.T) {
	for f := 1; f < 40; f++ {
		want := min(time.Minute, 100*time.Millisecond<<min(f-1, 31))
		if f >= 32 {
			want = time.Minute
		}
		if got := backoff(100*time.Millisecond, time.Minute, f); got < 0 || got > want {
			t.Fatalf("backoff after %d failures: %v, want within [0, %v] (full jitter)", f, got, want)
		}
	}
}

// BenchmarkDelivery: messages committed to one app, delivered to a local
// receiver that answers 200 at once; reports delivered messages per second
// and the lag from commit to the receiver's read (p50, p99). "burst"
// commits b.N messages as fast as it can (throughput); "1000/s" commits
// them at 1,000 a second, 10 per 10 ms as group commits come (lag).
func BenchmarkDelivery(b *testing.B) {
	b.Run("burst", func(b *testing.B) { benchDelivery(b, 0) })
	b.Run("1000/s", func(b *testing.B) { benchDelivery(b, 1000) })
}

func benchDelivery(b *testing.B, rate int) {
	var mu sync.Mutex
	var lags []time.Duration
	delivered := 0
	done := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var p struct {
			Events []struct {
				Body struct{ T int64 } `json:"body"`
			} `json:"events"`
		}
		_ = json.Unmarshal(body, &p)
		now := time.Now().UnixNano()
		mu.Lock()
		for _, e := range p.Events {
			lags = append(lags, time.Duration(now-e.Body.T))
		}
		delivered += len(p.Events)
		if delivered >= b.N {
			select {
			case <-done:
			default:
				close(done)
			}
		}
		mu.Unlock()
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	d := New(Defaults())
	defer d.Close()
	d.SetApps([]proto.App{app("http://"+ln.Addr().String(), "current-secret-0123456789")})
	b.ResetTimer()
	start := time.Now()
	reqs := make([]*persist.Row, 0, 64)
	for i := 1; i <= b.N; i++ {
		reqs = append(reqs, &persist.Row{Key: "chat/r1", From: "alice", ID: []byte("m"), Body: []byte(fmt.Sprintf(`{"t":%d}`, time.Now().UnixNano())),
			Stored: persist.Stored{Seq: uint64(i), TS: time.Now().UnixMilli()}})
		if len(reqs) == cap(reqs) || i == b.N || rate > 0 && len(reqs) == rate/100 {
			hand(d, reqs, nil)
			reqs = reqs[:0]
			if rate > 0 {
				time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))))
			}
		}
	}
	<-done
	el := time.Since(start)
	b.StopTimer()
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(lags)
	b.ReportMetric(float64(b.N)/el.Seconds(), "msgs/s")
	b.ReportMetric(float64(lags[len(lags)/2].Microseconds())/1000, "lag-p50-ms")
	b.ReportMetric(float64(lags[len(lags)*99/100].Microseconds())/1000, "lag-p99-ms")
}

// TestCommittedReusesFrames: queueing a committed batch allocates nothing
// per event (the event is written into the POST from the commit's frame,
// not re-encoded): 64 events cost less than one allocation on average
// (the queue's growth), where encoding each event cost three.
func TestCommittedReusesFrames(t *testing.T) {
	cfg := Defaults()
	cfg.RetryMin, cfg.RetryMax = time.Hour, time.Hour // the first POST fails (nothing listens), then it waits
	d := New(cfg)
	defer d.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	d.SetApps([]proto.App{app("http://"+addr+"/hook", "current-secret-0123456789")})
	reqs := make([]*persist.Row, 64)
	frames := make([][]byte, 64)
	for i := range reqs {
		reqs[i] = &persist.Row{Key: "chat/r1", From: "alice", ID: []byte(fmt.Sprint("m-", i)), Body: []byte(`{"text":"hi"}`),
			Stored: persist.Stored{Seq: uint64(i + 1), TS: 1764484800123}}
		frames[i] = proto.AppendMsgFrame(nil, "r1", reqs[i].Seq, reqs[i].ID, reqs[i].From, reqs[i].TS, reqs[i].Body)
	}
	hand(d, reqs, frames)
	prototest.WaitFor(t, 5*time.Second, func() error {
		if d.Stats.Failures.Load() == 0 {
			return fmt.Errorf("no POST yet")
		}
		return nil
	})
	allocs := testing.AllocsPerRun(200, func() { hand(d, reqs, frames) })
	if allocs >= 1 {
		t.Fatalf("%.2f allocations per batch of 64 events, want < 1", allocs)
	}
	// The event is the frame's object with "type" for "op".
	ev := event{frame: frames[0]}
	if got, want := string(appendEvent(nil, &ev)), `{"type":"msg","room":"r1","seq":1,"id":"m-0","from":"alice","ts":1764484800123,"body":{"text":"hi"}}`; got != want {
		t.Fatalf("event %s, want %s", got, want)
	}
	// Frames with 16- and 64-bit payload lengths.
	for _, n := range []int{200, 70_000} {
		body := []byte(`"` + strings.Repeat("x", n) + `"`)
		fr := proto.AppendMsgFrame(nil, "r1", 7, []byte("m"), "alice", 1, body)
		ev := event{frame: fr}
		want := `{"type":"msg","room":"r1","seq":7,"id":"m","from":"alice","ts":1,"body":` + string(body) + `}`
		if got := string(appendEvent(nil, &ev)); got != want {
			t.Fatalf("body of %d bytes: event %.80s..., want %.80s...", n, got, want)
		}
	}
}

// Connection events: an app that wants presence but not msg gets the
// events of its events room, each event's object as it was committed,
// and none of its messages; WantsEvent says what fanout may make.
func TestConnEventsDelivered(t *testing.T) {
	var mu sync.Mutex
	var bodies []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, string(b))
		mu.Unlock()
	}))
	defer srv.Close()
	d := New(Config{Client: srv.Client()})
	defer d.Close()
	d.SetApps([]proto.App{{ID: "chat", Secret: "0123456789abcdef", Webhook: &proto.Webhook{URL: srv.URL, Rooms: []string{"team-*"}, Events: []string{proto.WebhookEventPresence}}}})
	if !d.WantsEvent(proto.EventJoined, "chat", "team-a") || d.WantsEvent(proto.EventJoined, "chat", "lobby") || d.WantsEvent(proto.EventOnline, "chat", "") || d.WantsEvent(proto.EventJoined, "other", "team-a") {
		t.Fatal("WantsEvent")
	}
	d.Committed("chat/team-a", 1, 5, proto.AppendMsgFrame(nil, "team-a", 1, []byte("m"), "bob", 5, []byte(`1`)))
	ev := proto.AppendConnEvent(nil, proto.EventJoined, "team-a", "bob", 7)
	d.Committed("chat/"+proto.EventsRoom, 1, 7, ev)
	prototest.WaitFor(t, 5*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(bodies) == 0 {
			return fmt.Errorf("no POST")
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if want := `{"app":"chat","events":[` + string(ev) + `]}`; len(bodies) != 1 || bodies[0] != want {
		t.Fatalf("POSTs %q, want %s", bodies, want)
	}
	if d.Stats.ConnSent.Load() != 1 {
		t.Fatalf("conn events sent %d", d.Stats.ConnSent.Load())
	}
}
