//go:build linux

package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"
)

// presenceBench is `roost bench presence`: --users connections (one user
// each) spread over --url and --rooms rooms, held by --procs worker
// processes, and one presence subscriber per room. Once every join has
// been applied, users move from room to room (a leave, then a join of
// another room: one presence join and one presence leave each) at --rate
// moves per second for --for; --reload makes each move a leave and a
// rejoin of the same room (within the grace period: no presence change).
// It reports the nodes' CPU (utime+stime of --node-pids) and Redis's
// commands (INFO commandstats of --redis) per move, after the moves'
// leaves passed --grace, minus the same window with no moves measured
// just before.
type presenceParams struct {
	urls, pids, redis  string
	users, rooms       int
	procs              int
	rate               float64
	dur, grace, settle time.Duration
	reload             bool
	worker             int // -1: the coordinator
	app                string
}

func presenceBench(args []string, stdout, stderr io.Writer) int {
	var p presenceParams
	fs := modeFlags("presence", stderr)
	fs.StringVar(&p.urls, "url", "ws://127.0.0.1:8080/ws", "node WebSocket URLs, comma-separated (insecure mode: ?user=&app= is added)")
	fs.StringVar(&p.pids, "node-pids", "", "the nodes' process ids, comma-separated, for their CPU")
	fs.StringVar(&p.redis, "redis", "", "Redis host:port for INFO commandstats (empty: not measured)")
	fs.IntVar(&p.users, "users", 15000, "connections, one user each")
	fs.IntVar(&p.rooms, "rooms", 100, "rooms")
	fs.IntVar(&p.procs, "procs", 3, "worker processes holding the connections")
	fs.Float64Var(&p.rate, "rate", 200, "moves per second, all workers")
	fs.DurationVar(&p.dur, "for", 20*time.Second, "how long users move")
	fs.DurationVar(&p.grace, "grace", 5*time.Second, "the nodes' --presence-grace: measuring waits this long after the last move")
	fs.DurationVar(&p.settle, "settle", 3*time.Second, "wait after the joins before measuring")
	fs.BoolVar(&p.reload, "reload", false, "each move leaves and rejoins the same room (a reload: no presence change)")
	fs.IntVar(&p.worker, "worker", -1, "internal: run as worker N")
	fs.StringVar(&p.app, "app", "bench", "app id")
	if code, ok := parseMode(fs, args); !ok {
		return code
	}
	if p.worker >= 0 {
		return presenceWorker(&p, os.Stdin, stdout, stderr)
	}
	return presenceCoord(&p, args, stdout, stderr)
}

type presConn struct {
	mu   sync.Mutex
	c    net.Conn
	room int
	busy atomic.Bool
}

func (pc *presConn) send(s string) error {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return wsutil.WriteClientText(pc.c, []byte(s))
}

// presenceWorker holds its share of the users; it answers "ready" once all
// joined, moves users between "go" and the end of --for, then "done
// MOVES DIFFS ENTRIES", and closes everything at "quit" (or EOF).
func presenceWorker(p *presenceParams, in io.Reader, out, stderr io.Writer) int {
	urls := strings.Split(p.urls, ",")
	lo, hi := p.worker*p.users/p.procs, (p.worker+1)*p.users/p.procs
	var moves, diffs, entries, errs atomic.Int64
	var joinedN atomic.Int64
	conns := make([]*presConn, 0, hi-lo)
	dial := func(user string, url string, room int, watch bool) (*presConn, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, br, _, err := ws.Dial(ctx, url+"?user="+user+"&app="+p.app)
		if err != nil {
			return nil, err
		}
		if br == nil {
			br = bufio.NewReader(c)
		}
		pc := &presConn{c: c, room: room}
		go func() {
			rd := wsutil.Reader{Source: br, State: ws.StateClientSide, CheckUTF8: false}
			for {
				h, err := rd.NextFrame()
				if err != nil {
					return
				}
				b, err := io.ReadAll(&rd)
				if err != nil {
					return
				}
				if h.OpCode != ws.OpText {
					continue
				}
				var f struct {
					Op           string
					Joined, Left []string
				}
				if json.Unmarshal(b, &f) != nil {
					errs.Add(1)
					continue
				}
				switch f.Op {
				case "joined":
					if pc.busy.Load() {
						moves.Add(1)
						pc.busy.Store(false)
					} else {
						joinedN.Add(1)
					}
				case "left":
					next := pc.room
					if !p.reload {
						next = (pc.room + 1 + rand.IntN(p.rooms-1)) % p.rooms
					}
					pc.room = next
					if pc.send(fmt.Sprintf(`{"op":"join","room":"r%d"}`, next)) != nil {
						return
					}
				case "presence_diff":
					diffs.Add(1)
					entries.Add(int64(len(f.Joined) + len(f.Left)))
				case "err":
					errs.Add(1)
				}
			}
		}()
		pres := ""
		if watch {
			pres = `,"presence":true`
		}
		return pc, pc.send(fmt.Sprintf(`{"op":"join","room":"r%d"%s}`, room, pres))
	}
	want := int64(hi - lo)
	if p.worker == 0 {
		for r := 0; r < p.rooms; r++ {
			if _, err := dial(fmt.Sprintf("watch%d", r), urls[r%len(urls)], r, true); err != nil {
				fmt.Fprintln(stderr, "worker:", err)
				return 1
			}
		}
		want += int64(p.rooms)
	}
	for k := lo; k < hi; k++ {
		pc, err := dial("u"+strconv.Itoa(k), urls[k%len(urls)], k%p.rooms, false)
		if err != nil {
			fmt.Fprintln(stderr, "worker:", err)
			return 1
		}
		conns = append(conns, pc)
	}
	for end := time.Now().Add(60 * time.Second); joinedN.Load() < want; {
		if time.Now().After(end) {
			fmt.Fprintf(stderr, "worker %d: %d of %d joined\n", p.worker, joinedN.Load(), want)
			return 1
		}
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Fprintln(out, "ready")
	sc := bufio.NewScanner(in)
	if !sc.Scan() || sc.Text() != "go" {
		return 1
	}
	every := time.Duration(float64(time.Second) * float64(p.procs) / p.rate)
	t := time.NewTicker(every)
	for end := time.Now().Add(p.dur); time.Now().Before(end); {
		<-t.C
		pc := conns[rand.IntN(len(conns))]
		if pc.busy.Swap(true) {
			continue // mid-move
		}
		if pc.send(fmt.Sprintf(`{"op":"leave","room":"r%d"}`, pc.room)) != nil {
			errs.Add(1)
		}
	}
	t.Stop()
	time.Sleep(time.Second) // the last moves' answers
	fmt.Fprintf(out, "done %d %d %d %d\n", moves.Load(), diffs.Load(), entries.Load(), errs.Load())
	for sc.Scan() && sc.Text() != "quit" {
		fmt.Fprintf(out, "diffs %d %d\n", diffs.Load(), entries.Load())
	}
	for _, pc := range conns {
		pc.c.Close()
	}
	return 0
}

func presenceCoord(p *presenceParams, args []string, stdout, stderr io.Writer) int {
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	type wk struct {
		cmd *exec.Cmd
		in  io.WriteCloser
		out *bufio.Scanner
	}
	var ws []*wk
	for i := 0; i < p.procs; i++ {
		cmd := exec.Command(exe, append([]string{"bench", "presence", "--worker", strconv.Itoa(i)}, args...)...)
		cmd.Stderr = stderr
		in, _ := cmd.StdinPipe()
		o, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		ws = append(ws, &wk{cmd: cmd, in: in, out: bufio.NewScanner(o)})
	}
	defer func() {
		for _, w := range ws {
			fmt.Fprintln(w.in, "quit")
			w.in.Close()
			_ = w.cmd.Wait()
		}
	}()
	line := func(w *wk) string {
		if !w.out.Scan() {
			return ""
		}
		return w.out.Text()
	}
	t0 := time.Now()
	for i, w := range ws {
		if l := line(w); l != "ready" {
			fmt.Fprintf(stderr, "worker %d: %q\n", i, l)
			return 1
		}
	}
	fmt.Fprintf(stdout, "%d users in %d rooms joined in %s (%d procs)\n", p.users, p.rooms, time.Since(t0).Round(time.Millisecond), p.procs)
	time.Sleep(p.settle)
	window := p.dur + time.Second + p.grace + time.Second
	// The same window without moves: what the nodes and Redis spend idle
	// (ticks, leases) with these connections.
	c0, r0 := presenceSnap(p, stderr)
	time.Sleep(window)
	c1, r1 := presenceSnap(p, stderr)
	for _, w := range ws {
		fmt.Fprintln(w.in, "go")
	}
	var moves, diffs, entries, errs int64
	for i, w := range ws {
		f := strings.Fields(line(w))
		if len(f) != 5 || f[0] != "done" {
			fmt.Fprintf(stderr, "worker %d: %v\n", i, f)
			return 1
		}
		m, _ := strconv.ParseInt(f[1], 10, 64)
		d, _ := strconv.ParseInt(f[2], 10, 64)
		e, _ := strconv.ParseInt(f[3], 10, 64)
		x, _ := strconv.ParseInt(f[4], 10, 64)
		moves, diffs, entries, errs = moves+m, diffs+d, entries+e, errs+x
	}
	time.Sleep(p.grace + time.Second) // the moves' leaves are applied
	c2, r2 := presenceSnap(p, stderr)
	fmt.Fprintln(ws[0].in, "stats")
	if f := strings.Fields(line(ws[0])); len(f) == 3 {
		diffs, _ = strconv.ParseInt(f[1], 10, 64)
		entries, _ = strconv.ParseInt(f[2], 10, 64)
	}
	idleCPU, busyCPU := c1-c0, c2-c1
	idleCmds, busyCmds := r1-r0, r2-r1
	kind := "moves (leave room A, join room B)"
	if p.reload {
		kind = "reloads (leave and rejoin the same room within the grace)"
	}
	fmt.Fprintf(stdout, "%d %s in %s (%.0f/s), %d errors\n", moves, kind, p.dur, float64(moves)/p.dur.Seconds(), errs)
	fmt.Fprintf(stdout, "watchers (one per room): %d presence_diff frames, %d entries\n", diffs, entries)
	if moves > 0 {
		fmt.Fprintf(stdout, "node CPU: %.3fs over %s with moves, %.3fs idle over the same window: %.1f µs per join+leave (net)\n",
			busyCPU.Seconds(), window, idleCPU.Seconds(), float64((busyCPU-idleCPU).Microseconds())/float64(moves))
		if p.redis != "" {
			fmt.Fprintf(stdout, "redis commands (those scripts run included): %d with moves, %d idle: %.3f per join+leave (net)\n",
				busyCmds, idleCmds, float64(busyCmds-idleCmds)/float64(moves))
			if len(lastStats) == 3 {
				s0, s1, s2 := lastStats[0], lastStats[1], lastStats[2]
				fmt.Fprintf(stdout, "  per join+leave, net of idle:")
				for _, k := range []string{"evalsha", "publish", "sadd", "srem", "hincrby", "hdel", "exists", "scard", "zadd", "zscore", "zrangebyscore", "smembers"} {
					if d := (s2[k] - s1[k]) - (s1[k] - s0[k]); d != 0 {
						fmt.Fprintf(stdout, " %s %.3f", k, float64(d)/float64(moves))
					}
				}
				fmt.Fprintln(stdout)
			}
		}
	}
	return 0
}

// presenceSnap reads the nodes' CPU and Redis's command count.
func presenceSnap(p *presenceParams, stderr io.Writer) (time.Duration, int64) {
	cpu, stats := presenceSnapAll(p, stderr)
	return cpu, stats[""]
}

// lastStats are the per-command calls of the latest snapshot ("" is the
// total), for the breakdown.
var lastStats []map[string]int64

func presenceSnapAll(p *presenceParams, stderr io.Writer) (time.Duration, map[string]int64) {
	var cpu time.Duration
	for _, s := range strings.Split(p.pids, ",") {
		if s == "" {
			continue
		}
		pid, _ := strconv.Atoi(s)
		c, err := procCPU(pid)
		if err != nil {
			fmt.Fprintln(stderr, "node cpu:", err)
		}
		cpu += c
	}
	if p.redis == "" {
		return cpu, map[string]int64{}
	}
	n, err := redisCalls(p.redis)
	if err != nil {
		fmt.Fprintln(stderr, "redis:", err)
	}
	lastStats = append(lastStats, n)
	return cpu, n
}

// redisCalls reads calls= of INFO commandstats per command, less the INFO
// itself; "" is their sum. Commands that scripts run are counted too.
func redisCalls(addr string) (map[string]int64, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, "INFO commandstats\r\n"); err != nil {
		return nil, err
	}
	br := bufio.NewReader(c)
	hdr, err := br.ReadString('\n')
	if err != nil || len(hdr) < 2 || hdr[0] != '$' {
		return nil, fmt.Errorf("INFO answered %q (%v)", hdr, err)
	}
	size, _ := strconv.Atoi(strings.TrimSpace(hdr[1:]))
	body := make([]byte, size)
	if _, err := io.ReadFull(br, body); err != nil {
		return nil, err
	}
	out := map[string]int64{}
	var total int64
	for _, l := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(l, "cmdstat_") || strings.HasPrefix(l, "cmdstat_info:") {
			continue
		}
		if i := strings.Index(l, "calls="); i >= 0 {
			v := l[i+6:]
			if j := strings.IndexByte(v, ','); j >= 0 {
				v = v[:j]
			}
			n, _ := strconv.ParseInt(v, 10, 64)
			total += n
			out[strings.TrimPrefix(l[:strings.IndexByte(l, ':')], "cmdstat_")] = n
		}
	}
	out[""] = total
	return out, nil
}
