//go:build linux

package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"

	"github.com/roost-chat/roost/proto"
)

// readsBench is `roost bench reads`: read positions under a publish load,
// in phases of one window each on the same connections (docs/protocol.md,
// Chat state):
//
//   - A: --pub-rate publishes/s over --rooms rooms, one publisher per room
//     (each publish moves its publisher's read position too);
//   - B: the same publishes, and --users users (one connection each, spread
//     over the rooms) each marking its room read once per --mark-every, up
//     to the room's newest acked seq;
//   - C (with --unread-conns): the same publishes, and `unread` requests of
//     --unread-rooms rooms each at --unread-rate, all connections together.
//
// It reports per phase the publishes' ack latency, PostgreSQL's CPU (with
// --pg-db) and the nodes' (with --pid) per publish, this process's CPU,
// the node's own split of an ack's time (with --admin), B's PostgreSQL CPU
// per read mark net of A, and C's unread round trip. Connections are held
// by this process, a goroutine each: the load is thousands of frames a
// second, not a fan-out. A connection is silent for long stretches (an
// asker through A and B, ~50 s at the defaults: twice the node's --idle),
// so it answers the node's pings as any client must; a connection the
// node closes anyway, a write that fails, an unread request left
// unanswered is said on stderr and in the report, never left out of it.
type readsParams struct {
	url, app, pids, pgDB, admin string
	rooms, users                int
	unreadConns, unreadRooms    int
	pubRate, unreadRate         float64
	markEvery, warmup, window   time.Duration
	size                        int
	join                        bool
}

func readsBench(args []string, stdout, stderr io.Writer) int {
	var p readsParams
	fs := modeFlags("reads", stderr)
	fs.StringVar(&p.url, "url", "ws://127.0.0.1:8080/ws", "node WebSocket URLs, comma-separated (insecure mode: ?user=&app= is added); connections go round-robin")
	fs.StringVar(&p.app, "app", "bench", "app id")
	fs.StringVar(&p.pids, "pid", "", "the nodes' process ids, comma-separated, for their CPU")
	fs.StringVar(&p.pgDB, "pg-db", "", "count the CPU of this PostgreSQL database's backends and the server's own processes (empty: not measured)")
	fs.StringVar(&p.admin, "admin", "", "a node's admin HOST:PORT: its roost_read_marks_written_total and its ack split (roost_ack_phase_seconds) per phase (empty: not read)")
	fs.IntVar(&p.rooms, "rooms", 1000, "rooms, one publisher each")
	fs.IntVar(&p.users, "users", 10000, "users marking read in phase B, one connection each, round-robin over the rooms (0: no phase B)")
	fs.Float64Var(&p.pubRate, "pub-rate", 5000, "publishes per second, all rooms together")
	fs.DurationVar(&p.markEvery, "mark-every", time.Second, "how often each user marks its room read")
	fs.BoolVar(&p.join, "join", false, "markers join their room and mark the newest seq they received, as a client showing the room does (default: they do not join and mark the room's newest acked seq)")
	fs.IntVar(&p.unreadConns, "unread-conns", 0, "connections asking unread counts in phase C (0: no phase C)")
	fs.IntVar(&p.unreadRooms, "unread-rooms", 100, "rooms per unread request (at most 100)")
	fs.Float64Var(&p.unreadRate, "unread-rate", 100, "unread requests per second, all --unread-conns together (each connection's read rate is 10/s by default)")
	fs.DurationVar(&p.warmup, "warmup", 5*time.Second, "warm-up before each phase's window")
	fs.DurationVar(&p.window, "duration", 20*time.Second, "each phase's measurement window")
	fs.IntVar(&p.size, "size", 100, "publish body size in bytes")
	if code, ok := parseMode(fs, args); !ok {
		return code
	}
	switch {
	case p.rooms < 1 || p.users < 0 || p.unreadConns < 0 || p.pubRate <= 0 || p.markEvery <= 0 || p.window <= 0 || p.warmup < 0:
		fmt.Fprintln(stderr, "roost bench reads: want --rooms >= 1, --users >= 0, --unread-conns >= 0, positive --pub-rate, --mark-every and --duration")
		return 2
	case p.unreadConns > 0 && (p.unreadRooms < 1 || p.unreadRooms > 100 || p.unreadRate <= 0):
		fmt.Fprintln(stderr, "roost bench reads: --unread-rooms must be 1..100 and --unread-rate positive")
		return 2
	case p.size < 0 || p.size > 60000:
		fmt.Fprintln(stderr, "roost bench reads: --size must be 0..60000")
		return 2
	}
	r, err := runReads(&p, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "roost bench reads:", err)
		return 1
	}
	r.print(stdout, &p)
	return 0
}

// The roles of the reads bench's connections.
const (
	rolePub = iota
	roleMark
	roleAsk
	nRoles
)

var roleNames = [nRoles]string{"publishers", "markers", "unread askers"}

// readsConn is one connection of the reads bench: its writes under mu, its
// frames read by a goroutine of its own.
type readsConn struct {
	mu     sync.Mutex
	c      net.Conn
	user   string
	room   int
	role   int
	sentAt int64         // ns: the unread request in flight (askers), 0 if none
	seen   atomic.Uint64 // the newest seq received (markers with --join)
	buf    []byte        // the frame being sent
	ended  atomic.Bool
}

// send writes b as one masked text frame in one write, as a browser does.
// wsutil.WriteClientText writes the header and the payload apart: two TCP
// segments on a TCP_NODELAY socket, so the node paid an extra wake-up,
// read and ACK per frame that no real client costs it.
func (rc *readsConn) send(b []byte) error {
	return rc.sendFrame(ws.OpText, b)
}

func (rc *readsConn) sendFrame(op ws.OpCode, b []byte) error {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.buf = appendClientFrame(rc.buf[:0], op, b)
	_, err := rc.c.Write(rc.buf)
	return err
}

// appendClientText appends b as a client's masked, final text frame.
func appendClientText(dst, b []byte) []byte {
	return appendClientFrame(dst, ws.OpText, b)
}

// appendClientFrame appends b as a client's masked, final frame of op.
func appendClientFrame(dst []byte, op ws.OpCode, b []byte) []byte {
	n := len(b)
	first := 0x80 | byte(op)
	switch {
	case n < 126:
		dst = append(dst, first, 0x80|byte(n))
	case n < 1<<16:
		dst = append(dst, first, 0x80|126, byte(n>>8), byte(n))
	default:
		dst = append(dst, first, 0x80|127, 0, 0, 0, 0, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	}
	mask := ws.NewMask()
	dst = append(dst, mask[:]...)
	at := len(dst)
	dst = append(dst, b...)
	ws.Cipher(dst[at:], mask, 0)
	return dst
}

// readsRun is what the connections saw, shared by their goroutines.
type readsRun struct {
	p      *readsParams
	runID  string
	newest []atomic.Uint64 // per room: the newest acked seq

	// stopping is set once the figures are taken: connections ending
	// after it are the bench's own closing, not losses.
	stopping  atomic.Bool
	writeErrs [nRoles]atomic.Uint64
	stderr    io.Writer // under mu

	mu               sync.Mutex
	phase            int   // 0 warm-up, 1..3 the phases' windows (ack and unread latencies land there)
	winStart, winEnd int64 // ns of the current (or last) window
	ack              [4]Hist
	unread           Hist
	acked            [4]uint64
	marks, answered  [4]uint64
	errs             map[string]uint64
	lost             [nRoles]int
	lostFirst        string // the first loss: who, and what ended it
	// unread requests sent in C's window, their err answers, and ticks
	// skipped because the asker's request before was not answered yet
	// (one in flight per asker: the answer carries no id)
	asked, askErrs, askBusy, askLost uint64
}

// readsPhase is one window's figures.
type readsPhase struct {
	name                   string
	acked, marks, answered uint64
	ack                    Percentiles
	node, pg, self         time.Duration
	written                uint64
	pgOK, writtenOK        bool
	split                  []ackPhaseStat // the node's ack split (--admin), nil if not read
	splitErr               error
	// the node's split of unread requests (--admin, phase C), nil if not read
	unreadSplit    []ackPhaseStat
	unreadSplitErr error
}

type readsResult struct {
	phases    []readsPhase
	unread    Percentiles
	errs      map[string]uint64
	secs      float64
	conns     [nRoles]int
	lost      [nRoles]int
	lostFirst string
	writeErrs [nRoles]uint64

	asked, askErrs, askBusy, askLost, unanswered uint64
}

func runReads(p *readsParams, stderr io.Writer) (*readsResult, error) {
	urls := splitList(p.url)
	if len(urls) == 0 {
		return nil, fmt.Errorf("--url is empty")
	}
	run := &readsRun{p: p, runID: "rd" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36), newest: make([]atomic.Uint64, p.rooms),
		errs: map[string]uint64{}, stderr: stderr}
	var all []*readsConn
	defer func() {
		run.stopping.Store(true)
		for _, c := range all {
			c.c.Close()
		}
	}()
	var joined atomic.Int64
	dial := func(user string, k, room, role int) (*readsConn, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		c, br, _, err := ws.Dial(ctx, urls[k%len(urls)]+"?user="+user+"&app="+p.app)
		if err != nil {
			return nil, fmt.Errorf("cannot connect %s: %w", user, err)
		}
		if br == nil {
			br = bufio.NewReader(c)
		}
		rc := &readsConn{c: c, user: user, room: room, role: role}
		all = append(all, rc)
		go run.read(rc, br, &joined)
		return rc, nil
	}
	pubs := make([]*readsConn, p.rooms)
	for i := range pubs {
		rc, err := dial("p"+strconv.Itoa(i), i, i, rolePub)
		if err != nil {
			return nil, err
		}
		pubs[i] = rc
	}
	markers := make([]*readsConn, p.users)
	for i := range markers {
		rc, err := dial("m"+strconv.Itoa(i), i, i%p.rooms, roleMark)
		if err != nil {
			return nil, err
		}
		markers[i] = rc
	}
	askers := make([]*readsConn, p.unreadConns)
	for i := range askers {
		rc, err := dial("q"+strconv.Itoa(i), i, 0, roleAsk)
		if err != nil {
			return nil, err
		}
		askers[i] = rc
	}
	// Every connection pings once, or joins its room (markers with
	// --join): its pong or joined says it is up.
	for _, rc := range all {
		frame := []byte(`{"op":"ping"}`)
		if p.join && rc.role == roleMark {
			frame = []byte(`{"op":"join","room":"` + run.runID + "-r" + strconv.Itoa(rc.room) + `"}`)
		}
		if err := rc.send(frame); err != nil {
			return nil, err
		}
	}
	for end := time.Now().Add(time.Minute); joined.Load() < int64(len(all)); {
		if time.Now().After(end) {
			return nil, fmt.Errorf("%d of %d connections answered", joined.Load(), len(all))
		}
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Fprintf(stderr, "%d connections up (%d publishers, %d markers, %d unread askers)\n", len(all), len(pubs), len(markers), len(askers))

	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() {
		close(stop)
		wg.Wait()
	}()
	wg.Add(1)
	go func() { defer wg.Done(); run.publish(pubs, stop) }()
	marking := make(chan struct{})
	asking := make(chan struct{})
	res := &readsResult{secs: p.window.Seconds(), conns: [nRoles]int{len(pubs), len(markers), len(askers)}}
	measure := func(k int, name string) {
		time.Sleep(p.warmup)
		s0 := run.sample(stderr)
		run.mu.Lock()
		run.phase = k
		run.winStart = time.Now().UnixNano()
		run.winEnd = run.winStart + int64(p.window)
		run.mu.Unlock()
		time.Sleep(p.window)
		s1 := run.sample(stderr)
		run.mu.Lock()
		run.phase = 0
		ph := readsPhase{name: name, acked: run.acked[k], marks: run.marks[k], answered: run.answered[k], ack: run.ack[k].Summary(),
			node: s1.node - s0.node, pg: s1.pg - s0.pg, self: s1.self - s0.self, written: s1.written - s0.written,
			pgOK: s0.pgOK && s1.pgOK, writtenOK: s0.writtenOK && s1.writtenOK}
		run.mu.Unlock()
		if p.admin != "" {
			if s0.metricsErr == nil && s1.metricsErr == nil {
				ph.split, ph.splitErr = ackSplit(s0.metrics, s1.metrics)
				if k == 3 { // C's window: the unread requests'
					ph.unreadSplit, ph.unreadSplitErr = unreadSplit(s0.metrics, s1.metrics)
				}
			} else {
				ph.splitErr = errors.Join(s0.metricsErr, s1.metricsErr)
				if k == 3 {
					ph.unreadSplitErr = ph.splitErr
				}
			}
		}
		res.phases = append(res.phases, ph)
		fmt.Fprintf(stderr, "phase %s done\n", name)
	}
	measure(1, "A: publishes")
	if len(markers) > 0 {
		wg.Add(1)
		go func() { defer wg.Done(); run.mark(markers, stop, marking) }()
		measure(2, "B: publishes + read marks")
		close(marking)
	}
	if len(askers) > 0 {
		wg.Add(1)
		go func() { defer wg.Done(); run.askUnread(askers, stop, asking) }()
		measure(3, "C: publishes + unread")
		close(asking)
		// The window's last requests get the time an answer may take.
		for end := time.Now().Add(2 * time.Second); run.inFlight(askers, true) > 0 && time.Now().Before(end); {
			time.Sleep(10 * time.Millisecond)
		}
	}
	run.mu.Lock()
	res.unread = run.unread.Summary()
	res.asked, res.askErrs, res.askBusy, res.askLost = run.asked, run.askErrs, run.askBusy, run.askLost
	run.mu.Unlock()
	res.unanswered = uint64(run.inFlight(askers, true))
	run.stopping.Store(true)
	run.mu.Lock()
	res.errs = run.errs
	res.lost, res.lostFirst = run.lost, run.lostFirst
	run.mu.Unlock()
	for i := range res.writeErrs {
		res.writeErrs[i] = run.writeErrs[i].Load()
	}
	res.warn(stderr, p)
	return res, nil
}

// inFlight counts the askers whose request is not answered yet; inWindow:
// only requests sent in the last window.
func (run *readsRun) inFlight(askers []*readsConn, inWindow bool) int {
	run.mu.Lock()
	from, to := run.winStart, run.winEnd
	run.mu.Unlock()
	n := 0
	for _, rc := range askers {
		rc.mu.Lock()
		if at := rc.sentAt; at != 0 && (!inWindow || at >= from && at < to) {
			n++
		}
		rc.mu.Unlock()
	}
	return n
}

// lose records that rc ended before the bench was done with it.
func (run *readsRun) lose(rc *readsConn, why string) {
	if run.stopping.Load() {
		return
	}
	run.mu.Lock()
	defer run.mu.Unlock()
	run.lost[rc.role]++
	if run.lostFirst == "" {
		run.lostFirst = rc.user + ": " + why
	}
	// the first few as they happen, so that a long run says so at once
	if n := run.lost[0] + run.lost[1] + run.lost[2]; n <= 3 {
		fmt.Fprintf(run.stderr, "roost bench reads: connection %s lost: %s\n", rc.user, why)
	}
}

// read handles one connection's frames: the node's ping (answered with
// a pong: a silent connection that does not answer is closed after twice
// the node's --idle), its close (recorded with its code and reason), pong
// (up), ack (latency, the room's newest seq), read (a mark answered),
// unread (its round trip from the request's send time, see askUnread),
// err (counted). A connection that ends before the bench is done is
// recorded as lost.
func (run *readsRun) read(rc *readsConn, br *bufio.Reader, up *atomic.Int64) {
	rd := wsutil.Reader{Source: br, State: ws.StateClientSide, CheckUTF8: false}
	var f proto.ServerFrame
	buf := make([]byte, 0, 4096)
	closed := ""
	defer rc.ended.Store(true)
	for {
		h, err := rd.NextFrame()
		if err != nil {
			if closed == "" {
				closed = "read: " + err.Error()
			}
			run.lose(rc, closed)
			return
		}
		buf = buf[:0]
		for {
			if len(buf) == cap(buf) {
				buf = append(buf, 0)[:len(buf)]
			}
			n, err := rd.Read(buf[len(buf):cap(buf)])
			buf = buf[:len(buf)+n]
			if err == io.EOF {
				break
			}
			if err != nil {
				run.lose(rc, "read: "+err.Error())
				return
			}
		}
		switch h.OpCode {
		case ws.OpPing:
			if rc.sendFrame(ws.OpPong, buf) != nil {
				run.writeErrs[rc.role].Add(1)
			}
			continue
		case ws.OpClose:
			code, reason := ws.ParseCloseFrameData(buf)
			closed = fmt.Sprintf("closed by the node (%d %q)", code, reason)
			continue
		case ws.OpText:
		default:
			continue
		}
		now := time.Now().UnixNano()
		if proto.DecodeServer(buf, &f) != nil {
			continue
		}
		switch string(f.Op) {
		case "pong", "joined":
			up.Add(1)
		case "msg":
			if f.Seq > rc.seen.Load() {
				rc.seen.Store(f.Seq)
			}
		case "ack":
			sent, _ := strconv.ParseInt(string(f.ID), 10, 64)
			for {
				cur := run.newest[rc.room].Load()
				if f.Seq <= cur || run.newest[rc.room].CompareAndSwap(cur, f.Seq) {
					break
				}
			}
			run.mu.Lock()
			if k := run.phase; k > 0 && sent >= run.winStart && sent < run.winEnd {
				run.acked[k]++
				run.ack[k].Record(now - sent)
			}
			run.mu.Unlock()
		case "read":
			run.mu.Lock()
			run.answered[run.phase]++
			run.mu.Unlock()
		case "unread":
			rc.mu.Lock()
			sent := rc.sentAt
			rc.sentAt = 0
			rc.mu.Unlock()
			run.mu.Lock()
			if sent != 0 && sent >= run.winStart && sent < run.winEnd {
				run.unread.Record(now - sent)
			}
			run.mu.Unlock()
		case "err":
			var sent int64
			if rc.role == roleAsk {
				// an asker sends nothing else: the err answers its request
				rc.mu.Lock()
				sent, rc.sentAt = rc.sentAt, 0
				rc.mu.Unlock()
			}
			run.mu.Lock()
			run.errs[string(f.Code)]++
			if sent != 0 && sent >= run.winStart && sent < run.winEnd {
				run.askErrs++
			}
			run.mu.Unlock()
		}
	}
}

// publish sends --pub-rate publishes a second round-robin over the rooms'
// publishers, in 1 ms steps; each id is its send time (ns), so the ack
// carries its own latency.
func (run *readsRun) publish(pubs []*readsConn, stop chan struct{}) {
	body := `{"p":"` + strings.Repeat("x", max(0, run.p.size-8)) + `"}`
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	start := time.Now()
	var sent float64
	next := 0
	var b []byte
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			owed := now.Sub(start).Seconds()*run.p.pubRate - sent
			for ; owed >= 1; owed-- {
				rc := pubs[next]
				next = (next + 1) % len(pubs)
				b = append(b[:0], `{"op":"pub","room":"`...)
				b = append(b, run.runID...)
				b = append(b, "-r"...)
				b = strconv.AppendInt(b, int64(rc.room), 10)
				b = append(b, `","id":"`...)
				b = strconv.AppendInt(b, time.Now().UnixNano(), 10)
				b = append(b, `","body":`...)
				b = append(b, body...)
				b = append(b, '}')
				if rc.send(b) != nil {
					run.writeErrs[rolePub].Add(1)
				}
				sent++
			}
		}
	}
}

// mark has each marker mark its room read at the room's newest acked seq
// once per --mark-every, in turn, paced by the millisecond as the
// publishes are (10,000 markers a second: 10 marks a millisecond), what
// is owed since the start: a tick of 10 ms with a whole number of marks
// each (this bench until 2026-12-07) sent 100 a second for 30 markers.
// The smoother pace did not change the publishes' ack p99 (bench notes
// 2026-12-07, "Marks paced by the millisecond").
func (run *readsRun) mark(markers []*readsConn, stop, done chan struct{}) {
	rate := float64(len(markers)) / run.p.markEvery.Seconds()
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	start := time.Now()
	var sent float64
	next := 0
	var b []byte
	for {
		var now time.Time
		select {
		case <-stop:
			return
		case <-done:
			return
		case now = <-t.C:
		}
		for owed := now.Sub(start).Seconds()*rate - sent; owed >= 1; owed-- {
			sent++
			rc := markers[next]
			next = (next + 1) % len(markers)
			seq := run.newest[rc.room].Load()
			if run.p.join {
				seq = rc.seen.Load()
			}
			if seq == 0 {
				continue
			}
			b = append(b[:0], `{"op":"read","room":"`...)
			b = append(b, run.runID...)
			b = append(b, "-r"...)
			b = strconv.AppendInt(b, int64(rc.room), 10)
			b = append(b, `","seq":`...)
			b = strconv.AppendUint(b, seq, 10)
			b = append(b, '}')
			if rc.send(b) != nil {
				run.writeErrs[roleMark].Add(1)
				continue
			}
			run.mu.Lock()
			run.marks[run.phase]++
			run.mu.Unlock()
		}
	}
}

// askUnread sends --unread-rate unread requests a second over the askers,
// each for --unread-rooms rooms, one in flight per asker: the answer
// carries no id, so an asker whose request is not answered yet skips its
// turn (counted), rather than losing the time its request was sent.
func (run *readsRun) askUnread(askers []*readsConn, stop, done chan struct{}) {
	var rooms []byte
	for i := 0; i < run.p.unreadRooms; i++ {
		if i > 0 {
			rooms = append(rooms, ',')
		}
		rooms = append(rooms, '"')
		rooms = append(rooms, run.runID...)
		rooms = append(rooms, "-r"...)
		rooms = strconv.AppendInt(rooms, int64(i%run.p.rooms), 10)
		rooms = append(rooms, '"')
	}
	req := append(append([]byte(`{"op":"unread","rooms":[`), rooms...), "]}"...)
	every := time.Duration(float64(time.Second) / run.p.unreadRate)
	t := time.NewTicker(every)
	defer t.Stop()
	next := 0
	for {
		select {
		case <-stop:
			return
		case <-done:
			return
		case <-t.C:
		}
		rc := askers[next]
		next = (next + 1) % len(askers)
		rc.mu.Lock()
		now := time.Now().UnixNano()
		lost := rc.ended.Load()
		busy := rc.sentAt != 0
		var err error
		if !busy && !lost {
			// set before the write: the answer may be read before it returns
			rc.sentAt = now
			rc.buf = appendClientText(rc.buf[:0], req)
			if _, err = rc.c.Write(rc.buf); err != nil {
				rc.sentAt = 0
			}
		}
		rc.mu.Unlock()
		if err != nil {
			run.writeErrs[roleAsk].Add(1)
			continue
		}
		run.mu.Lock()
		if now >= run.winStart && now < run.winEnd {
			switch {
			case lost:
				run.askLost++
			case busy:
				run.askBusy++
			default:
				run.asked++
			}
		}
		run.mu.Unlock()
	}
}

// readsSample is one window edge: the CPU of the nodes, PostgreSQL's and
// this process's, and the node's metrics (--admin).
type readsSample struct {
	node, pg, self  time.Duration
	written         uint64
	pgOK, writtenOK bool
	metrics         map[string]float64
	metricsErr      error
}

func (run *readsRun) sample(stderr io.Writer) readsSample {
	var s readsSample
	s.self = selfCPU()
	for _, ps := range splitList(run.p.pids) {
		pid, _ := strconv.Atoi(ps)
		c, err := procCPU(pid)
		if err != nil {
			fmt.Fprintln(stderr, "node cpu:", err)
		}
		s.node += c
	}
	if run.p.pgDB != "" {
		var err error
		s.pg, _, err = commCPU("postgres", pgProcessOf(run.p.pgDB))
		s.pgOK = err == nil
	}
	if run.p.admin != "" {
		s.metrics, s.metricsErr = scrapeMetrics(run.p.admin)
		if s.metricsErr != nil {
			fmt.Fprintln(stderr, "node metrics:", s.metricsErr)
		}
		v, ok := s.metrics["roost_read_marks_written_total"]
		s.written, s.writtenOK = uint64(v), ok
	}
	return s
}

// scrapeMetrics reads a node's /metrics: each series (its name and
// labels as written) and its value.
func scrapeMetrics(admin string) (map[string]float64, error) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + admin + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s/metrics: %s", admin, resp.Status)
	}
	return parseMetrics(resp.Body)
}

func (r *readsResult) print(w io.Writer, p *readsParams) {
	var a *readsPhase
	for i := range r.phases {
		ph := &r.phases[i]
		fmt.Fprintf(w, "%s: %.0f publishes/s acked, ack p50 %s p99 %s p999 %s", ph.name, float64(ph.acked)/r.secs,
			fmtDur(ph.ack.P50), fmtDur(ph.ack.P99), fmtDur(ph.ack.P999))
		if ph.marks > 0 {
			fmt.Fprintf(w, "; %.0f read marks/s sent, %.0f/s answered", float64(ph.marks)/r.secs, float64(ph.answered)/r.secs)
		} else if strings.HasPrefix(ph.name, "B") {
			fmt.Fprint(w, "; NO read mark sent")
		}
		if ph.writtenOK {
			fmt.Fprintf(w, ", %.0f/s written", float64(ph.written)/r.secs)
		}
		fmt.Fprintln(w)
		fmt.Fprint(w, "  ")
		if ph.node > 0 && ph.acked > 0 {
			fmt.Fprintf(w, "node CPU %.1f%%, %.1f µs per publish; ", 100*ph.node.Seconds()/r.secs, float64(ph.node.Nanoseconds())/1e3/float64(ph.acked))
		}
		// this process shares its core: saturated, its own latencies grow
		fmt.Fprintf(w, "bench CPU %.1f%%\n", 100*ph.self.Seconds()/r.secs)
		if ph.pgOK && ph.acked > 0 {
			fmt.Fprintf(w, "  PostgreSQL CPU %.1f%%, %.1f µs per publish", 100*ph.pg.Seconds()/r.secs, float64(ph.pg.Nanoseconds())/1e3/float64(ph.acked))
			if a != nil && ph.marks > 0 {
				// net of phase A's cost per publish, at this phase's publishes
				net := ph.pg.Seconds() - a.pg.Seconds()*float64(ph.acked)/float64(max(a.acked, 1))
				fmt.Fprintf(w, "; %.2f µs per read mark (net of A)", net*1e6/float64(ph.marks))
				if ph.writtenOK && ph.written > 0 {
					fmt.Fprintf(w, ", %.2f µs per mark written", net*1e6/float64(ph.written))
				}
			}
			fmt.Fprintln(w)
		}
		if a != nil && ph.marks > 0 && a.ack.P99 > 0 {
			fmt.Fprintf(w, "  ack p99 %+.1f%% against A\n", 100*(float64(ph.ack.P99)/float64(a.ack.P99)-1))
		}
		switch {
		case ph.splitErr != nil:
			fmt.Fprintf(w, "  node ack split: not read: %v\n", ph.splitErr)
		case ph.split != nil:
			fmt.Fprintf(w, "  node ack split, ms mean/p99: %s\n", fmtAckSplit(ph.split))
		}
		switch {
		case ph.unreadSplitErr != nil:
			fmt.Fprintf(w, "  node unread split: not read: %v\n", ph.unreadSplitErr)
		case ph.unreadSplit != nil:
			fmt.Fprintf(w, "  node unread split, ms mean/p99: %s\n", fmtSplit(ph.unreadSplit, "requests"))
		}
		if i == 0 {
			a = ph
		}
	}
	if r.unread.Count > 0 {
		fmt.Fprintf(w, "unread of %d rooms: %d answers, p50 %s p99 %s p999 %s max %s\n", p.unreadRooms, r.unread.Count,
			fmtDur(r.unread.P50), fmtDur(r.unread.P99), fmtDur(r.unread.P999), fmtDur(r.unread.Max))
	}
	for _, line := range r.problems(p) {
		fmt.Fprintln(w, line)
	}
	if len(r.errs) > 0 {
		b, _ := json.Marshal(r.errs)
		fmt.Fprintf(w, "errors: %s\n", b)
	}
}

// problems are the report's lines for what went wrong on the bench's side
// of the figures: connections the node closed, writes that failed, unread
// requests left unanswered. Empty when none.
func (r *readsResult) problems(p *readsParams) []string {
	var out []string
	var lost []string
	for i, n := range r.lost {
		if n > 0 {
			lost = append(lost, fmt.Sprintf("%d of %d %s", n, r.conns[i], roleNames[i]))
		}
	}
	if len(lost) > 0 {
		out = append(out, fmt.Sprintf("CONNECTIONS LOST: %s (first: %s)", strings.Join(lost, ", "), r.lostFirst))
	}
	var werr []string
	for i, n := range r.writeErrs {
		if n > 0 {
			werr = append(werr, fmt.Sprintf("%d by %s", n, roleNames[i]))
		}
	}
	if len(werr) > 0 {
		out = append(out, "WRITES FAILED: "+strings.Join(werr, ", "))
	}
	if r.conns[roleAsk] > 0 {
		switch {
		case r.asked == 0:
			out = append(out, fmt.Sprintf("unread of %d rooms: NO request sent in the window", p.unreadRooms))
		case r.unread.Count == 0 || r.unanswered > 0 || r.askErrs > 0:
			out = append(out, fmt.Sprintf("unread of %d rooms: %d requests sent in the window, %d answered, %d answered err, %d unanswered",
				p.unreadRooms, r.asked, r.unread.Count, r.askErrs, r.unanswered))
		}
		if r.askLost > 0 {
			out = append(out, fmt.Sprintf("unread: %d turns skipped in the window, the asker's connection lost", r.askLost))
		}
		if r.askBusy > 0 {
			out = append(out, fmt.Sprintf("unread: %d turns skipped in the window, the asker still waiting for the answer before (unanswered, or --unread-rate over --unread-conns too high)", r.askBusy))
		}
	}
	return out
}

// warn says the report's problems on stderr too, where a run's log is read.
func (r *readsResult) warn(stderr io.Writer, p *readsParams) {
	for _, line := range r.problems(p) {
		fmt.Fprintln(stderr, "roost bench reads:", line)
	}
}
