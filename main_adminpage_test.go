package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/roost-chat/roost/proto/prototest"
	"github.com/roost-chat/roost/pubsub/redistest"
)

// The admin page in Chromium, on one of two nodes sharing Redis: it lists
// both nodes, draws its charts once samples come in, and its figures are
// those of the nodes' /metrics.
func TestAdminPageInChromium(t *testing.T) {
	redistest.Require(t)
	b := startBrowser(t)
	redisURL := "redis://" + redistest.Addr + "?prefix=" + redistest.Prefix(t)
	type node struct{ addr, admin string }
	var nodes []node
	for i := range 2 {
		addr, admin := inProcessNode(t, "--redis-url", redisURL, "--loops", "1", "--node-id", "n"+strconv.Itoa(i))
		nodes = append(nodes, node{addr, admin})
	}

	// Three idle connections on node 0, two on node 1, joined to a room
	// that gets a publish now and then (so the busiest rooms list has it).
	var clients []*prototest.Client
	for i := range 5 {
		c := prototest.DialT(t, "ws://"+nodes[i%2].addr+"/ws?app=demo&user=u"+strconv.Itoa(i), prototest.Options{})
		if err := c.Send(`{"op":"join","room":"hot"}`); err != nil {
			t.Fatal(err)
		}
		if _, _, err := c.Expect("joined", 5*time.Second); err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
	}
	stopPub := make(chan struct{})
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		for i := 0; ; i++ {
			select {
			case <-stopPub:
				return
			case <-time.After(100 * time.Millisecond):
			}
			_ = clients[0].Send(fmt.Sprintf(`{"op":"pub","room":"hot","id":"p%d","body":%d}`, i, i))
		}
	}()
	defer func() { close(stopPub); <-pubDone }()

	page := b.open("http://" + nodes[0].admin + "/")
	b.waitTrue(page, "the page lists both nodes", `window.admin && admin.last && admin.last.nodes.length === 2`)
	b.waitTrue(page, "every chart is drawn", `[...document.querySelectorAll("canvas")].every(c => Number(c.dataset.points) >= 2)`)
	b.waitTrue(page, "the busiest rooms list the room being published to",
		`document.getElementById("rooms").innerText.includes("demo/hot")`)

	// The page's figures are the metrics': each node's row against its
	// /metrics, and the cluster's total.
	var total float64
	for _, n := range nodes {
		want := adminMetrics(t, n.admin)["roost_connections_total_open"]
		total += want
		id := adminNodeID(t, n.admin)
		b.waitTrue(page, "node "+id+"'s connections match its /metrics",
			fmt.Sprintf(`(document.querySelector('tr[data-node=%q] td[data-f="conns"]') || {}).textContent === %q`, id, strconv.FormatFloat(want, 'f', 0, 64)))
	}
	if total != 5 {
		t.Fatalf("the nodes' /metrics count %v connections, want 5", total)
	}
	b.waitTrue(page, "the total matches", `document.getElementById("c-conns").textContent === "5"`)

	// The status document itself, as a script would read it.
	res, err := http.Get("http://" + nodes[1].admin + "/admin/status")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var doc struct {
		Self  nodeStatus   `json:"self"`
		Nodes []nodeStatus `json:"nodes"`
	}
	if err := json.NewDecoder(res.Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	if doc.Self.Node != adminNodeID(t, nodes[1].admin) || doc.Self.Loops != 1 {
		t.Fatalf("status of node 1: %+v", doc.Self)
	}
}

// adminNodeID is the node's id, as /healthz says it.
func adminNodeID(t *testing.T, admin string) string {
	t.Helper()
	for _, f := range strings.Fields(adminGet(t, admin, "/healthz")) {
		if v, ok := strings.CutPrefix(f, "node="); ok {
			return v
		}
	}
	t.Fatal("no node= in /healthz")
	return ""
}

// adminMetrics reads a node's /metrics into series → value.
func adminMetrics(t *testing.T, admin string) map[string]float64 {
	t.Helper()
	return parseMetrics([]byte(adminGet(t, admin, "/metrics")))
}

func adminGet(t *testing.T, admin, path string) string {
	t.Helper()
	res, err := http.Get("http://" + admin + path)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return string(body)
}

// The page is read-only and self-contained: it loads nothing from
// elsewhere, and its status route takes no writes.
func TestAdminPageServed(t *testing.T) {
	_, admin := inProcessNode(t)
	res, err := http.Get("http://" + admin + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.Contains(string(body), "roost admin") {
		t.Fatalf("GET / on the admin listener: %d %.200s", res.StatusCode, body)
	}
	if csp := res.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
		t.Fatalf("Content-Security-Policy %q", csp)
	}
	for _, ext := range []string{"http://", "https://", "//cdn"} {
		if strings.Contains(string(body), "src=\""+ext) || strings.Contains(string(body), "href=\""+ext) {
			t.Fatalf("the page loads %s from elsewhere", ext)
		}
	}
	res, err = http.Post("http://"+admin+"/admin/status", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST /admin/status: %d, want 405 (read-only)", res.StatusCode)
	}
}

func TestStatusQuantile(t *testing.T) {
	prev := map[string]float64{`h_bucket{le="0.001"}`: 0, `h_bucket{le="0.01"}`: 0, `h_bucket{le="+Inf"}`: 0}
	cur := map[string]float64{`h_bucket{le="0.001"}`: 50, `h_bucket{le="0.01"}`: 100, `h_bucket{le="+Inf"}`: 100}
	if q := quantile(cur, prev, "h", 0.5); q != 0.001 {
		t.Fatalf("p50 %v, want 0.001", q)
	}
	if q := quantile(cur, prev, "h", 0.99); q < 0.0098 || q > 0.01 {
		t.Fatalf("p99 %v, want ~0.0098", q)
	}
	if q := quantile(prev, prev, "h", 0.5); q != -1 {
		t.Fatalf("no observations: %v, want -1", q)
	}
	if app, name, ok := appSeries(`roost_webhook_dropped_total{app="chat"}`, "roost_webhook_"); !ok || app != "chat" || name != "dropped_total" {
		t.Fatalf("appSeries: %q %q %v", app, name, ok)
	}
}
