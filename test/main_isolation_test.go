package test

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
	"github.com/roost-chat/roost/proto/prototest"
	"github.com/roost-chat/roost/test/harness"
)

// Isolation between tenants, on the real binary: app X publishes at 10x its
// app publish rate while app Y publishes at a steady rate well inside its
// limits. Y's publish-to-ack p99 with X flooding must stay within 20% (or
// 2 ms) of Y's baseline, measured in the same run in phases alternating
// with the flood's (the machine is shared: the noise drifts, and
// alternating spreads it over both). In the baseline phases X publishes at
// 90% of its limit: what is measured is the cost of X's excess to Y, not
// of X's admitted traffic, which Y shares the loops with by design (it can
// add up to one --flush interval to Y's acks through the batching tick).
// The figures are in docs/benchmarks.md:
//
//	go test -count=1 -run TestAppIsolation -v .
func TestAppIsolation(t *testing.T) {
	if testing.Short() {
		t.Skip("a 15 s load test")
	}
	const (
		xLimit = 500  // X's --app-pub-rate
		xRate  = 5000 // what X offers: 10x
		yRate  = 100  // Y's steady publishes per second (one user)
		phase  = 2 * time.Second
	)
	dir := t.TempDir()
	f := filepath.Join(dir, "apps.json")
	reg := persist.OpenAppFile(f)
	secX, secY := "isolation-secret-x-0123456789", "isolation-secret-y-0123456789"
	zero := 0.0
	rateX := float64(xLimit)
	for _, a := range []proto.App{
		{ID: "x", Secret: secX, Limits: proto.AppLimits{AppPubRate: &rateX, PubRate: &zero}},
		{ID: "y", Secret: secY},
	} {
		if err := reg.CreateApp(context.Background(), a); err != nil {
			t.Fatal(err)
		}
	}
	node := harness.Start(t, harness.Spec{Args: []string{"--apps", f, "--api", "off", "--log-level", "error"}})
	addr, admin := node.Addr, node.Admin
	token := func(secret, app, user string) string {
		s, err := proto.SignToken([]byte(secret), app, user, time.Now().Add(time.Hour), nil)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	// Y: one user publishing every 1/yRate s; the ack's arrival is stamped
	// by the reader as it comes off the socket.
	var ymu sync.Mutex
	ySent := map[string]time.Time{}
	var yLat []time.Duration
	var yErrs, ySentN atomic.Int64
	y := prototest.DialT(t, "ws://"+addr+"/ws?token="+token(secY, "y", "yuser"), prototest.Options{OnFrame: func(fr prototest.Frame) {
		m := fr.Map()
		switch m["op"] {
		case "ack":
			now := time.Now()
			ymu.Lock()
			if t0, ok := ySent[m["id"].(string)]; ok {
				yLat = append(yLat, now.Sub(t0))
			}
			ymu.Unlock()
		case "err":
			yErrs.Add(1)
		}
	}})
	stopY := make(chan struct{})
	yDone := make(chan struct{})
	go func() {
		defer close(yDone)
		tick := time.NewTicker(time.Second / yRate)
		defer tick.Stop()
		for n := 0; ; n++ {
			select {
			case <-stopY:
				return
			case <-tick.C:
			}
			id := "y" + strconv.Itoa(n)
			ymu.Lock()
			ySent[id] = time.Now()
			ymu.Unlock()
			if err := y.Send(`{"op":"pub","room":"steady","id":"` + id + `","body":{"n":` + strconv.Itoa(n) + `}}`); err != nil {
				return
			}
			ySentN.Add(1)
		}
	}()
	measure := func() []time.Duration {
		ymu.Lock()
		yLat = yLat[:0]
		ymu.Unlock()
		time.Sleep(phase)
		ymu.Lock()
		defer ymu.Unlock()
		return slices.Clone(yLat)
	}

	// X: two users sending xRate (or, in the baseline phases, 90% of its
	// limit) between them, each writing its due frames once a millisecond
	// in one write. Cheap for this process (frames written with a zero mask
	// key, answers read and dropped unparsed), so that Y's client does not
	// starve on its own side of the measurement; the node counts X's acks
	// and refusals.
	var xRateNow atomic.Int64
	stopX := make(chan struct{})
	var xwg sync.WaitGroup
	for u := 0; u < 2; u++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		conn, _, _, err := ws.Dial(ctx, "ws://"+addr+"/ws?token="+token(secX, "x", "xuser"+strconv.Itoa(u)))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		go func() { _, _ = io.Copy(io.Discard, conn) }()
		xwg.Add(1)
		go func(u int) {
			defer xwg.Done()
			var start time.Time
			var rate int64
			sent, id := 0, 0
			var buf []byte
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stopX:
					return
				case <-tick.C:
				}
				if r := xRateNow.Load(); r != rate {
					rate, start, sent = r, time.Now(), 0
				}
				due := int(time.Since(start).Seconds()*float64(rate)/2) - sent
				buf = buf[:0]
				for ; due > 0; due-- {
					at := len(buf)
					buf = append(buf, 0x81, 0x80, 0, 0, 0, 0) // FIN text, masked with key 0000
					buf = append(buf, `{"op":"pub","room":"flood","id":"x`...)
					buf = strconv.AppendInt(append(strconv.AppendInt(buf, int64(u), 10), '-'), int64(id), 10)
					buf = append(buf, `","body":"xxxxxxxxxxxxxxxx"}`...)
					buf[at+1] |= byte(len(buf) - at - 6)
					sent++
					id++
				}
				if len(buf) > 0 {
					if _, err := conn.Write(buf); err != nil {
						return
					}
				}
			}
		}(u)
	}

	p := func(d []time.Duration, q float64) time.Duration {
		if len(d) == 0 {
			return 0
		}
		s := slices.Clone(d)
		slices.Sort(s)
		return s[min(len(s)-1, int(q*float64(len(s))))]
	}

	// A round: baseline and flood phases alternate (B F B F B F B): on a
	// shared machine the noise drifts, and alternating spreads it over
	// both. A p99 of a few hundred samples is at the mercy of the other
	// processes of a loaded machine (two rounds in a row here gave a
	// baseline p99 of 11 ms and of 81 ms), so up to three rounds are run
	// and one within the bound passes; a real loss of isolation fails all
	// three. The X figures are checked every round.
	time.Sleep(500 * time.Millisecond) // warm-up
	passed := false
	for r := 1; r <= 3 && !passed; r++ {
		var base, floodY []time.Duration
		var floodRun time.Duration
		var xA, xL float64
		for i := 0; i < 7; i++ {
			if i%2 == 0 {
				xRateNow.Store(xLimit * 9 / 10)
				time.Sleep(200 * time.Millisecond) // the flood's answers drain
				base = append(base, measure()...)
				continue
			}
			a0, l0 := adminMetric(t, admin, `roost_publishes_total`), adminMetric(t, admin, `roost_app_refusals_total{app="x",reason="app_rate"}`)
			y0 := ySentN.Load()
			xRateNow.Store(xRate)
			t0 := time.Now()
			floodY = append(floodY, measure()...)
			floodRun += time.Since(t0)
			xA += adminMetric(t, admin, `roost_publishes_total`) - a0 - float64(ySentN.Load()-y0)
			xL += adminMetric(t, admin, `roost_app_refusals_total{app="x",reason="app_rate"}`) - l0
		}
		got, b := p(floodY, 0.99), p(base, 0.99)
		t.Logf("round %d: Y (%d/s, one user): baseline (X at 90%% of its limit) p50 %v p99 %v (%d acks); with X at 10x p50 %v p99 %v (%d acks)",
			r, yRate, p(base, 0.5), b, len(base), p(floodY, 0.5), got, len(floodY))
		xFor := floodRun.Seconds()
		offered := (xA + xL) / xFor
		t.Logf("round %d: X: limit %d/s, offered %.0f/s (answered), acked %.0f/s, rate_limited %.0f/s", r, xLimit, offered, xA/xFor, xL/xFor)
		if len(floodY) < int(3*phase.Seconds()*yRate*0.7) {
			t.Errorf("Y acks with X flooding %d, want about %d", len(floodY), int(3*phase.Seconds()*yRate))
		}
		if offered < 8*xLimit {
			t.Errorf("X offered %.0f/s, want about 10x its limit of %d", offered, xLimit)
		}
		// The app's bucket refills between floods: each flood may add a burst.
		if acked := xA / xFor; acked > 1.1*xLimit+3*float64(xLimit)/xFor {
			t.Errorf("X acked %.0f/s over its limit of %d", acked, xLimit)
		}
		passed = got <= max(b*12/10, b+2*time.Millisecond)
	}
	close(stopX)
	xwg.Wait()
	close(stopY)
	<-yDone
	if yErrs.Load() != 0 {
		t.Errorf("Y got %d err answers", yErrs.Load())
	}
	if !passed {
		t.Error("Y's p99 with X flooding was over 20% and 2 ms above its baseline in every round")
	}
}

// adminMetric reads one series of a node's /metrics.
func adminMetric(t *testing.T, admin, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if name, v, ok := strings.Cut(line, " "); ok && name == series {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	t.Fatalf("no %s in /metrics", series)
	return 0
}
