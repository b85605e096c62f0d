//go:build linux

package bench

import (
	"bytes"
	"encoding/xml"
	"math"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"golang.org/x/sys/unix"

	"github.com/roost-chat/roost/proto"
)

func TestSeqCheckerReportsEachAnomaly(t *testing.T) {
	tests := []struct {
		name                       string
		start                      uint64 // 0: baseline from the first seq
		seqs                       []uint64
		gaps, missing, dups, reord uint64
		last                       uint64
	}{
		{name: "in order", start: 10, seqs: []uint64{11, 12, 13, 14}, last: 14},
		{name: "first seq sets baseline", seqs: []uint64{57, 58, 59}, last: 59},
		{name: "one gap", start: 0, seqs: []uint64{1, 2, 4, 5}, gaps: 1, missing: 1, last: 5},
		{name: "gap of three", seqs: []uint64{1, 5, 6}, gaps: 1, missing: 3, last: 6},
		{name: "gap after join", start: 5, seqs: []uint64{7, 8}, gaps: 1, missing: 1, last: 8},
		{name: "duplicate", seqs: []uint64{1, 2, 2, 3}, dups: 1, last: 3},
		{name: "duplicate of old", seqs: []uint64{1, 2, 3, 4, 1}, dups: 1, last: 4},
		{name: "swap", seqs: []uint64{1, 3, 2, 4}, gaps: 1, reord: 1, last: 4},
		{name: "late into middle of hole", seqs: []uint64{1, 6, 3, 7}, gaps: 1, missing: 3, reord: 1, last: 7},
		{name: "hole filled completely", seqs: []uint64{1, 4, 2, 3, 5}, gaps: 1, reord: 2, last: 5},
		{name: "late then duplicate of late", seqs: []uint64{1, 3, 2, 2}, gaps: 1, reord: 1, dups: 1, last: 3},
		{name: "everything", seqs: []uint64{1, 2, 2, 5, 3, 6, 6, 9, 10}, gaps: 2, missing: 3, reord: 1, dups: 2, last: 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var c SeqChecker
			if tc.start > 0 {
				c.Start(tc.start)
			} else if tc.seqs[0] == 1 {
				c.Start(0)
			}
			for _, s := range tc.seqs {
				c.Observe(s)
			}
			if c.Gaps != tc.gaps || c.Missing != tc.missing || c.Duplicates != tc.dups || c.Reordered != tc.reord {
				t.Fatalf("gaps %d missing %d dups %d reordered %d; want %d %d %d %d",
					c.Gaps, c.Missing, c.Duplicates, c.Reordered, tc.gaps, tc.missing, tc.dups, tc.reord)
			}
			if c.Last() != tc.last {
				t.Fatalf("last %d, want %d", c.Last(), tc.last)
			}
			if c.Received != uint64(len(tc.seqs)) {
				t.Fatalf("received %d", c.Received)
			}
			if c.Clean() != (tc.gaps+tc.dups+tc.reord == 0) {
				t.Fatalf("Clean() = %v", c.Clean())
			}
		})
	}
}

func TestSeqCheckerInOrderDoesNotAllocate(t *testing.T) {
	var c SeqChecker
	c.Start(0)
	seq := uint64(0)
	if n := testing.AllocsPerRun(1000, func() { seq++; c.Observe(seq) }); n != 0 {
		t.Fatalf("%v allocs per in-order Observe", n)
	}
}

func TestHistQuantiles(t *testing.T) {
	var h Hist
	for v := int64(1); v <= 100000; v++ {
		h.Record(v * 1000) // 1µs .. 100ms
	}
	for _, q := range []float64{0.5, 0.9, 0.99, 0.999} {
		want := q * 100000 * 1000
		got := float64(h.Quantile(q))
		if math.Abs(got-want)/want > 0.01 {
			t.Errorf("q%v = %v, want %v within 1%%", q, got, want)
		}
	}
	if h.Max() != 100*time.Millisecond {
		t.Errorf("max %v", h.Max())
	}
	if h.Count() != 100000 {
		t.Errorf("count %d", h.Count())
	}
	if m := h.Mean(); math.Abs(float64(m)-50000500) > 1000 {
		t.Errorf("mean %v", m)
	}
}

func TestHistIndexIsMonotonicAndInvertible(t *testing.T) {
	prev := -1
	for _, v := range []uint64{0, 1, 127, 128, 129, 255, 256, 257, 1000, 1 << 20, 1<<40 + 12345, math.MaxInt64} {
		i := histIndex(v)
		if i < prev || i >= histBuckets {
			t.Fatalf("index(%d) = %d after %d", v, i, prev)
		}
		if lo := histLow(i); lo > v || (i+1 < histBuckets && histLow(i+1) <= v) {
			t.Fatalf("value %d not in bucket %d [%d, %d)", v, i, lo, histLow(i+1))
		}
		prev = i
	}
}

func TestHistMergeAndJSON(t *testing.T) {
	var a, b, all Hist
	for i := int64(0); i < 5000; i++ {
		a.Record(i * 7919 % 1000003)
		b.Record(i * 104729 % 10000019)
		all.Record(i * 7919 % 1000003)
		all.Record(i * 104729 % 10000019)
	}
	var viaJSON Hist
	viaJSON.fromJSON(b.toJSON())
	a.Merge(&viaJSON)
	if a.Summary() != all.Summary() {
		t.Fatalf("merged %+v != %+v", a.Summary(), all.Summary())
	}
	a.Record(-5)
	if a.Quantile(0) != 0 {
		t.Fatalf("negative value not clamped")
	}
}

func TestHistRecordDoesNotAllocate(t *testing.T) {
	var h Hist
	v := int64(0)
	if n := testing.AllocsPerRun(1000, func() { v += 977; h.Record(v) }); n != 0 {
		t.Fatalf("%v allocs per Record", n)
	}
}

// testLoop is a loop with no epoll, for driving the receive path directly.
func testLoop(t testing.TB) (*loop, *conn) {
	e := &engine{rooms: []string{"r0"}, sizeFn: func(*uint64) int { return 100 }}
	e.winStart.Store(0)
	e.winEnd.Store(math.MaxInt64)
	l := &loop{e: e, buf: make([]byte, readBufSize), rng: 1, st: newLevelStats(),
		snap: make(chan *levelStats, 1)}
	spec := &connSpec{room: 0, join: true, publish: true, receivers: 1}
	c := &conn{fd: -1, state: stReady, spec: spec, room: []byte("r0"), inflight: make([]sendSlot, 16)}
	c.ck.Start(0)
	return l, c
}

// serverStream is what a node sends a receiver: n msg frames of room r0
// from seq first, each body stamped with ts.
func serverStream(first uint64, n int, ts int64) []byte {
	var b []byte
	body := []byte(`{"p":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx","t":` + itoa(ts) + `}`)
	for i := 0; i < n; i++ {
		b = proto.AppendMsgFrame(b, "r0", first+uint64(i), []byte("7"), "u1", ts/1e6, body)
	}
	return b
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

func TestReceivePathCountsAndChecks(t *testing.T) {
	l, c := testLoop(t)
	now := time.Now().UnixNano()
	stream := serverStream(1, 50, now-int64(2*time.Millisecond))
	// split anywhere: the tail must come back for the next read
	cut := len(stream)/2 + 3
	rest := l.frames(c, stream[:cut], now)
	rest = l.frames(c, append(append([]byte(nil), rest...), stream[cut:]...), now)
	if len(rest) != 0 {
		t.Fatalf("%d bytes left", len(rest))
	}
	if l.st.Delivered != 50 || l.st.RecvFrames != 50 || c.ck.Last() != 50 || !c.ck.Clean() {
		t.Fatalf("delivered %d recv %d last %d clean %v", l.st.Delivered, l.st.RecvFrames, c.ck.Last(), c.ck.Clean())
	}
	if p := l.st.Lat.Quantile(0.5); p < time.Millisecond || p > 3*time.Millisecond {
		t.Fatalf("latency %v, want about 2ms", p)
	}
	// an ack for an id the publisher sent
	l.appendPub(c, now-int64(time.Millisecond))
	ack := []byte(`{"op":"ack","id":"1","room":"r0","seq":51}`)
	l.frames(c, appendServerText(nil, ack), now)
	if l.st.Acked != 1 || c.ackMax != 51 || l.st.AckLat.Count() != 1 {
		t.Fatalf("acked %d ackMax %d", l.st.Acked, c.ackMax)
	}
	// a gap is seen
	l.frames(c, serverStream(53, 1, now), now)
	if c.ck.Gaps != 1 {
		t.Fatalf("gap not reported")
	}
}

// appendServerText frames a payload as the node does (unmasked text).
func appendServerText(dst, payload []byte) []byte {
	h := ws.Header{Fin: true, OpCode: ws.OpText, Length: int64(len(payload))}
	var buf bytes.Buffer
	_ = ws.WriteHeader(&buf, h)
	return append(append(dst, buf.Bytes()...), payload...)
}

func TestReceivePathDoesNotAllocate(t *testing.T) {
	l, c := testLoop(t)
	now := time.Now().UnixNano()
	stream := serverStream(1, 100, now)
	seq := uint64(0)
	n := testing.AllocsPerRun(200, func() {
		// rewrite the seqs would cost a re-encode: restart the checker instead
		c.ck.Start(seq)
		l.frames(c, stream, now)
	})
	if n != 0 {
		t.Fatalf("%v allocs per 100 received frames", n)
	}
}

func BenchmarkReceivePath(b *testing.B) {
	l, c := testLoop(b)
	now := time.Now().UnixNano()
	const frames = 100
	stream := serverStream(1, frames, now)
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c.ck.Start(0)
		l.frames(c, stream, now)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*frames), "ns/frame")
}

func TestPubFrameDecodesOnTheNode(t *testing.T) {
	for _, size := range []int{0, 100, 2048} {
		l, c := testLoop(t)
		l.e.sizeFn = func(*uint64) int { return size }
		now := time.Now().UnixNano()
		l.appendPub(c, now)
		h, hn, err := proto.ParseFrameHeader(c.out)
		if err != nil || hn == 0 || !h.Masked || h.OpCode != ws.OpText || int64(len(c.out)-hn) != h.Length {
			t.Fatalf("size %d: header %+v n %d err %v", size, h, hn, err)
		}
		payload := append([]byte(nil), c.out[hn:]...)
		proto.Unmask(payload, h.Mask)
		var cmd proto.Command
		if err := proto.Decode(payload, &cmd); err != nil {
			t.Fatalf("size %d: node rejects %s: %v", size, payload, err)
		}
		if cmd.Op != proto.OpPub || string(cmd.Room) != "r0" || string(cmd.ID) != "1" {
			t.Fatalf("decoded %+v", cmd)
		}
		if bodyStamp(cmd.Body) != now {
			t.Fatalf("stamp %d, want %d", bodyStamp(cmd.Body), now)
		}
		if size >= 40 && len(cmd.Body) != size {
			t.Fatalf("body %d bytes, want %d", len(cmd.Body), size)
		}
	}
}

// A refused connection's error carries the node's reason, and a 401 to a
// bench without a secret says how to give one.
func TestRefusedNamesTheReason(t *testing.T) {
	resp := proto.AppendHTTPError(nil, &proto.HTTPError{Status: 401, Reason: "token signature does not match the app's secret"})
	n, ok := parseUpgradeResponse(resp)
	if n == 0 || ok {
		t.Fatalf("n %d ok %v for %q", n, ok, resp)
	}
	got := refused("upgrade refused", resp, n, true).Error()
	if got != `upgrade refused: "HTTP/1.1 401 Unauthorized" ("token signature does not match the app's secret")` {
		t.Fatalf("with a secret: %s", got)
	}
	if got := refused("upgrade refused", resp, n, false).Error(); !strings.Contains(got, "give --app A with the app's secret") {
		t.Fatalf("without a secret: %s", got)
	}
	head := []byte("HTTP/1.1 403 Forbidden\r\n\r\n") // no body yet: the status line alone
	if got := refused("SSE stream refused", head, len(head), false).Error(); got != `SSE stream refused: "HTTP/1.1 403 Forbidden"` {
		t.Fatalf("no body: %s", got)
	}
}

func TestUpgradeResponse(t *testing.T) {
	resp := proto.AppendUpgradeResponse(nil, []byte(wsKey))
	n, ok := parseUpgradeResponse(append(resp, 0x81, 0))
	if n != len(resp) || !ok {
		t.Fatalf("n %d ok %v for %q", n, ok, resp)
	}
	if n, _ := parseUpgradeResponse(resp[:len(resp)-1]); n != 0 {
		t.Fatalf("incomplete head accepted")
	}
	if _, ok := parseUpgradeResponse([]byte("HTTP/1.1 401 Unauthorized\r\n\r\n")); ok {
		t.Fatalf("401 accepted")
	}
	req := string(appendUpgrade(nil, "127.0.0.1:1", "/ws?user=a&app=b"))
	if !strings.HasPrefix(req, "GET /ws?user=a&app=b HTTP/1.1\r\n") || !strings.HasSuffix(req, "\r\n\r\n") {
		t.Fatalf("request %q", req)
	}
	var r proto.Request
	if n, err := proto.ParseRequest([]byte(req), &r); err != nil || n != len(req) {
		t.Fatalf("node rejects request: n %d err %v", n, err)
	}
}

func TestProcStat(t *testing.T) {
	stat := []byte("1234 (a) b (c)) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0\n")
	d, err := parseStatCPU(stat)
	if err != nil || d != 3*time.Second {
		t.Fatalf("cpu %v err %v", d, err)
	}
	if statComm(stat) != "a) b (c)" {
		t.Fatalf("comm %q", statComm(stat))
	}
	rss, err := parseVmRSS([]byte("Name:\tx\nVmRSS:\t  2048 kB\nThreads: 3\n"))
	if err != nil || rss != 2048<<10 {
		t.Fatalf("rss %d err %v", rss, err)
	}
	if _, err := procCPU(os.Getpid()); err != nil {
		t.Fatal(err)
	}
	if v, err := procRSS(os.Getpid()); err != nil || v <= 0 {
		t.Fatalf("own rss %d err %v", v, err)
	}
	own, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Fatal(err)
	}
	if _, n, err := commCPU(statComm(own), nil); err != nil || n < 1 {
		t.Fatalf("commCPU found %d processes named %q: %v", n, statComm(own), err)
	}
	if selfCPU() <= 0 {
		t.Fatal("no own CPU time")
	}
}

func TestPlans(t *testing.T) {
	p := &params{scenario: "delivery", members: 300, publishers: 30, pubJoin: true, rate: 1000, runID: "x"}
	pl := p.buildPlan(2, 3)
	if len(pl.specs) != 330 || pl.publishers != 30 || len(pl.rooms) != 1 {
		t.Fatalf("delivery: %d specs %d publishers %d rooms", len(pl.specs), pl.publishers, len(pl.rooms))
	}
	for _, s := range pl.specs {
		if s.publish && s.receivers != 330 {
			t.Fatalf("receivers %d", s.receivers)
		}
	}
	seen := 0
	for i := 0; i < 3; i++ {
		seen += len(pl.share(i, 3))
	}
	if seen != 330 {
		t.Fatalf("shares cover %d", seen)
	}
	p = &params{scenario: "publish", rooms: 10, rate: 100, runID: "x"}
	pl = p.buildPlan(2, 0)
	for _, s := range pl.specs {
		if s.publish && pl.specs[0].target == s.target && s.room == 0 {
			t.Fatalf("publisher and receiver of room 0 on one node")
		}
	}
	p = &params{scenario: "mixed", users: 1000, active: 0.1, interval: 2 * time.Second, roomSize: 50, runID: "x"}
	pl = p.buildPlan(1, 0)
	if pl.publishers != 100 || len(pl.rooms) != 20 || pl.rate != 50 {
		t.Fatalf("mixed: %d publishers %d rooms rate %v", pl.publishers, len(pl.rooms), pl.rate)
	}
	p.size, p.longSize, p.longShare = 100, 2048, 0.1
	fn := p.sizeFunc()
	rng, long := uint64(7), 0
	for i := 0; i < 10000; i++ {
		if fn(&rng) == 2048 {
			long++
		}
	}
	if long < 800 || long > 1200 {
		t.Fatalf("%d long of 10000", long)
	}
}

func TestChatPlanSpreadsEveryRoom(t *testing.T) {
	p := &params{scenario: "chat", rooms: 12, roomSize: 10, active: 0.2, interval: 2 * time.Second, runID: "x"}
	pl := p.buildPlan(3, 0)
	if len(pl.specs) != 120 || len(pl.rooms) != 12 || pl.publishers != 24 || pl.rate != 12 {
		t.Fatalf("chat: %d specs %d rooms %d publishers rate %v", len(pl.specs), len(pl.rooms), pl.publishers, pl.rate)
	}
	nodes := map[int32]map[int]bool{}
	procs := map[int32]map[int]bool{}
	for i, s := range pl.specs {
		if !s.join {
			t.Fatalf("spec %d does not join", i)
		}
		if s.publish && s.receivers != 10 {
			t.Fatalf("receivers %d", s.receivers)
		}
		if nodes[s.room] == nil {
			nodes[s.room], procs[s.room] = map[int]bool{}, map[int]bool{}
		}
		nodes[s.room][s.target] = true
		procs[s.room][i%2] = true
	}
	for r := range nodes {
		// each room is on every node and in every process, so that
		// delivery crosses the broker and the workers' merge
		if len(nodes[r]) != 3 || len(procs[r]) != 2 {
			t.Fatalf("room %d on nodes %v procs %v", r, nodes[r], procs[r])
		}
	}
}

func TestSizesMix(t *testing.T) {
	mix, err := parseSizes("100:90, 2048:10")
	if err != nil {
		t.Fatal(err)
	}
	fn := mixFunc(mix)
	rng, n := uint64(7), map[int]int{}
	for i := 0; i < 20000; i++ {
		n[fn(&rng)]++
	}
	if len(n) != 2 || n[2048] < 1700 || n[2048] > 2300 {
		t.Fatalf("mix %v", n)
	}
	if mix, err := parseSizes("500"); err != nil || mixFunc(mix)(&rng) != 500 {
		t.Fatalf("one size: %v %v", mix, err)
	}
	for _, bad := range []string{"", "x:1", "100:0", "100:-1", "70000:1", "100:inf", "100:y"} {
		if _, err := parseSizes(bad); err == nil {
			t.Errorf("--sizes %q accepted", bad)
		}
	}
	var pl procList
	if err := pl.Set("12, 0,b=34"); err != nil || len(pl) != 2 || pl.first() != 12 || pl.String() != "pid12=12,b=34" {
		t.Fatalf("pid list %v %v", pl, err)
	}
	pf := filepath.Join(t.TempDir(), "pid")
	if err := pl.Set("n=@" + pf); err != nil || pl.first() != 0 {
		t.Fatalf("missing pid file: %v %v", pl, err)
	}
	os.WriteFile(pf, []byte("4321\n"), 0o644)
	if pl.first() != 4321 || pl[0].name != "n" {
		t.Fatalf("pid file: %v", pl)
	}
	if err := pl.Set("12,x"); err == nil {
		t.Fatal("bad pid accepted")
	}
}

func TestUsage(t *testing.T) {
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := Main(args, &out, &errb)
		return code, out.String(), errb.String()
	}
	if code, out, _ := run(); code != 0 || !strings.Contains(out, "delivery") || !strings.Contains(out, "soak") {
		t.Fatalf("bare: %d %q", code, out)
	}
	if code, _, errs := run("nope"); code != 2 || !strings.Contains(errs, "unknown scenario") {
		t.Fatalf("unknown scenario: %d %q", code, errs)
	}
	if code, _, errs := run("delivery", "--bogus"); code != 2 || !strings.Contains(errs, "bogus") {
		t.Fatalf("unknown flag: %d %q", code, errs)
	}
	if code, _, errs := run("delivery", "--rate", "fast"); code != 2 || !strings.Contains(errs, "rate") {
		t.Fatalf("bad value: %d %q", code, errs)
	}
	if code, _, errs := run("delivery", "--procs", "0"); code != 2 || !strings.Contains(errs, "--procs") {
		t.Fatalf("bad procs: %d %q", code, errs)
	}
	if code, _, errs := run("delivery", "--url", "http://x"); code != 2 || !strings.Contains(errs, "ws://") {
		t.Fatalf("bad url: %d %q", code, errs)
	}
	if code, _, errs := run("chat", "--sizes", "100:0"); code != 2 || !strings.Contains(errs, "--sizes") {
		t.Fatalf("bad sizes: %d %q", code, errs)
	}
	if code, _, errs := run("chat", "--active", "0"); code != 2 || !strings.Contains(errs, "--active") {
		t.Fatalf("bad active: %d %q", code, errs)
	}
	if code, _, errs := run("density", "extra"); code != 2 || !strings.Contains(errs, "extra") {
		t.Fatalf("stray arg: %d %q", code, errs)
	}
	// The modes with flags of their own parse them alike.
	for _, mode := range []string{"broker", "kinds", "presence", "proxy-backend", "reads"} {
		if code, _, errs := run(mode, "-h"); code != 0 || !strings.Contains(errs, "roost bench "+mode) {
			t.Fatalf("%s -h: %d %q", mode, code, errs)
		}
		if code, _, errs := run(mode, "--bogus"); code != 2 || !strings.Contains(errs, "bogus") {
			t.Fatalf("%s unknown flag: %d %q", mode, code, errs)
		}
		if code, _, errs := run(mode, "extra"); code != 2 || !strings.Contains(errs, `roost bench `+mode+`: unexpected argument "extra"`) {
			t.Fatalf("%s stray arg: %d %q", mode, code, errs)
		}
	}
}

func TestPlotIsWellFormedSVG(t *testing.T) {
	rep := &Report{Scenario: "delivery", HighestSustained: 2000}
	for i, r := range []float64{1000, 2000, 4000} {
		rep.Levels = append(rep.Levels, LevelResult{Offered: r, Sustained: i < 2, Latency: Percentiles{
			P50: time.Duration(i+1) * time.Millisecond, P99: time.Duration(i+1) * 5 * time.Millisecond, P999: time.Duration(i+1) * 20 * time.Millisecond}})
	}
	for _, r := range []*Report{rep, {Scenario: "empty"}} {
		svg := plotSVG(r)
		dec := xml.NewDecoder(bytes.NewReader(svg))
		for {
			_, err := dec.Token()
			if err != nil {
				if err.Error() != "EOF" {
					t.Fatalf("invalid SVG: %v\n%s", err, svg)
				}
				break
			}
		}
	}
	if !bytes.Contains(plotSVG(rep), []byte("polyline")) {
		t.Fatal("no lines")
	}
}

func TestMsgFastMatchesProto(t *testing.T) {
	bodies := []string{`{"p":"xx","t":1764484800123456789}`, `{"t":5}`, `{"p":"x","t":-3}`, `[1,2]`, `"s"`, `{"x":{"t":5}}`,
		`{"t":1764484800123456789,"p":"xx"}`, `{}`, `7`, `{"p":"x","t":12345678901234567890}`, `null`}
	const room = "room-1:a.b_c"
	for _, body := range bodies {
		frame := proto.AppendMsgFrame(nil, room, 987654321, []byte("42"), "u\"7", 1764484800123, []byte(body))
		_, hn, _ := proto.ParseFrameHeader(frame)
		payload := frame[hn:]
		var f proto.ServerFrame
		if err := proto.DecodeServer(payload, &f); err != nil {
			t.Fatal(err)
		}
		// the connection's room, a shorter and a longer one: the seq must
		// be found whatever room the connection thinks it is in
		for _, connRoom := range []string{room, "r", room + "-longer"} {
			seq, stamp, ok := msgFast(payload, []byte(connRoom))
			if !ok || seq != f.Seq || stamp != bodyStamp(f.Body) {
				t.Fatalf("body %s, room %s: fast %d %d %v, slow %d %d", body, connRoom, seq, stamp, ok, f.Seq, bodyStamp(f.Body))
			}
		}
	}
	for _, p := range []string{`{"op":"ack","id":"1","room":"r","seq":1}`, `{"room":"r","op":"msg","seq":1}`, `{"op":"msg","room":"r","seq":x}`,
		`{"op":"msg","room":"r`, `{"op":"msg","room":"r","seq":1`, `{"op":"msg","room":"r\"x","seq":1,"id":"1"}`} {
		if _, _, ok := msgFast([]byte(p), []byte("r")); ok {
			t.Fatalf("fast path took %s", p)
		}
	}
}

func TestBodyStamp(t *testing.T) {
	for _, v := range []int64{0, 7, 12345678, 123456789, 1764484800123456789, 9223372036854775807, 10000000, 99999999, 1000000000000000000} {
		for _, head := range []string{`{"p":"xx",`, `{`, `{"a":"t",`} {
			body := head + `"t":` + itoa(v) + `}`
			if got := bodyStamp([]byte(body)); got != v {
				t.Fatalf("%s: got %d", body, got)
			}
		}
	}
	for _, body := range []string{`{"t":x}`, `{"p":1}`, `{"t":}`, `[1]`, `{"t":1234567890123456789`, `{"t":1}}`, `"t":5}`[1:], `{"t":12345678901234567x9}`, ``, `}`} {
		if got := bodyStamp([]byte(body)); got != 0 {
			t.Fatalf("%s: got %d, want 0", body, got)
		}
	}
}

// TestRecvStamp checks that a read on a bench socket carries the kernel's
// receive time, which the latency figures rest on.
func TestRecvStamp(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1); err != nil {
		t.Fatal(err)
	}
	sa := &unix.SockaddrInet4{Port: ln.Addr().(*net.TCPAddr).Port, Addr: [4]byte{127, 0, 0, 1}}
	if err := unix.Connect(fd, sa); err != nil {
		t.Fatal(err)
	}
	peer, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	var x rx
	buf := make([]byte, 64)
	// The kernel turns receive timestamps on for the machine from a work
	// queue, so the first segments after the first socket asks can carry
	// none (the engine then takes the time itself): wait for a stamped one.
	for i := 0; ; i++ {
		if _, err := peer.Write([]byte("w")); err != nil {
			t.Fatal(err)
		}
		if _, ts, err := x.recv(fd, buf); err != nil {
			t.Fatal(err)
		} else if ts != 0 {
			break
		}
		if i == 200 {
			t.Fatal("no receive timestamp after 2 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i := 0; i < 3; i++ {
		before := time.Now().UnixNano()
		if _, err := peer.Write([]byte("hello")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond) // the stamp is the arrival, not the read
		after := time.Now().UnixNano()
		n, ts, err := x.recv(fd, buf)
		if err != nil || string(buf[:n]) != "hello" {
			t.Fatalf("read %q, %v", buf[:n], err)
		}
		if ts < before || ts > after-int64(4*time.Millisecond) {
			t.Fatalf("stamp %d not at arrival: sent after %d, read at %d", ts, before, after)
		}
	}
}

func TestReceivePathWithSeriesDoesNotAllocate(t *testing.T) {
	l, c := testLoop(t)
	now := time.Now().UnixNano()
	l.serStart, l.serStep = now-int64(time.Second), int64(time.Second)
	l.st.Series = make([]slot, 4)
	stream := serverStream(1, 100, now-int64(time.Millisecond))
	n := testing.AllocsPerRun(200, func() {
		c.ck.Start(0)
		l.frames(c, stream, now)
	})
	if n != 0 {
		t.Fatalf("%v allocs per 100 received frames", n)
	}
	s := l.st.Series[1]
	if s.Frames == 0 || s.Frames != s.Live || s.Lat.N != s.Live || s.Replayed != 0 {
		t.Fatalf("slot %+v", s)
	}
	if p := s.Lat.quantile(0.99); p < 900*time.Microsecond || p > 1100*time.Microsecond {
		t.Fatalf("slot p99 %v, want about 1ms", p)
	}
}

func TestSlotHist(t *testing.T) {
	for _, v := range []uint64{0, 1023, 1024, 1500, 1 << 20, 123456789, 1 << 36, 1 << 40} {
		i := slotIndex(v)
		if i < 0 || i >= slotBuckets || (v >= 1<<slotMinExp && v < 1<<slotMaxExp+1 && (slotLow(i) > v || slotLow(i+1) <= v)) {
			t.Fatalf("value %d in bucket %d [%d, %d)", v, i, slotLow(i), slotLow(i+1))
		}
	}
	var a, b slotHist
	for i := 1; i <= 1000; i++ {
		a.record(int64(i) * int64(time.Microsecond))
		b.record(int64(i) * int64(time.Millisecond))
	}
	if p := a.quantile(0.99); p < 930*time.Microsecond || p > 1050*time.Microsecond {
		t.Fatalf("p99 %v", p)
	}
	a.merge(&b)
	if a.N != 2000 || a.Max != int64(time.Second) {
		t.Fatalf("merged n %d max %d", a.N, a.Max)
	}
	if p := a.quantile(0.5); p > 1100*time.Microsecond {
		t.Fatalf("merged p50 %v", p)
	}
	// the wire form between processes keeps every count and the maximum
	s := []slot{{Sent: 3, Acked: 2, Frames: 9, Closes: 1, Rejoined: 1, Lat: a}, {}}
	back := unpackSlots(packSlots(s))
	if len(back) != 2 || back[0].Lat != a || back[0].Sent != 3 || back[0].Rejoined != 1 {
		t.Fatalf("round trip %+v", back[0])
	}
	m := mergeSlots(nil, back)
	m = mergeSlots(m, back)
	if m[0].Sent != 6 || m[0].Lat.N != 4000 {
		t.Fatalf("merge %+v", m[0])
	}
}

func TestEventsAndWindows(t *testing.T) {
	start := time.Unix(1000, 0)
	path := filepath.Join(t.TempDir(), "ev")
	os.WriteFile(path, []byte("# faults\n1003000000000 redis restart\n1001000000000 warm\n\n"), 0o644)
	evs, err := readEvents(path, start)
	if err != nil || len(evs) != 2 || evs[0].Name != "warm" || evs[0].T != 1 || evs[1].T != 3 {
		t.Fatalf("events %+v %v", evs, err)
	}
	slots := make([]slot, 5)
	for i := range slots {
		slots[i].Sent = uint64(i + 1)
		slots[i].AckLat.record(int64(i+1) * int64(time.Millisecond))
	}
	ws := windows(slots, time.Second, evs)
	if len(ws) != 2 || ws[0].Sent != 2+3 || ws[1].Sent != 4+5 || ws[1].Until != 5 || ws[1].AckP99 < 4.5 {
		t.Fatalf("windows %+v", ws)
	}
	os.WriteFile(path, []byte("soon restart\n"), 0o644)
	if _, err := readEvents(path, start); err == nil {
		t.Fatal("bad line accepted")
	}
}

func TestResumeWire(t *testing.T) {
	epoch, lost, from := joinedResume([]byte(`{"op":"joined","room":"r","seq":9,"epoch":"e1x","recovered":false,"from":4}`))
	if string(epoch) != "e1x" || !lost || from != 4 {
		t.Fatalf("recovered:false: %q %v %d", epoch, lost, from)
	}
	if epoch, lost, _ := joinedResume([]byte(`{"op":"joined","room":"r","seq":9,"epoch":"E","recovered":true}`)); string(epoch) != "E" || lost {
		t.Fatalf("recovered:true: %q %v", epoch, lost)
	}
	if retryHint([]byte("retry=1234")) != 1234e6 || retryHint([]byte("shutting down")) != 0 || retryHint([]byte("retry=")) != 0 {
		t.Fatal("retry hint")
	}
	f := rejoinFrame([]byte("r0"), 41, []byte("E7"), [4]byte{1, 2, 3, 4})
	h, hn, err := proto.ParseFrameHeader(f)
	if err != nil || !h.Masked {
		t.Fatal(err)
	}
	payload := append([]byte(nil), f[hn:]...)
	proto.Unmask(payload, h.Mask)
	var cmd proto.Command
	if err := proto.Decode(payload, &cmd); err != nil || cmd.Op != proto.OpJoin || !cmd.HasSince || cmd.Since != 41 || !bytes.Contains(payload, []byte(`"epoch":"E7"`)) {
		t.Fatalf("node reads %s as %+v: %v", payload, cmd, err)
	}
}

func TestTargets(t *testing.T) {
	ts, err := parseTargets("p99<=15ms, delivery>=100, rss<=300MB, ack-p95<=0.5s, node-cpu<=80")
	if err != nil || len(ts) != 5 || ts[3].bound != 500 || math.Abs(ts[2].bound-286.1) > 0.1 {
		t.Fatalf("%+v %v", ts, err)
	}
	r := LevelResult{Latency: Percentiles{P99: 12 * time.Millisecond}, DeliveryPct: 99.9,
		AckLatency: Percentiles{P95: 600 * time.Millisecond},
		Nodes:      []NodeUsage{{RSS: 100 << 20, CPUPct: 50}, {RSS: 150 << 20, CPUPct: 90}}}
	got := judge(ts, r)
	want := []bool{true, false, true, false, false}
	for i, g := range got {
		if g.Met != want[i] {
			t.Errorf("%s: got %v met %v", g.Target, g.Got, g.Met)
		}
	}
	if got[2].Got != 250 || got[4].Got != 90 {
		t.Errorf("rss %v cpu %v", got[2].Got, got[4].Got)
	}
	for _, bad := range []string{"p99=15ms", "bogus<=1", "p99<=fast"} {
		if _, err := parseTargets(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// A rejoin answered recovered:false restarts the member's checker at from
// and counts the seqs it was told it will not get, so they are not gaps.
func TestRejoinRecoveredFalse(t *testing.T) {
	l, c := testLoop(t)
	l.e.targets = []target{{}}
	now := time.Now().UnixNano()
	l.frames(c, serverStream(1, 5, now), now)
	c.away, c.state = true, stJoining
	c.inflight[3] = sendSlot{id: 3, t: now, size: 100} // unacked: sent again on rejoin
	c.spec.publish = true
	joined := []byte(`{"op":"joined","room":"r0","seq":20,"epoch":"E2","recovered":false,"from":12}`)
	l.frames(c, appendServerText(nil, joined), now)
	if len(l.st.Errors) > 0 {
		t.Fatalf("errors %v", l.st.Errors)
	}
	if c.state != stReady || l.st.Unrecov != 1 || l.st.ToldLost != 6 || string(c.epoch) != "E2" || l.st.Rejoins != 1 || l.st.Resent != 1 {
		t.Fatalf("state %d unrecov %d told lost %d epoch %q rejoins %d resent %d", c.state, l.st.Unrecov, l.st.ToldLost, c.epoch, l.st.Rejoins, l.st.Resent)
	}
	l.frames(c, serverStream(12, 9, now), now)
	if !c.ck.Clean() || c.ck.Last() != 20 {
		t.Fatalf("after the replay from 12: last %d gaps %d", c.ck.Last(), c.ck.Gaps)
	}
	// the resent publish carries its first id and stamp
	h, hn, err := proto.ParseFrameHeader(c.out)
	if err != nil {
		t.Fatal(err)
	}
	payload := append([]byte(nil), c.out[hn:hn+int(h.Length)]...)
	proto.Unmask(payload, h.Mask)
	var cmd proto.Command
	if err := proto.Decode(payload, &cmd); err != nil || string(cmd.ID) != "3" || bodyStamp(cmd.Body) != now {
		t.Fatalf("resent %s: %v", payload, err)
	}
}

// A publish answered err overloaded is sent again with its id after a
// short wait, with or without --reconnect: a client retries what the
// node refused for now.
func TestOverloadedPublishSentAgain(t *testing.T) {
	l, c := testLoop(t)
	now := time.Now().UnixNano()
	l.appendPub(c, now)
	c.out = c.out[:0]
	l.frames(c, appendServerText(nil, []byte(`{"op":"err","ref":"1","code":"overloaded","message":"busy"}`)), now)
	if l.st.Errors["overloaded"] != 1 || len(l.resendq) != 1 {
		t.Fatalf("errors %v resend queue %d", l.st.Errors, len(l.resendq))
	}
	l.resendDue(now) // too early
	if len(c.out) != 0 {
		t.Fatal("sent again at once")
	}
	l.resendDue(now + int64(time.Second))
	if l.st.Resent != 1 || len(c.out) == 0 || !c.inflight[1].resent {
		t.Fatalf("resent %d, %d bytes out", l.st.Resent, len(c.out))
	}
	l.frames(c, appendServerText(nil, []byte(`{"op":"ack","id":"1","room":"r0","seq":1}`)), now+int64(2*time.Second))
	if l.st.Acked != 1 {
		t.Fatalf("acked %d", l.st.Acked)
	}
}

func TestSSEMsgFast(t *testing.T) {
	ev := "event: msg\ndata: {\"op\":\"msg\"}\nid: r:1\n\n"
	for _, tc := range []struct {
		in   string
		data string
		n    int
	}{
		{ev + "x", `{"op":"msg"}`, len(ev)},
		{"event: msg\ndata: {}\n\n", `{}`, len("event: msg\ndata: {}\n\n")},
		{ev[:len(ev)-1], "", 0},
		{"event: msg\ndata: {", "", 0},
		{"event: joined\ndata: {}\n\n", "", 0},
		{"event: msg\ndata: a\ndata: b\n\n", "", 0},
	} {
		data, n := sseMsgFast([]byte(tc.in))
		if string(data) != tc.data || n != tc.n {
			t.Errorf("%q: %q %d, want %q %d", tc.in, data, n, tc.data, tc.n)
		}
	}
}

func TestPGProcessOf(t *testing.T) {
	keep := pgProcessOf("roost_a")
	for _, c := range []struct {
		title string
		want  bool
	}{
		{"/usr/lib/postgresql/15/bin/postgres\x00-D\x00/var/lib/postgresql/15/main\x00", true},
		{"postgres: 15/main: checkpointer                 ", true},
		{"postgres: 15/main: walwriter ", true},
		{"postgres: 15/main: postgres roost_a 127.0.0.1(51234) idle", true},
		{"postgres: 15/main: postgres roost_b 127.0.0.1(51236) COMMIT", false},
		{"postgres: postgres roost_a [local] idle", true},
		{"postgres: root test [local] SELECT", false},
		{"postgres: background writer   ", true},
	} {
		if got := keep([]byte(c.title)); got != c.want {
			t.Errorf("%q: kept %v, want %v", c.title, got, c.want)
		}
	}
}
