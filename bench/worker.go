//go:build linux

package bench

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The parent and its workers speak JSON lines: a worker connects its share
// and says ready; the parent then sends commands to all workers at once and
// reads one answer from each. Every worker times its own windows from the
// moment it reads the command, so windows line up within a pipe write.

type workerCmd struct {
	Cmd    string  `json:"cmd"` // level, snapshot, quit
	Rate   float64 `json:"rate,omitempty"`
	Verify bool    `json:"verify,omitempty"`
	Start  int64   `json:"start,omitempty"` // Unix ns
}

type workerMsg struct {
	Ready    bool        `json:"ready,omitempty"`
	Error    string      `json:"error,omitempty"`
	Stats    *levelStats `json:"stats,omitempty"`
	Lat      *histJSON   `json:"lat,omitempty"`
	AckLat   *histJSON   `json:"ack_lat,omitempty"`
	BenchCPU int64       `json:"bench_cpu_ns,omitempty"`
	Series   []slotJSON  `json:"series,omitempty"`
}

func statsMsg(st *levelStats, cpu time.Duration) workerMsg {
	lat, ack := st.Lat.toJSON(), st.AckLat.toJSON()
	return workerMsg{Stats: st, Lat: &lat, AckLat: &ack, BenchCPU: int64(cpu), Series: packSlots(st.Series)}
}

func runWorker(p *params, pl *plan, targets []target, sources []unix.SockaddrInet4, stdin io.Reader, stdout, stderr io.Writer) int {
	d := &localDriver{p: p, specs: pl.share(p.workerIndex, p.workerCount), fixedDrain: true,
		targets: targets, sources: sources, rooms: pl.rooms}
	defer d.close()
	enc := json.NewEncoder(stdout)
	if err := d.connect(); err != nil {
		_ = enc.Encode(workerMsg{Error: err.Error()})
		return 1
	}
	if err := enc.Encode(workerMsg{Ready: true}); err != nil {
		return 1
	}
	sc := bufio.NewScanner(stdin)
	for sc.Scan() {
		var cmd workerCmd
		if err := json.Unmarshal(sc.Bytes(), &cmd); err != nil {
			fmt.Fprintf(stderr, "roost bench worker: bad command: %v\n", err)
			return 1
		}
		var msg workerMsg
		switch cmd.Cmd {
		case "level":
			st, cpu, err := d.level(cmd.Rate, cmd.Verify, time.Unix(0, cmd.Start), nil)
			if err != nil {
				msg.Error = err.Error()
			} else {
				msg = statsMsg(st, cpu)
			}
		case "snapshot":
			st, _ := d.snapshot()
			msg = statsMsg(st, 0)
		case "quit":
			return 0
		default:
			msg.Error = "unknown command " + cmd.Cmd
		}
		if err := enc.Encode(msg); err != nil {
			return 1
		}
	}
	return 0
}

// procsDriver runs the plan in worker processes of this executable.
type procsDriver struct {
	p       *params
	workers []*workerProc
}

type workerProc struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func startWorkers(p *params, args []string, stderr io.Writer) (*procsDriver, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("cannot find own executable for --procs: %w", err)
	}
	d := &procsDriver{p: p}
	// every worker's stderr is copied by its own goroutine into one writer
	errw := &lockedWriter{w: stderr}
	for i := 0; i < p.procs; i++ {
		wargs := append([]string{"bench", workerArg, p.scenario}, args...)
		wargs = append(wargs, "--procs=1", "--json=false", "--plot=", "--pid=0", "--pg=false",
			"--worker-index="+strconv.Itoa(i), "--worker-count="+strconv.Itoa(p.procs), "--run-id="+p.runID)
		cmd := exec.Command(exe, wargs...)
		cmd.Env = append(os.Environ(), WorkerEnv+"=1")
		cmd.Stderr = errw
		in, err := cmd.StdinPipe()
		if err != nil {
			d.close()
			return nil, fmt.Errorf("cannot start worker: %w", err)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			d.close()
			return nil, fmt.Errorf("cannot start worker: %w", err)
		}
		if err := cmd.Start(); err != nil {
			d.close()
			return nil, fmt.Errorf("cannot start worker: %w", err)
		}
		s := bufio.NewScanner(out)
		s.Buffer(make([]byte, 64<<10), 64<<20)
		d.workers = append(d.workers, &workerProc{cmd: cmd, in: in, out: s})
	}
	return d, nil
}

func (w *workerProc) read() (workerMsg, error) {
	var m workerMsg
	if !w.out.Scan() {
		if err := w.out.Err(); err != nil {
			return m, fmt.Errorf("cannot read from worker: %w", err)
		}
		return m, errors.New("worker exited")
	}
	if err := json.Unmarshal(w.out.Bytes(), &m); err != nil {
		return m, fmt.Errorf("cannot decode worker message: %w", err)
	}
	if m.Error != "" {
		return m, errors.New("worker: " + m.Error)
	}
	return m, nil
}

// all reads one message from every worker concurrently.
func (d *procsDriver) all() ([]workerMsg, error) {
	msgs := make([]workerMsg, len(d.workers))
	errs := make([]error, len(d.workers))
	var wg sync.WaitGroup
	for i, w := range d.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msgs[i], errs[i] = w.read()
		}()
	}
	wg.Wait()
	return msgs, errors.Join(errs...)
}

func (d *procsDriver) send(c workerCmd) error {
	b, _ := json.Marshal(c)
	b = append(b, '\n')
	for _, w := range d.workers {
		if _, err := w.in.Write(b); err != nil {
			return fmt.Errorf("cannot command worker: %w", err)
		}
	}
	return nil
}

func (d *procsDriver) connect() error {
	_, err := d.all()
	return err
}

func (d *procsDriver) merge(msgs []workerMsg) (*levelStats, time.Duration) {
	total := newLevelStats()
	var cpu time.Duration
	for _, m := range msgs {
		if m.Stats == nil {
			continue
		}
		if m.Lat != nil {
			m.Stats.Lat.fromJSON(*m.Lat)
		}
		if m.AckLat != nil {
			m.Stats.AckLat.fromJSON(*m.AckLat)
		}
		m.Stats.Series = unpackSlots(m.Series)
		if m.Stats.Closes == nil {
			m.Stats.Closes = map[int]uint64{}
		}
		if m.Stats.Errors == nil {
			m.Stats.Errors = map[string]uint64{}
		}
		total.merge(m.Stats)
		cpu += time.Duration(m.BenchCPU)
	}
	return total, cpu
}

func (d *procsDriver) level(rate float64, verify bool, start time.Time, mark func(bool)) (*levelStats, time.Duration, error) {
	if err := d.send(workerCmd{Cmd: "level", Rate: rate, Verify: verify, Start: start.UnixNano()}); err != nil {
		return nil, 0, err
	}
	if mark != nil {
		time.Sleep(time.Until(start.Add(d.p.warmup)))
		mark(false)
		time.Sleep(time.Until(start.Add(d.p.warmup + d.p.duration)))
		mark(true)
	}
	msgs, err := d.all()
	if err != nil {
		return nil, 0, err
	}
	st, cpu := d.merge(msgs)
	return st, cpu, nil
}

func (d *procsDriver) snapshot() (*levelStats, error) {
	if err := d.send(workerCmd{Cmd: "snapshot"}); err != nil {
		return nil, err
	}
	msgs, err := d.all()
	if err != nil {
		return nil, err
	}
	st, _ := d.merge(msgs)
	return st, nil
}

func (d *procsDriver) close() {
	_ = d.send(workerCmd{Cmd: "quit"})
	for _, w := range d.workers {
		w.in.Close()
		done := make(chan struct{})
		go func() {
			_ = w.cmd.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = w.cmd.Process.Kill()
			<-done
		}
	}
}

// lockedWriter serialises writes from several goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
