package test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/roost-chat/roost/proto/prototest"
	"github.com/roost-chat/roost/pubsub/redistest"
)

// BenchmarkConnEvents: connection events at 2,000 transitions a second
// for one app, through one node with PostgreSQL and Redis. 100
// connections of app "ev" (webhook events msg,presence) each, every
// 100 ms, join one of 50 shared rooms and leave the one joined 500 ms
// before: 1,000 joined and 1,000 left a second, every one a transition
// (a membership outlives a presence tick; a user comes back to a room
// only after 5 s, past the 500 ms grace). A real receiver records, for
// every event, the time from the transition (its ts, when the node found
// it, before its commit) to the POST's arrival: an upper bound of the
// commit-to-POST lag. App "noev" (webhook msg only) runs the same load
// from its own 100 connections; rounds of 10 s alternate ev, noev, noev,
// ev and the PostgreSQL backends' CPU (/proc) of each round is charged to
// its app: the difference per transition is what the events add (joins'
// room reads and the presence work are in both).
//
//	go test -run XXX -bench ConnEvents -benchtime 1x ./test/
func BenchmarkConnEvents(b *testing.B) {
	redistest.Require(b)
	var mu sync.Mutex
	var lags []time.Duration
	var got int
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now().UnixMilli()
		body, _ := io.ReadAll(r.Body)
		var p struct {
			Events []connEvent `json:"events"`
		}
		_ = json.Unmarshal(body, &p)
		mu.Lock()
		for _, e := range p.Events {
			if e.Type == "joined" || e.Type == "left" {
				lags = append(lags, time.Duration(now-e.TS)*time.Millisecond)
				got++
			}
		}
		mu.Unlock()
	}))
	defer recv.Close()
	e := newEnv(b, redistest.Addr)
	f := filepath.Join(b.TempDir(), "apps.json")
	body := fmt.Sprintf(`{"apps":[{"id":"ev","secret":%q,"webhook":{"url":%q,"events":["msg","presence"]}},{"id":"noev","secret":%q,"webhook":{"url":%q}}]}`,
		apiSecret, recv.URL, apiSecret, recv.URL)
	if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
		b.Fatal(err)
	}
	n, err := launchNode(b, e, "node0", []string{"--apps", f, "--presence-grace", "500ms", "--max-rooms", "16"})
	if err != nil {
		b.Fatal(err)
	}
	// A membership lasts hold steps (500 ms: a join and a leave within one
	// presence tick are no transition at all); a user comes back to a
	// room after rooms steps (5 s, past the grace).
	const conns, rooms, hold, step = 100, 50, 5, 100 * time.Millisecond
	const roundFor = 10 * time.Second
	var errOnce sync.Once
	onFrame := func(fr prototest.Frame) {
		if fr.Op == ws.OpClose || bytes.Contains(fr.Data, []byte(`"op":"err"`)) {
			errOnce.Do(func() { b.Logf("first error: close %d %q %s", fr.Code, fr.Reason, fr.Data) })
		}
	}
	dial := func(app string) []*prototest.Client {
		cs := make([]*prototest.Client, conns)
		for i := range cs {
			cs[i] = prototest.DialT(b, "ws://"+n.Addr+"/ws?user=u"+fmt.Sprint(i)+"&app="+app, prototest.Options{OnFrame: onFrame, ReadTimeout: time.Hour})
		}
		return cs
	}
	clients := map[string][]*prototest.Client{"ev": dial("ev"), "noev": dial("noev")}
	// The idle ones (the other app's during a round) keep their
	// connections: the node closes one silent for its idle timeout.
	stopPing := make(chan struct{})
	defer close(stopPing)
	go func() {
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-stopPing:
				return
			case <-t.C:
			}
			for _, cs := range clients {
				for _, c := range cs {
					_ = c.Send(`{"op":"ping"}`)
				}
			}
		}
	}()
	hist := map[float64]float64{} // the node's webhook lag histogram over the ev rounds: le -> count
	k := 0                        // each round goes on where the last left off: a room comes back only every rooms steps
	warm := true
	round := func(app string) (time.Duration, int) {
		mu.Lock()
		lags, got = lags[:0], 0
		mu.Unlock()
		cpu0 := dbBackendCPU(b, e.dbURL)
		h0 := lagBuckets(n.Metrics(b))
		steps := int(roundFor / step)
		start := time.Now()
		var wg sync.WaitGroup
		for i, c := range clients[app] {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Spread over the step: 2 operations per step per 10
				// connections, not all at once.
				off := time.Duration(i) * step / conns
				room := func(s int) string { return fmt.Sprintf("r%d", (i+k+s)%rooms) }
				for s := 0; s < steps+hold; s++ {
					time.Sleep(time.Until(start.Add(off + time.Duration(s)*step)))
					var frames string
					if s < steps {
						frames = `{"op":"join","room":"` + room(s) + `"}`
					}
					if s >= hold {
						frames += `{"op":"leave","room":"` + room(s-hold) + `"}`
					}
					for _, f := range strings.SplitAfter(frames, "}") {
						if f == "" {
							continue
						}
						if err := c.Send(f); err != nil {
							b.Error(err)
							return
						}
					}
				}
			}()
		}
		wg.Wait()
		for _, cs := range clients {
			for _, c := range cs {
				if c.Dead() {
					b.Logf("a dead client after %s's round: %v", app, c.Err())
					break
				}
			}
		}
		k += steps
		want := 2 * conns * steps // a joined per join, a left per leave
		if app == "ev" {
			deadline := time.Now().Add(30 * time.Second)
			for time.Now().Before(deadline) {
				mu.Lock()
				g := got
				mu.Unlock()
				if g >= want {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		time.Sleep(1500 * time.Millisecond) // the last lefts' grace, a sweep
		cpu := dbBackendCPU(b, e.dbURL) - cpu0
		if app == "ev" {
			m := n.Metrics(b)
			for le, c := range lagBuckets(m) {
				hist[le] += c - h0[le]
			}
			b.Logf("node: joined %v left %v committed %v delivered %v owed %v; presence changes %v, errors %v; webhook posts %v failures %v",
				m[`roost_conn_events_total{type="joined"}`], m[`roost_conn_events_total{type="left"}`], m["roost_conn_events_committed_total"],
				m["roost_conn_events_delivered_total"], m["roost_conn_events_owed"], m["roost_presence_changes_total"], m["roost_presence_apply_errors_total"],
				m["roost_webhook_posts_total"], m["roost_webhook_failures_total"])
		}
		mu.Lock()
		defer mu.Unlock()
		if app == "ev" && got != want && !warm {
			// (Warming, a join may still wait for its new room's first
			// read when its leave comes: never in the room, no event.)
			b.Errorf("%s: %d events, want %d", app, got, want)
		}
		return cpu, want
	}
	round("ev") // warm the rooms, the statements and the presence keys
	round("noev")
	warm = false
	b.ResetTimer()
	var on, off time.Duration
	var all []time.Duration
	var transitions int
	for _, app := range []string{"ev", "noev", "noev", "ev", "ev", "noev"} {
		cpu, tr := round(app)
		b.Logf("%s: %v of PostgreSQL CPU for %d transitions", app, cpu, tr)
		if app == "ev" {
			on += cpu
			transitions += tr
			mu.Lock()
			all = append(all, lags...)
			mu.Unlock()
		} else {
			off += cpu
		}
	}
	b.StopTimer()
	slices.Sort(all)
	q := func(p float64) float64 {
		if len(all) == 0 {
			return 0
		}
		return float64(all[min(len(all)-1, int(p*float64(len(all))))].Microseconds()) / 1000
	}
	b.ReportMetric(q(0.5), "lag-p50-ms")
	b.ReportMetric(q(0.99), "lag-p99-ms")
	b.ReportMetric(q(1)-0, "lag-max-ms")
	b.ReportMetric(float64(transitions)/(3*roundFor.Seconds()), "transitions/s")
	// The node's own measure: from the hand-off of the committed event to
	// the 2xx of its POST (roost_webhook_lag_seconds), p99 as the bucket
	// bound that holds 99 %.
	les := slices.Sorted(maps.Keys(hist))
	if len(les) > 0 {
		total := hist[les[len(les)-1]]
		for _, le := range les {
			if hist[le] >= 0.99*total {
				b.ReportMetric(le*1000, "node-commit-to-2xx-p99-ms-at-most")
				break
			}
		}
	}
	b.ReportMetric(float64((on-off).Microseconds())/float64(transitions), "pg-µs/transition-added")
	b.ReportMetric(float64(off.Microseconds())/float64(transitions), "pg-µs/op-without")
}

// lagBuckets reads the node's roost_webhook_lag_seconds buckets: le -> count.
func lagBuckets(m map[string]float64) map[float64]float64 {
	out := map[float64]float64{}
	for k, v := range m {
		le, ok := strings.CutPrefix(k, `roost_webhook_lag_seconds_bucket{le="`)
		if !ok {
			continue
		}
		le = strings.TrimSuffix(le, `"}`)
		if le == "+Inf" {
			out[math.Inf(1)] = v
			continue
		}
		if f, err := strconv.ParseFloat(le, 64); err == nil {
			out[f] = v
		}
	}
	return out
}
