//go:build linux

package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"
)

// kindsBench is `roost bench kinds`, the figures of messages that change
// (issue 27) through a node:
//
//   - --mode react: --users connections (one user each) react to the
//     --messages newest messages of one hot room (posted first by the
//     bench) at --rate reactions per second for --for, each user on each
//     message reacting and taking it back in turn, so that every reaction
//     is stored; --mode msg sends plain messages the same way, the
//     baseline. It reports the ack latency (send to ack, per publish), the
//     errors, and the CPU of the node (--node-pid) and of PostgreSQL
//     (--pg-db: the server's processes and that database's backends) per
//     publish acked.
//   - --mode fold: --conns connections each send `history` requests with
//     "fold":true and --limit, one at a time, before a random seq of the
//     room (which must exist: see docs/bench-notes), --requests in all,
//     and it reports their latency, request to answer.
type kindsParams struct {
	url, app, room, mode, pgDB string
	nodePID                    int
	users, messages, conns     int
	requests, limit            int
	rate                       float64
	dur                        time.Duration
	jsonOut, plain             bool
}

// KindsReport is what `roost bench kinds` prints (--json).
type KindsReport struct {
	Mode     string      `json:"mode"`
	Sent     int64       `json:"sent"`
	Acked    int64       `json:"acked"`
	Errors   int64       `json:"errors"`
	FirstErr string      `json:"first_error,omitempty"`
	Seconds  float64     `json:"seconds"`
	Rate     float64     `json:"rate"` // acks (or answers) per second
	Latency  Percentiles `json:"latency"`
	Messages int64       `json:"messages_listed,omitempty"` // fold: messages in all answers
	NodeUS   float64     `json:"node_us_per_op,omitempty"`
	PGUS     float64     `json:"pg_us_per_op,omitempty"`
	PGProcs  int         `json:"pg_processes,omitempty"`
}

func kindsBench(args []string, stdout, stderr io.Writer) int {
	var p kindsParams
	fs := modeFlags("kinds", stderr)
	fs.StringVar(&p.mode, "mode", "react", "react (reactions), msg (plain publishes, the baseline) or fold (folded history reads)")
	fs.StringVar(&p.url, "url", "ws://127.0.0.1:8080/ws", "the node's WebSocket URL (insecure mode: ?user=&app= is added)")
	fs.StringVar(&p.app, "app", "bench", "app id")
	fs.StringVar(&p.room, "room", "hot", "the room")
	fs.IntVar(&p.users, "users", 100, "react/msg: publishing connections, one user each")
	fs.IntVar(&p.messages, "messages", 10, "react: messages posted first, the ones reacted to")
	fs.Float64Var(&p.rate, "rate", 5000, "react/msg: publishes per second, all users")
	fs.DurationVar(&p.dur, "for", 10*time.Second, "react/msg: how long to publish")
	fs.IntVar(&p.conns, "conns", 4, "fold: connections, one request in flight each")
	fs.IntVar(&p.requests, "requests", 3000, "fold: requests in all")
	fs.IntVar(&p.limit, "limit", 50, "fold: messages per page")
	fs.BoolVar(&p.plain, "plain", false, "fold: plain history requests (no \"fold\"), the baseline")
	fs.StringVar(&p.pgDB, "pg-db", "", "PostgreSQL database the node uses, for PostgreSQL's CPU (this host's postgres processes)")
	fs.IntVar(&p.nodePID, "node-pid", 0, "the node's process id, for its CPU")
	fs.BoolVar(&p.jsonOut, "json", false, "print the report as JSON")
	if code, ok := parseMode(fs, args); !ok {
		return code
	}
	var rep *KindsReport
	var err error
	switch p.mode {
	case "react", "msg":
		if p.users < 1 || p.users > 5000 || p.messages < 1 || p.rate <= 0 || p.dur <= 0 {
			fmt.Fprintln(stderr, "roost bench kinds: --users 1..5000, --messages ≥ 1, --rate > 0 and --for > 0")
			return 2
		}
		rep, err = kindsPublish(&p)
	case "fold":
		if p.conns < 1 || p.conns > 1000 || p.requests < 1 || p.limit < 1 || p.limit > 1000 {
			fmt.Fprintln(stderr, "roost bench kinds: --conns 1..1000, --requests ≥ 1, --limit 1..1000")
			return 2
		}
		rep, err = kindsFold(&p)
	default:
		fmt.Fprintf(stderr, "roost bench kinds: --mode %q: react, msg or fold\n", p.mode)
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "roost bench kinds: %v\n", err)
		return 1
	}
	if p.jsonOut {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
	} else {
		l := rep.Latency
		fmt.Fprintf(stdout, "%s: %d sent, %d acked or answered (%.0f/s over %.1fs), %d errors %s\n",
			rep.Mode, rep.Sent, rep.Acked, rep.Rate, rep.Seconds, rep.Errors, rep.FirstErr)
		fmt.Fprintf(stdout, "latency p50 %v p90 %v p99 %v p99.9 %v max %v\n", l.P50, l.P90, l.P99, l.P999, l.Max)
		if rep.NodeUS > 0 || rep.PGUS > 0 {
			fmt.Fprintf(stdout, "CPU per op: node %.1f µs, PostgreSQL %.1f µs (%d processes)\n", rep.NodeUS, rep.PGUS, rep.PGProcs)
		}
	}
	if rep.Errors > 0 || rep.Acked < rep.Sent {
		return 1
	}
	return 0
}

// kindsConn is one bench connection: writes under mu, one reader.
type kindsConn struct {
	mu sync.Mutex
	c  net.Conn
	bw *bufio.Writer
	rd wsutil.Reader
}

func kindsDial(p *kindsParams, user string) (*kindsConn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sep := "?"
	if strings.Contains(p.url, "?") {
		sep = "&"
	}
	c, br, _, err := ws.Dial(ctx, p.url+sep+"user="+user+"&app="+p.app)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", p.url, err)
	}
	if br == nil {
		br = bufio.NewReader(c)
	}
	return &kindsConn{c: c, bw: bufio.NewWriterSize(c, 32<<10), rd: wsutil.Reader{Source: br, State: ws.StateClientSide}}, nil
}

// next reads the next text frame.
func (k *kindsConn) next() ([]byte, error) {
	for {
		h, err := k.rd.NextFrame()
		if err != nil {
			return nil, err
		}
		b, err := io.ReadAll(&k.rd)
		if err != nil {
			return nil, err
		}
		if h.OpCode == ws.OpText {
			return b, nil
		}
	}
}

// send writes frames and flushes them.
func (k *kindsConn) send(frames ...[]byte) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, f := range frames {
		if err := wsutil.WriteClientText(k.bw, f); err != nil {
			return err
		}
	}
	return k.bw.Flush()
}

// kindsFrame is the part of a server frame the bench reads.
type kindsFrame struct {
	Op       string            `json:"op"`
	ID       string            `json:"id"`
	Seq      uint64            `json:"seq"`
	Code     string            `json:"code"`
	Messages []json.RawMessage `json:"messages"`
	More     bool              `json:"more"`
}

func (p *kindsParams) cpu() (node, pg time.Duration, procs int) {
	if p.nodePID > 0 {
		node, _ = procCPU(p.nodePID)
	}
	if p.pgDB != "" {
		pg, procs, _ = commCPU("postgres", pgProcessOf(p.pgDB))
	}
	return
}

func kindsPublish(p *kindsParams) (*KindsReport, error) {
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	// The messages reacted to.
	seed, err := kindsDial(p, "author")
	if err != nil {
		return nil, err
	}
	defer seed.c.Close()
	refs := make([]uint64, p.messages)
	for i := range refs {
		f := fmt.Appendf(nil, `{"op":"pub","room":%q,"id":"s%s-%d","body":{"text":"a message of some fifty bytes, as chat has"}}`, p.room, run, i)
		if err := seed.send(f); err != nil {
			return nil, err
		}
		b, err := seed.next()
		if err != nil {
			return nil, err
		}
		var a kindsFrame
		if json.Unmarshal(b, &a) != nil || a.Op != "ack" || a.Seq == 0 {
			return nil, fmt.Errorf("seed message: %s", b)
		}
		refs[i] = a.Seq
	}
	conns := make([]*kindsConn, p.users)
	for i := range conns {
		if conns[i], err = kindsDial(p, "u"+strconv.Itoa(i)); err != nil {
			return nil, err
		}
		defer conns[i].c.Close()
	}
	var sent, acked, errs atomic.Int64
	var firstErr atomic.Value
	var hmu sync.Mutex
	var hist Hist
	const ring = 1 << 16
	per := p.rate / float64(p.users)
	start := time.Now().Add(100 * time.Millisecond)
	end := start.Add(p.dur)
	node0, pg0, _ := p.cpu()
	var wg sync.WaitGroup
	for _, k := range conns {
		sentAt := make([]atomic.Int64, ring)
		var mine atomic.Int64 // sent and not answered
		wg.Add(2)
		go func() { // reader
			defer wg.Done()
			var h Hist
			defer func() { hmu.Lock(); hist.Merge(&h); hmu.Unlock() }()
			for {
				b, err := k.next()
				if err != nil {
					return
				}
				var f kindsFrame
				if json.Unmarshal(b, &f) != nil {
					errs.Add(1)
					continue
				}
				switch f.Op {
				case "ack":
					n, _ := strconv.ParseUint(f.ID[strings.LastIndexByte(f.ID, '-')+1:], 10, 64)
					h.Record(time.Now().UnixNano() - sentAt[n%ring].Load())
					acked.Add(1)
				case "err":
					firstErr.CompareAndSwap(nil, string(b))
					errs.Add(1)
				default:
					continue
				}
				if mine.Add(-1) == 0 && time.Now().After(end) {
					return
				}
			}
		}()
		go func() { // paced writer: every 5 ms, what is due
			defer wg.Done()
			offset := time.Duration(rand.Int64N(int64(5 * time.Millisecond)))
			time.Sleep(time.Until(start) + offset)
			var n int64
			var frames [][]byte
			for now := time.Now(); now.Before(end); now = time.Now() {
				due := int64(per*now.Sub(start).Seconds()) + 1
				frames = frames[:0]
				for ; n < due; n++ {
					var f []byte
					if p.mode == "msg" {
						f = fmt.Appendf(nil, `{"op":"pub","room":%q,"id":"%s-%d","body":{"text":"a message of some fifty bytes, as chat has"}}`, p.room, run, n)
					} else {
						kind := "react"
						if (n/int64(len(refs)))%2 == 1 { // on each message: react, then take it back
							kind = "unreact"
						}
						f = fmt.Appendf(nil, `{"op":"pub","room":%q,"id":"%s-%d","kind":%q,"ref":%d,"body":"👍"}`, p.room, run, n, kind, refs[n%int64(len(refs))])
					}
					frames = append(frames, f)
					sentAt[n%ring].Store(time.Now().UnixNano())
					mine.Add(1)
					sent.Add(1)
				}
				if len(frames) > 0 {
					if err := k.send(frames...); err != nil {
						errs.Add(1)
						return
					}
				}
				time.Sleep(5 * time.Millisecond)
			}
			if mine.Load() == 0 { // the reader may wait on a frame that never comes
				k.c.SetReadDeadline(time.Now())
			}
		}()
	}
	// Bounded: whatever is not answered 10 s after the end counts as lost.
	go func() {
		time.Sleep(time.Until(end) + 10*time.Second)
		for _, k := range conns {
			k.c.SetReadDeadline(time.Now())
		}
	}()
	wg.Wait()
	node1, pg1, procs := p.cpu()
	secs := time.Since(start).Seconds()
	rep := &KindsReport{Mode: p.mode, Sent: sent.Load(), Acked: acked.Load(), Errors: errs.Load(),
		Seconds: secs, Rate: float64(acked.Load()) / p.dur.Seconds(), Latency: hist.Summary(), PGProcs: procs}
	rep.FirstErr, _ = firstErr.Load().(string)
	if a := float64(rep.Acked); a > 0 {
		rep.NodeUS = float64((node1 - node0).Microseconds()) / a
		rep.PGUS = float64((pg1 - pg0).Microseconds()) / a
	}
	return rep, nil
}

func kindsFold(p *kindsParams) (*KindsReport, error) {
	// The room's newest seq, from a join.
	k0, err := kindsDial(p, "reader0")
	if err != nil {
		return nil, err
	}
	if err := k0.send(fmt.Appendf(nil, `{"op":"join","room":%q}`, p.room)); err != nil {
		return nil, err
	}
	var last uint64
	for last == 0 {
		b, err := k0.next()
		if err != nil {
			return nil, err
		}
		var f kindsFrame
		if json.Unmarshal(b, &f) == nil && f.Op == "joined" {
			last = f.Seq
		} else if f.Op == "err" {
			return nil, fmt.Errorf("join: %s", b)
		}
	}
	k0.c.Close()
	if last < 8*uint64(p.limit) {
		return nil, fmt.Errorf("room %q has %d entries: too few for pages of %d", p.room, last, p.limit)
	}
	var answered, errs, listed atomic.Int64
	var next atomic.Int64
	var hmu sync.Mutex
	var hist Hist
	var wg sync.WaitGroup
	var firstErr atomic.Value
	node0, pg0, _ := p.cpu()
	start := time.Now()
	for i := range p.conns {
		k, err := kindsDial(p, "reader"+strconv.Itoa(i+1))
		if err != nil {
			return nil, err
		}
		defer k.c.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			var h Hist
			defer func() { hmu.Lock(); hist.Merge(&h); hmu.Unlock() }()
			rng := rand.New(rand.NewPCG(uint64(i), 27))
			for next.Add(1) <= int64(p.requests) {
				before := 4*uint64(p.limit) + rng.Uint64N(last-4*uint64(p.limit)) + 1
				t0 := time.Now()
				k.c.SetReadDeadline(t0.Add(10 * time.Second))
				if err := k.send(fmt.Appendf(nil, `{"op":"history","room":%q,"fold":%v,"before":%d,"limit":%d}`, p.room, !p.plain, before, p.limit)); err != nil {
					firstErr.CompareAndSwap(nil, err)
					errs.Add(1)
					return
				}
				b, err := k.next()
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					errs.Add(1)
					return
				}
				h.Record(int64(time.Since(t0)))
				var f kindsFrame
				if json.Unmarshal(b, &f) != nil || f.Op != "history" || len(f.Messages) == 0 {
					firstErr.CompareAndSwap(nil, errors.New(string(b[:min(len(b), 200)])))
					errs.Add(1)
					continue
				}
				answered.Add(1)
				listed.Add(int64(len(f.Messages)))
			}
		}()
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	node1, pg1, procs := p.cpu()
	rep := &KindsReport{Mode: "fold", Sent: int64(p.requests), Acked: answered.Load(), Errors: errs.Load(), Seconds: secs,
		Rate: float64(answered.Load()) / secs, Latency: hist.Summary(), Messages: listed.Load(), PGProcs: procs}
	if e, ok := firstErr.Load().(error); ok {
		rep.FirstErr = e.Error()
	}
	if a := float64(rep.Acked); a > 0 {
		rep.NodeUS = float64((node1 - node0).Microseconds()) / a
		rep.PGUS = float64((pg1 - pg0).Microseconds()) / a
	}
	return rep, nil
}
