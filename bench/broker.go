//go:build linux

package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/roost-chat/roost/pubsub"
)

// brokerBench is `roost bench broker`: what Redis spends to carry one
// message to each node that holds its room, measured with the node's own
// broker code (pubsub.Redis) and no node. --nodes brokers, each subscribed
// as a node with members in every one of --rooms rooms, and the first of
// them publishing --rate pre-encoded frames a second through PublishBatch
// in batches every --batch, as a node's commit path hands them over. It
// reports Redis's CPU (INFO cpu: used_cpu_user + used_cpu_sys, whatever
// machine Redis runs on) per message and per message per subscribing
// node, and checks that every node got every message.
type brokerParams struct {
	redisURL string
	nodes    int
	rooms    int
	rate     float64
	size     int
	batch    time.Duration
	warmup   time.Duration
	dur      time.Duration
	json     bool
}

// BrokerResult is the outcome of one broker run (--json prints it).
type BrokerResult struct {
	Nodes          int     `json:"nodes"`
	Rooms          int     `json:"rooms"`
	Offered        float64 `json:"offered_per_s"`
	Published      int64   `json:"published"`
	Window         float64 `json:"window_s"`
	Delivered      int64   `json:"delivered"`      // over every node, in the window
	Missing        int64   `json:"missing"`        // published × nodes − delivered, after the drain
	PublishErrors  int64   `json:"publish_errors"` // batches' failed publications
	RedisCPU       float64 `json:"redis_cpu_s"`
	RedisPerMsg    float64 `json:"redis_us_per_msg"`
	RedisPerMsgSub float64 `json:"redis_us_per_msg_per_node"`
	RedisCores     float64 `json:"redis_cores"`
	BenchCPU       float64 `json:"bench_cpu_s"`
}

func brokerBench(args []string, stdout, stderr io.Writer) int {
	var p brokerParams
	fs := modeFlags("broker", stderr)
	fs.StringVar(&p.redisURL, "redis-url", "redis://127.0.0.1:6379", "Redis (or a Redis Cluster) as the nodes' --redis-url; the run uses a prefix of its own")
	fs.IntVar(&p.nodes, "nodes", 8, "brokers subscribing as nodes (1 to 64)")
	fs.IntVar(&p.rooms, "rooms", 100, "rooms; every node subscribes to each")
	fs.Float64Var(&p.rate, "rate", 5000, "messages published per second")
	fs.IntVar(&p.size, "size", 200, "bytes per message frame")
	fs.DurationVar(&p.batch, "batch", 10*time.Millisecond, "how often the publisher hands a batch to the broker (a commit's period)")
	fs.DurationVar(&p.warmup, "warmup", 2*time.Second, "publishing before the measured window")
	fs.DurationVar(&p.dur, "for", 10*time.Second, "the measured window")
	fs.BoolVar(&p.json, "json", false, "print the result as JSON")
	if code, ok := parseMode(fs, args); !ok {
		return code
	}
	if p.nodes < 1 || p.nodes > 64 || p.rooms < 1 || p.rate <= 0 || p.size < 64 || p.batch <= 0 || p.dur <= 0 {
		fmt.Fprintln(stderr, "roost bench broker: --nodes 1 to 64, --rooms ≥ 1, --rate > 0, --size ≥ 64, --batch and --for > 0")
		return 2
	}
	res, err := runBroker(context.Background(), p, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "roost bench broker: %v\n", err)
		return 1
	}
	if p.json {
		_ = json.NewEncoder(stdout).Encode(res)
	} else {
		fmt.Fprintf(stdout, "broker: %d nodes × %d rooms, %.0f msg/s offered, %d published in %.1fs, %d delivered (%d missing), %d publish errors\n",
			res.Nodes, res.Rooms, res.Offered, res.Published, res.Window, res.Delivered, res.Missing, res.PublishErrors)
		fmt.Fprintf(stdout, "redis: %.3f CPU-s = %.2f cores; %.2f µs per message, %.3f µs per message per subscribing node\n",
			res.RedisCPU, res.RedisCores, res.RedisPerMsg, res.RedisPerMsgSub)
		fmt.Fprintf(stdout, "bench: %.3f CPU-s\n", res.BenchCPU)
	}
	if res.Missing != 0 || res.PublishErrors != 0 {
		return 1
	}
	return 0
}

type countingHandler struct{ n atomic.Int64 }

func (h *countingHandler) OnMessage(string, uint64, []byte) { h.n.Add(1) }
func (h *countingHandler) OnReset()                         {}

func runBroker(ctx context.Context, p brokerParams, stderr io.Writer) (BrokerResult, error) {
	res := BrokerResult{Nodes: p.nodes, Rooms: p.rooms, Offered: p.rate}
	cfg, err := pubsub.ParseRedisURL(p.redisURL)
	if err != nil {
		return res, err
	}
	cfg.Prefix = "roostbench" + strconv.FormatInt(time.Now().UnixNano(), 36)
	log := slog.New(slog.DiscardHandler)
	handlers := make([]*countingHandler, p.nodes)
	brokers := make([]*pubsub.Redis, p.nodes)
	defer func() {
		for _, b := range brokers {
			if b != nil {
				_ = b.Close()
			}
		}
	}()
	for i := range brokers {
		handlers[i] = &countingHandler{}
		if brokers[i], err = pubsub.NewRedis(ctx, cfg, handlers[i], log); err != nil {
			return res, err
		}
	}
	keys := make([]string, p.rooms)
	for i := range keys {
		keys[i] = "bench/r" + strconv.Itoa(i)
	}
	ready := make(chan error, p.nodes*p.rooms)
	for _, b := range brokers {
		for _, k := range keys {
			b.Subscribe(k, func(err error) { ready <- err })
		}
	}
	timeout := time.After(30 * time.Second)
	for range p.nodes * p.rooms {
		select {
		case err := <-ready:
			if err != nil {
				return res, fmt.Errorf("subscribe: %w", err)
			}
		case <-timeout:
			return res, errors.New("subscriptions not confirmed within 30s")
		}
	}

	info, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: cfg.Addrs, Username: cfg.Username, Password: cfg.Password, DisableCache: true})
	if err != nil {
		return res, err
	}
	defer info.Close()

	// One frame per room, a msg of the size asked, encoded once: the
	// broker carries bytes, their content costs Redis nothing more.
	frames := make([][]byte, p.rooms)
	for i, k := range keys {
		head := `{"op":"msg","room":"` + k[strings.IndexByte(k, '/')+1:] + `","seq":1,"id":"b","from":"bench","ts":1,"body":"`
		frames[i] = []byte(head + strings.Repeat("x", max(0, p.size-len(head)-2)) + `"}`)
	}
	pub := brokers[0]
	var published, pubErrs atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(p.batch)
		defer t.Stop()
		start := time.Now()
		var sent int64
		var seq uint64
		var pubs []pubsub.Publication
		var errs []error
		for {
			select {
			case <-stop:
				return
			case now := <-t.C:
				due := int64(p.rate * now.Sub(start).Seconds())
				n := int(due - sent)
				if n <= 0 {
					continue
				}
				pubs, errs = pubs[:0], errs[:0]
				for range n {
					seq++
					r := int(seq % uint64(p.rooms))
					pubs = append(pubs, pubsub.Publication{Key: keys[r], Seq: seq, Frame: frames[r]})
					errs = append(errs, nil)
				}
				bctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				failed := pub.PublishBatch(bctx, pubs, errs)
				cancel()
				sent += int64(n)
				published.Add(int64(n - failed))
				pubErrs.Add(int64(failed))
			}
		}
	}()

	select {
	case <-time.After(p.warmup):
	case <-ctx.Done():
	}
	cpu0, err := redisCPU(ctx, info)
	if err != nil {
		close(stop)
		<-done
		return res, err
	}
	pub0 := published.Load()
	del0 := delivered(handlers)
	self0 := selfCPU()
	t0 := time.Now()
	select {
	case <-time.After(p.dur):
	case <-ctx.Done():
	}
	cpu1, err := redisCPU(ctx, info)
	window := time.Since(t0)
	pub1 := published.Load()
	del1 := delivered(handlers)
	self1 := selfCPU()
	close(stop)
	<-done
	if err != nil {
		return res, err
	}
	// Let what is on its way arrive, then count what never did.
	want := published.Load() * int64(p.nodes)
	for deadline := time.Now().Add(5 * time.Second); delivered(handlers) < want && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}

	msgs := float64(pub1 - pub0)
	res.Published = pub1 - pub0
	res.Window = window.Seconds()
	res.Delivered = del1 - del0
	res.Missing = want - delivered(handlers)
	res.PublishErrors = pubErrs.Load()
	res.RedisCPU = cpu1 - cpu0
	res.RedisCores = res.RedisCPU / window.Seconds()
	if msgs > 0 {
		res.RedisPerMsg = res.RedisCPU / msgs * 1e6
		res.RedisPerMsgSub = res.RedisPerMsg / float64(p.nodes)
	}
	res.BenchCPU = (self1 - self0).Seconds()
	return res, nil
}

func delivered(hs []*countingHandler) int64 {
	var n int64
	for _, h := range hs {
		n += h.n.Load()
	}
	return n
}

// redisCPU is the server's own CPU seconds (user + sys) from INFO cpu: on
// a Redis Cluster, the sum over the masters the client knows.
func redisCPU(ctx context.Context, c rueidis.Client) (float64, error) {
	var total float64
	for _, node := range c.Nodes() {
		s, err := node.Do(ctx, node.B().Info().Section("cpu").Build()).ToString()
		if err != nil {
			return 0, fmt.Errorf("INFO cpu: %w", err)
		}
		for _, line := range strings.Split(s, "\n") {
			k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
			if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil || math.IsNaN(f) {
					return 0, fmt.Errorf("INFO cpu: %s: %q", k, v)
				}
				total += f
			}
		}
	}
	return total, nil
}
