package test

import (
	"bufio"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/roost-chat/roost/proto"
	"github.com/roost-chat/roost/proto/prototest"
	"github.com/roost-chat/roost/pubsub/redistest"
)

// nested is a JSON body of depth levels of arrays around 1.
func nested(depth int) string {
	return strings.Repeat("[", depth) + "1" + strings.Repeat("]", depth)
}

// TestJSONDepthOneLimit: WebSocket, the server API and SSE hold one nesting
// limit, proto.MaxDepth, the outer object included. WebSocket answered a
// frame past it with close 1007 while the API stored 9,000 levels and
// replayed them to sockets and streams. Now the deepest body either edge
// takes reaches WebSocket and SSE members byte for byte, one level more is
// refused with a reason (err bad_request, the socket stays; HTTP 400), and
// nothing refused is delivered.
func TestJSONDepthOneLimit(t *testing.T) {
	redistest.Require(t)
	e := newEnv(t, redistest.Addr)
	apps := filepath.Join(t.TempDir(), "apps.json")
	if err := os.WriteFile(apps, []byte(`{"apps":[{"id":"`+testApp+`","secret":"`+apiSecret+`","limits":{"max_msg":65536}}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	n, api := apiNode(t, e, "node0", apps)
	pubURL := api + "/v1/apps/" + testApp + "/rooms/r/messages"
	deepest, over := nested(proto.MaxDepth-1), nested(proto.MaxDepth)

	// A listener on each transport.
	sub := prototest.DialT(t, "ws://"+n.Addr+"/ws?user=sub&app="+testApp, prototest.Options{})
	if err := sub.Send(`{"op":"join","room":"r"}`); err != nil {
		t.Fatal(err)
	}
	if _, _, err := sub.Expect("joined", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", "http://"+n.Addr+"/sse?room=r&user=listener&app="+testApp, nil)
	resp, err := (&http.Client{}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	events := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				events <- d
			}
		}
		close(events)
	}()
	if d := <-events; !strings.Contains(d, `"op":"joined"`) {
		t.Fatalf("sse: first event %q", d)
	}

	// The API: one level past the limit is a 400 that says why.
	a := apiCall(t, "POST", pubURL, apiSecret, `{"id":"deep","from":"backend","body":`+over+`}`)
	a.want(t, "publish past the depth limit", 400, "bad_request")
	if !strings.Contains(string(a.body), "nested deeper than") {
		t.Fatalf("400 without the reason: %s", a.body)
	}
	// Past encoding/json's own limit too: the same answer.
	apiCall(t, "POST", pubURL, apiSecret, `{"id":"deeper","from":"backend","body":`+nested(9000)+`}`).want(t, "publish 9000 deep", 400, "bad_request")
	apiCall(t, "POST", pubURL, apiSecret, `{"id":"ok","from":"backend","body":`+deepest+`}`).want(t, "publish at the depth limit", 200, "")

	// WebSocket: an err frame, and the connection goes on.
	p := prototest.DialT(t, "ws://"+n.Addr+"/ws?user=pub&app="+testApp, prototest.Options{})
	if err := p.Send(`{"op":"pub","room":"r","id":"deep","body":` + over + `}`); err != nil {
		t.Fatal(err)
	}
	_, m, err := p.Expect("err", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if m["code"] != "bad_request" || !strings.Contains(m["message"].(string), "nested deeper than") {
		t.Fatalf("err frame %v", m)
	}
	if err := p.Send(`{"op":"pub","room":"r","id":"ok2","body":` + deepest + `}`); err != nil {
		t.Fatal(err)
	}
	if _, m, err := p.Expect("ack", 5*time.Second); err != nil || m["seq"].(float64) != 2 {
		t.Fatalf("publish at the limit after the refusal: %v %v", m, err)
	}

	// Both listeners get the two deepest bodies, byte for byte, and nothing
	// else.
	for seq := 1; seq <= 2; seq++ {
		_, m, err := sub.Expect("msg", 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if m["seq"].(float64) != float64(seq) {
			t.Fatalf("ws: msg %v, want seq %d", m["seq"], seq)
		}
		select {
		case d := <-events:
			if !strings.Contains(d, `"body":`+deepest+`}`) {
				t.Fatalf("sse: event %d is not the deepest body: %.80q", seq, d)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("sse: no event")
		}
	}
	if f, err := sub.Next(300 * time.Millisecond); err == nil {
		t.Fatalf("ws: more than the two messages: %.80q", f.Data)
	}
}
