package loop

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gobwas/ws/wsutil"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/persist/pgtest"
	"github.com/roost-chat/roost/proto"
	"github.com/roost-chat/roost/pubsub/redistest"
)

// sseEvent is one dispatched event as an EventSource sees it.
type sseEvent struct {
	event, data, id string
}

// sseClient is a raw-TCP EventSource: it parses the stream as the HTML
// standard says (fields, data lines joined with LF, dispatch at the blank
// line, the last event id kept across events).
type sseClient struct {
	t      testing.TB
	conn   net.Conn
	rd     *bufio.Reader
	status int
	header http.Header
	lastID string
	retry  int
	pings  int
}

func (n *node) sse(t testing.TB, query string, header ...string) *sseClient {
	t.Helper()
	return n.sseDial(t, &net.Dialer{}, query, header...)
}

func (n *node) sseDial(t testing.TB, d *net.Dialer, query string, header ...string) *sseClient {
	t.Helper()
	conn, err := d.Dial("tcp", n.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	req := "GET /sse?" + query + " HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n"
	for _, h := range header {
		req += h + "\r\n"
	}
	if _, err := conn.Write([]byte(req + "\r\n")); err != nil {
		t.Fatal(err)
	}
	c := &sseClient{t: t, conn: conn, rd: bufio.NewReader(conn)}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(c.rd, nil)
	if err != nil {
		t.Fatalf("sse response: %v", err)
	}
	c.status, c.header = resp.StatusCode, resp.Header
	if c.status != 200 {
		body, _ := io.ReadAll(resp.Body)
		c.header.Set("X-Body", string(body))
		return c
	}
	c.rd = bufio.NewReader(resp.Body)
	return c
}

// next returns the next dispatched event (comments and retry fields are
// recorded on the way); io.EOF when the stream ends.
func (c *sseClient) next(d time.Duration) (sseEvent, error) {
	_ = c.conn.SetReadDeadline(time.Now().Add(d))
	var ev sseEvent
	var data []string
	hasData := false
	for {
		line, err := c.rd.ReadString('\n')
		if err != nil {
			return ev, err
		}
		line = strings.TrimSuffix(line, "\n")
		if line == "" {
			if !hasData {
				ev = sseEvent{}
				continue
			}
			ev.data = strings.Join(data, "\n")
			ev.id = c.lastID
			return ev, nil
		}
		if strings.HasPrefix(line, ":") {
			c.pings++
			continue
		}
		name, val, _ := strings.Cut(line, ":")
		val = strings.TrimPrefix(val, " ")
		switch name {
		case "event":
			ev.event = val
		case "data":
			data, hasData = append(data, val), true
		case "id":
			c.lastID = val
		case "retry":
			c.retry, _ = strconv.Atoi(val)
		}
	}
}

func (c *sseClient) expect(event string) sseEvent {
	c.t.Helper()
	ev, err := c.next(5 * time.Second)
	if err != nil {
		c.t.Fatalf("want %s event: %v", event, err)
	}
	if ev.event != event {
		c.t.Fatalf("want %s event, got %+v", event, ev)
	}
	return ev
}

// expectEnd reads until the stream ends and returns the retry it gave.
func (c *sseClient) expectEnd() int {
	c.t.Helper()
	for {
		_, err := c.next(5 * time.Second)
		if err == io.EOF {
			return c.retry
		}
		if err != nil {
			c.t.Fatalf("want the stream to end: %v", err)
		}
	}
}

// Each msg event's data is the WebSocket msg frame of the same message,
// byte for byte, in seq order, with the connection's position as its id;
// the stream opens with 200, the SSE headers, a retry and one joined per
// room.
func TestSSEDeliversWebSocketMsg(t *testing.T) {
	n := startNode(t, nil)
	ws := n.dial(t, "alice")
	ws.send(`{"op":"join","room":"lobby"}`)
	ws.expect(map[string]any{"op": "joined"})
	s := n.sse(t, "user=bob&app=test&room=lobby&room=side:x")
	if s.status != 200 || s.header.Get("Content-Type") != "text/event-stream" || s.header.Get("Cache-Control") != "no-cache" {
		t.Fatalf("status %d header %v", s.status, s.header)
	}
	joined := map[string]bool{}
	for range 2 {
		ev := s.expect("joined")
		var room string
		if strings.Contains(ev.data, `"room":"lobby"`) {
			room = "lobby"
		} else if strings.Contains(ev.data, `"room":"side:x"`) {
			room = "side:x"
		}
		if !strings.HasPrefix(ev.data, `{"op":"joined","room":"`) || !strings.Contains(ev.data, `"epoch":"`) || room == "" {
			t.Fatalf("joined: %+v", ev)
		}
		joined[room] = true
	}
	if s.retry < 500 || s.retry >= 5000 || len(joined) != 2 {
		t.Fatalf("retry %d joined %v", s.retry, joined)
	}
	pub := n.dial(t, "carol")
	// Odd spacing and line breaks between tokens survive (as data lines).
	bodies := []string{`{"t":"plain"}`, "{ \"t\" : \"h\\u00e9\\n\",\n  \"n\": 1.50e+2 }", `[1 ,2]`}
	const total = 30
	for i := 1; i <= total; i++ {
		pub.send(fmt.Sprintf(`{"op":"pub","room":"lobby","id":"m-%d","body":%s}`, i, bodies[i%len(bodies)]))
	}
	for i := 1; i <= total; i++ {
		want := ws.recvRaw()
		ev := s.expect("msg")
		if ev.data != string(want) {
			t.Fatalf("msg %d: sse data\n%q\nwant the websocket frame\n%q", i, ev.data, want)
		}
		if wantID := fmt.Sprintf("lobby:%d,side:x:0", i); ev.id != wantID && ev.id != fmt.Sprintf("side:x:0,lobby:%d", i) {
			t.Fatalf("msg %d: id %q", i, ev.id)
		}
	}
	if got := n.srv.Stats.SSEConns.Load(); got != 1 {
		t.Fatalf("SSEConns %d, want 1", got)
	}
}

// A stream cut at any point and reopened with its Last-Event-ID over
// three rooms gets every message once: no gap, no duplicate. since= in the
// query does the same.
func TestSSEResumeThreeRooms(t *testing.T) {
	n := startNode(t, nil)
	testSSEResume(t, n)
}

func testSSEResume(t *testing.T, n *node) {
	rooms := []string{"r1", "r:2", "r3"}
	q := "user=bob&app=test&room=r1&room=r:2&room=r3"
	pub := n.dial(t, "carol")
	published := 0
	publish := func(k int) {
		for i := 0; i < k; i++ {
			published++
			pub.send(fmt.Sprintf(`{"op":"pub","room":"%s","id":"p-%d","body":{"i":%d}}`, rooms[published%3], published, published))
		}
		for i := 0; i < k; i++ {
			pub.expect(map[string]any{"op": "ack"})
		}
	}
	got := map[string][]uint64{}
	seen := 0
	take := func(s *sseClient, k int) {
		for seen < k {
			ev, err := s.next(5 * time.Second)
			if err != nil {
				t.Fatalf("after %d of %d: %v", seen, k, err)
			}
			if ev.event != "msg" {
				continue
			}
			room := between(ev.data, `"room":"`, `"`)
			seq, _ := strconv.ParseUint(between(ev.data, `"seq":`, `,`), 10, 64)
			got[room] = append(got[room], seq)
			seen++
		}
	}
	publish(9) // before the first stream: not delivered (it joins at the head)
	s := n.sse(t, q)
	for range 3 {
		s.expect("joined")
	}
	publish(30)
	take(s, 30)
	id := s.lastID
	s.conn.Close()
	publish(30) // while away
	s = n.sse(t, q, "Last-Event-ID: "+id)
	publish(15)
	take(s, 75)
	// Cut mid-flight, resumed through the query this time.
	publish(20)
	take(s, 85)
	id = s.lastID
	s.conn.Close()
	publish(10)
	s = n.sse(t, q+"&since="+id)
	take(s, 105)
	for _, r := range rooms {
		seqs := got[r]
		for i, sq := range seqs {
			if sq != uint64(i)+4 { // 3 per room before the first stream
				t.Fatalf("room %s: seqs %v: gap or duplicate at %d", r, seqs, i)
			}
		}
	}
	ev, err := s.next(200 * time.Millisecond)
	if err == nil && ev.event == "msg" {
		t.Fatalf("extra event %+v", ev)
	}
}

func between(s, pre, post string) string {
	_, rest, ok := strings.Cut(s, pre)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, post)
	return v
}

// A listener that stops reading is closed as a slow consumer with a retry
// hint; the others in the room get every message.
func TestSSESlowReaderClosed(t *testing.T) {
	cfg := testConfig()
	cfg.OutboundLimit = 256 << 10
	n := startNodeWith(t, cfg, persist.NewMemory(10000), testLogger(), nil) // keeps all it is sent
	small := &net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) {
			_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		})
	}}
	slow := n.sseDial(t, small, "user=slow&app=test&room=busy")
	slow.expect("joined")
	fast := n.sse(t, "user=fast&app=test&room=busy")
	fast.expect("joined")
	ws := n.dial(t, "wsfast")
	ws.send(`{"op":"join","room":"busy"}`)
	ws.expect(map[string]any{"op": "joined"})
	pub := n.dial(t, "pub")
	body := `"` + strings.Repeat("x", 2000) + `"`
	const total = 4000
	// The publisher stays at most 64 messages (128 KB) ahead of the fast
	// readers, half their outbound limit: on a loaded machine the test's
	// own reading goroutine can be descheduled long enough for an
	// unpaced publisher to push a reader that does read past its limit,
	// and the test is about the one that never reads.
	var read atomic.Int64
	go func() {
		for i := 1; i <= total; i++ {
			for int64(i) > read.Load()+64 {
				time.Sleep(100 * time.Microsecond)
			}
			if err := wsutil.WriteClientText(pub.conn, []byte(fmt.Sprintf(`{"op":"pub","room":"busy","id":"s-%d","body":%s}`, i, body))); err != nil {
				return
			}
		}
	}()
	for i := 1; i <= total; i++ {
		ev, err := fast.next(5 * time.Second)
		if err != nil || ev.event != "msg" {
			t.Fatalf("fast reader at %d: %+v %v; slow closes %d repairs %d gapcloses %d", i, ev, err, n.fan.Stats.SlowCloses.Load(), n.fan.Stats.Repairs.Load(), n.fan.Stats.GapCloses.Load())
		}
		if seq := between(ev.data, `"seq":`, `,`); seq != strconv.Itoa(i) {
			t.Fatalf("fast reader: seq %s, want %d", seq, i)
		}
		ws.recvRaw()
		read.Store(int64(i))
	}
	checkFor(t, 5*time.Second, func() bool { return n.fan.Stats.SlowCloses.Load() >= 1 })
	if got := n.fan.Stats.SlowCloses.Load(); got != 1 {
		t.Fatalf("%d slow closes, want the slow reader only", got)
	}
	// The slow one reads now: what it was sent, in order, then the end.
	last := 0
	for {
		ev, err := slow.next(5 * time.Second)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("slow reader after seq %d: %v", last, err)
		}
		if ev.event != "msg" {
			continue
		}
		if seq := between(ev.data, `"seq":`, `,`); seq != strconv.Itoa(last+1) {
			t.Fatalf("slow reader: seq %s after %d", seq, last)
		}
		last++
	}
	if slow.retry < 500 || slow.lastID != "busy:"+strconv.Itoa(last) {
		t.Fatalf("slow reader: retry %d, last id %q after seq %d", slow.retry, slow.lastID, last)
	}
	// It comes back from its Last-Event-ID: the rest, once each.
	back := n.sse(t, "user=slow&app=test&room=busy", "Last-Event-ID: "+slow.lastID)
	if ev := back.expect("joined"); !strings.Contains(ev.data, `"recovered":true`) {
		t.Fatalf("rejoin: %+v", ev)
	}
	for i := last + 1; i <= total; i++ {
		ev := back.expect("msg")
		if seq := between(ev.data, `"seq":`, `,`); seq != strconv.Itoa(i) {
			t.Fatalf("after the reconnect: seq %s, want %d", seq, i)
		}
	}
}

// Bad requests get their status and a reason.
func TestSSEBadRequests(t *testing.T) {
	n := startNode(t, func(c *Config) {
		c.Limits.MaxUserConns = 1
		c.MaxRooms = 3
	})
	cases := []struct {
		query, header string
		status        int
		reason        string
	}{
		{"user=u&app=test", "", 400, "at least one room"},
		{"user=u&app=test&room=a%20b", "", 400, "room must match"},
		{"user=u&app=test&room=a&room=b&room=c&room=d", "", 400, "too many rooms"},
		{"user=u&app=test&room=a", "Last-Event-ID: a41", 400, "Last-Event-ID"},
		{"user=u&app=test&room=a&since=a:x", "", 400, "Last-Event-ID"},
		{"app=test&room=a", "", 400, "user"},
	}
	for _, tc := range cases {
		var s *sseClient
		if tc.header != "" {
			s = n.sse(t, tc.query, tc.header)
		} else {
			s = n.sse(t, tc.query)
		}
		if s.status != tc.status || !strings.Contains(s.header.Get("X-Body"), tc.reason) {
			t.Errorf("%s %s: %d %q, want %d %q", tc.query, tc.header, s.status, s.header.Get("X-Body"), tc.status, tc.reason)
		}
	}
	ok := n.sse(t, "user=u&app=test&room=a&room=b&room=b&room=c") // repeats count once
	if ok.status != 200 {
		t.Fatalf("first stream: %d %s", ok.status, ok.header.Get("X-Body"))
	}
	if s := n.sse(t, "user=u&app=test&room=a"); s.status != 429 || !strings.Contains(s.header.Get("X-Body"), "connection limit") {
		t.Fatalf("second stream of the user: %d %q", s.status, s.header.Get("X-Body"))
	}
	conn, _ := net.Dial("tcp", n.addr)
	defer conn.Close()
	_, _ = conn.Write([]byte("POST /sse?user=v&app=test&room=a HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil || resp.StatusCode != 405 {
		t.Fatalf("POST: %v %v", resp, err)
	}
	if got := n.srv.Stats.SSEConns.Load(); got != 1 {
		t.Fatalf("SSEConns %d after refusals, want 1", got)
	}
}

// Token mode: 401 without a token or with a bad one, 403 for a room the
// token does not allow, and a stream with a good one (query or header).
func TestSSEToken(t *testing.T) {
	secret := []byte("s3cret")
	n := startNode(t, func(c *Config) {
		c.Insecure = false
		c.Apps = map[string][]byte{"app1": secret}
	})
	tok := signToken(secret, "app1", "alice", time.Now().Add(time.Hour), []string{"ok*"})
	if s := n.sse(t, "room=ok1"); s.status != 401 {
		t.Fatalf("no token: %d", s.status)
	}
	if s := n.sse(t, "room=ok1&token=garbage"); s.status != 401 {
		t.Fatalf("bad token: %d", s.status)
	}
	if s := n.sse(t, "room=nope&token="+tok); s.status != 403 {
		t.Fatalf("room not allowed: %d %s", s.status, s.header.Get("X-Body"))
	}
	s := n.sse(t, "room=ok1&token="+tok)
	if s.status != 200 {
		t.Fatalf("query token: %d %s", s.status, s.header.Get("X-Body"))
	}
	s.expect("joined")
	s = n.sse(t, "room=ok2", "Authorization: Bearer "+tok)
	if s.status != 200 {
		t.Fatalf("bearer: %d %s", s.status, s.header.Get("X-Body"))
	}
	s.expect("joined")

	// A stream ends with a retry once its token expires (its client
	// reconnects with a fresh one).
	short := startNode(t, func(c *Config) {
		c.Insecure = false
		c.Apps = map[string][]byte{"app1": secret}
		c.Leeway = 0
		c.UpgradeTimeout = 400 * time.Millisecond // a sweep every 100 ms
	})
	exp := short.sse(t, "room=ok1&token="+signToken(secret, "app1", "alice", time.Now().Add(1500*time.Millisecond), nil))
	exp.expect("joined")
	start := time.Now()
	if r := exp.expectEnd(); r < 500 || time.Since(start) > 4*time.Second {
		t.Fatalf("expired token: retry %d after %v", r, time.Since(start))
	}
}

// Keep-alive comments come only after an idle interval without events;
// --sse-max-age ends a stream with a retry; a drain ends every stream
// with one.
func TestSSEKeepAliveMaxAgeDrain(t *testing.T) {
	n := startNode(t, func(c *Config) {
		c.IdleInterval = 300 * time.Millisecond
		c.UpgradeTimeout = time.Second
	})
	s := n.sse(t, "user=u&app=test&room=k")
	s.expect("joined")
	pub := n.dial(t, "p")
	deadline := time.Now().Add(800 * time.Millisecond)
	for i := 1; time.Now().Before(deadline); i++ {
		pub.send(fmt.Sprintf(`{"op":"pub","room":"k","id":"k-%d","body":1}`, i))
		s.expect("msg")
		time.Sleep(20 * time.Millisecond)
	}
	if s.pings != 0 {
		t.Fatalf("%d pings on a stream with events", s.pings)
	}
	if _, err := s.next(1200 * time.Millisecond); err == nil || s.pings == 0 {
		t.Fatalf("no ping on an idle stream (err %v)", err)
	}

	aged := startNode(t, func(c *Config) { c.SSEMaxAge = 300 * time.Millisecond })
	a := aged.sse(t, "user=u&app=test&room=k")
	a.expect("joined")
	start := time.Now()
	if r := a.expectEnd(); r < 500 || time.Since(start) > 5*time.Second {
		t.Fatalf("max age: retry %d after %v", r, time.Since(start))
	}
	if aged.srv.Stats.SSEMaxAge.Load() != 1 {
		t.Fatalf("SSEMaxAge %d", aged.srv.Stats.SSEMaxAge.Load())
	}

	d := n.sse(t, "user=d&app=test&room=k")
	d.expect("joined")
	go n.srv.Drain(proto.CloseGoingAway, 200*time.Millisecond)
	if r := d.expectEnd(); r < 500 {
		t.Fatalf("drain: retry %d", r)
	}
	checkFor(t, 2*time.Second, func() bool { return n.srv.Stats.SSEConns.Load() == 0 })
}

// curl, when installed, reads the same stream.
func TestSSECurl(t *testing.T) {
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Skip("no curl")
	}
	n := startNode(t, nil)
	ws := n.dial(t, "alice")
	ws.send(`{"op":"join","room":"c"}`)
	ws.expect(map[string]any{"op": "joined"})
	cmd := exec.Command(curl, "-sN", "--max-time", "3", "http://"+n.addr+"/sse?user=curl&app=test&room=c")
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 3*time.Second, func() bool { return n.srv.Stats.SSEConns.Load() == 1 })
	time.Sleep(50 * time.Millisecond) // its join
	pub := n.dial(t, "p")
	var want []string
	for i := 1; i <= 5; i++ {
		pub.send(fmt.Sprintf(`{"op":"pub","room":"c","id":"c-%d","body":{"n":%d}}`, i, i))
		want = append(want, "data: "+string(ws.recvRaw()))
	}
	_ = cmd.Wait()
	var got []string
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(line, `data: {"op":"msg"`) {
			got = append(got, line)
		}
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("curl got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// The resume over three rooms on PostgreSQL: the catch-up pages come
// from the database.
func TestSSEResumePostgres(t *testing.T) {
	url := pgtest.NewDB(t)
	n, stop := pgNode(t, url)
	defer stop()
	testSSEResume(t, n)
}

// Two nodes on one PostgreSQL and one Redis: a listener on node B gets
// what is published on node A, byte-equal to a WebSocket member's frames
// on B; its stream cut, it resumes on node A from its Last-Event-ID (as
// after --sse-max-age or a drain) with no gap and no duplicate.
func TestSSETwoNodesRedis(t *testing.T) {
	redistest.Require(t)
	url := pgtest.NewDB(t)
	prefix := redistest.Prefix(t)
	pgA, pgB := openPG(t, url), openPG(t, url)
	t.Cleanup(pgA.Close)
	t.Cleanup(pgB.Close)
	a := startNodeWith(t, testConfig(), pgA, testLogger(), redisBroker(t, redistest.Addr, prefix))
	b := startNodeWith(t, testConfig(), pgB, testLogger(), redisBroker(t, redistest.Addr, prefix))
	wb := b.dial(t, "w")
	wb.send(`{"op":"join","room":"r"}`)
	wb.expect(map[string]any{"op": "joined"})
	s := b.sse(t, "user=l&app=test&room=r&room=q")
	s.expect("joined")
	s.expect("joined")
	pa := a.dial(t, "pub")
	for i := 1; i <= 20; i++ {
		pa.send(fmt.Sprintf(`{"op":"pub","room":"r","id":"a%d","body":{"i":%d}}`, i, i))
		pa.expect(map[string]any{"op": "ack", "seq": i})
	}
	for i := 1; i <= 20; i++ {
		want := wb.recvRaw()
		if ev := s.expect("msg"); ev.data != string(want) {
			t.Fatalf("msg %d on node B: %q, want %q", i, ev.data, want)
		}
	}
	id := s.lastID
	s.conn.Close()
	for i := 21; i <= 30; i++ {
		pa.send(fmt.Sprintf(`{"op":"pub","room":"r","id":"a%d","body":{"i":%d}}`, i, i))
		pa.expect(map[string]any{"op": "ack", "seq": i})
	}
	s = a.sse(t, "user=l&app=test&room=r&room=q", "Last-Event-ID: "+id)
	joined, next := 0, 21 // the rooms' joins are independent: q's joined may come among r's catch-up
	for joined < 2 || next <= 30 {
		ev, err := s.next(5 * time.Second)
		if err != nil {
			t.Fatalf("resumed on node A: %v (joined %d, next seq %d)", err, joined, next)
		}
		switch ev.event {
		case "joined":
			joined++
		case "msg":
			if seq := between(ev.data, `"seq":`, `,`); seq != strconv.Itoa(next) {
				t.Fatalf("resumed on node A: seq %s, want %d", seq, next)
			}
			next++
		}
	}
	if ev, err := s.next(300 * time.Millisecond); err == nil {
		t.Fatalf("extra event %+v", ev)
	}
}

// A room the node cannot join for the stream (its app has its maximum of
// rooms) arrives as an err event, and the stream ends with a retry.
func TestSSEJoinRefusedEndsStream(t *testing.T) {
	mem := persist.NewMemory(100)
	mem.SetLimits(0, 1)
	n := startNodeWith(t, testConfig(), mem, testLogger(), nil)
	s := n.sse(t, "user=u&app=test&room=one&room=two")
	var got []string
	for {
		ev, err := s.next(5 * time.Second)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("after %v: %v", got, err)
		}
		got = append(got, ev.event)
		if ev.event == "err" && !strings.Contains(ev.data, `"code":"forbidden"`) {
			t.Fatalf("err event %q", ev.data)
		}
	}
	if !strings.Contains(strings.Join(got, " "), "err") || s.retry < 500 {
		t.Fatalf("events %v, retry %d", got, s.retry)
	}
}
