package main

// The demo page driven in headless Chromium over the DevTools protocol (a
// WebSocket from Go, no npm): two pages join a room, one publishes, the
// other shows the message with its seq; a reconnect resumes with since;
// a drain shows its close code and retry hint. The client's own tests
// (client/test, with Node's runner and playwright-core) are run by
// test/client_test.go.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"

	"github.com/roost-chat/roost/pubsub/redistest"
)

// chromiumPath finds Debian's chromium; without it the test skips, unless
// CI=true demands it.
func chromiumPath(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "chromium not installed: `apt-get install -y chromium` to run the demo page test"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// browser is a headless Chromium and a DevTools protocol connection to it.
type browser struct {
	t    *testing.T
	cmd  *exec.Cmd
	conn net.Conn
	rd   *bufio.Reader
	id   int
}

func startBrowser(t *testing.T) *browser {
	bin := chromiumPath(t)
	dir := t.TempDir()
	cmd := exec.Command(bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
		"--disable-component-update", "--no-first-run", "--disable-dev-shm-usage", "--user-data-dir="+dir,
		"--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", "about:blank")
	cmd.SysProcAttr = demoAttr()
	if err := cmd.Start(); err != nil {
		t.Fatalf("cannot start chromium: %v", err)
	}
	b := &browser{t: t, cmd: cmd}
	t.Cleanup(b.close)
	// Chromium writes its port and browser path to DevToolsActivePort.
	var wsURL string
	redistest.WaitFor(t, 30*time.Second, func() error {
		data, err := os.ReadFile(filepath.Join(dir, "DevToolsActivePort"))
		if err != nil {
			return fmt.Errorf("chromium not listening yet: %w", err)
		}
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		if len(lines) < 2 {
			return errors.New("DevToolsActivePort incomplete")
		}
		wsURL = "ws://127.0.0.1:" + lines[0] + lines[1]
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, br, _, err := ws.Dial(ctx, wsURL)
	if err != nil {
		t.Fatalf("cannot connect to chromium's DevTools at %s: %v", wsURL, err)
	}
	if br == nil {
		br = bufio.NewReader(conn)
	}
	b.conn, b.rd = conn, br
	return b
}

func (b *browser) close() {
	if b.conn != nil {
		_, _ = b.call("", "Browser.close", nil)
		b.conn.Close()
	}
	done := make(chan struct{})
	go func() { _ = b.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-b.cmd.Process.Pid, syscall.SIGKILL) // its own process group
		<-done
	}
}

// call sends one DevTools command (to a page when session is set) and
// returns its result, skipping the events that arrive meanwhile.
func (b *browser) call(session, method string, params any) (json.RawMessage, error) {
	b.id++
	req := map[string]any{"id": b.id, "method": method}
	if params != nil {
		req["params"] = params
	}
	if session != "" {
		req["sessionId"] = session
	}
	msg, _ := json.Marshal(req)
	_ = b.conn.SetDeadline(time.Now().Add(15 * time.Second))
	if err := wsutil.WriteClientText(b.conn, msg); err != nil {
		return nil, err
	}
	for {
		data, err := wsutil.ReadServerText(struct {
			io.Reader
			io.Writer
		}{b.rd, b.conn})
		if err != nil {
			return nil, err
		}
		var resp struct {
			ID     int             `json:"id"`
			Result json.RawMessage `json:"result"`
			Error  *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal(data, &resp) != nil || resp.ID != b.id {
			continue
		}
		if resp.Error != nil {
			return nil, fmt.Errorf("%s: %s", method, resp.Error.Message)
		}
		return resp.Result, nil
	}
}

// open makes a new page at u and returns its session.
func (b *browser) open(u string) string {
	b.t.Helper()
	return b.openTarget(map[string]any{"url": u})
}

// openWindow makes a new page at u in a window of its own: it stays
// visible (document.visibilityState) when another page opens, as two
// windows side by side do.
func (b *browser) openWindow(u string) string {
	b.t.Helper()
	return b.openTarget(map[string]any{"url": u, "newWindow": true})
}

func (b *browser) openTarget(params map[string]any) string {
	b.t.Helper()
	res, err := b.call("", "Target.createTarget", params)
	if err != nil {
		b.t.Fatal(err)
	}
	var tgt struct {
		TargetID string `json:"targetId"`
	}
	_ = json.Unmarshal(res, &tgt)
	res, err = b.call("", "Target.attachToTarget", map[string]any{"targetId": tgt.TargetID, "flatten": true})
	if err != nil {
		b.t.Fatal(err)
	}
	var att struct {
		SessionID string `json:"sessionId"`
	}
	_ = json.Unmarshal(res, &att)
	return att.SessionID
}

// eval runs a JavaScript expression in a page and returns its JSON value.
func (b *browser) eval(session, expr string) (any, error) {
	res, err := b.call(session, "Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true})
	if err != nil {
		return nil, err
	}
	var r struct {
		Result struct {
			Value any `json:"value"`
		} `json:"result"`
		Exception *struct {
			Text string `json:"text"`
		} `json:"exceptionDetails"`
	}
	if err := json.Unmarshal(res, &r); err != nil {
		return nil, err
	}
	if r.Exception != nil {
		return nil, fmt.Errorf("%s: %s", expr, r.Exception.Text)
	}
	return r.Result.Value, nil
}

// waitTrue polls a boolean expression in a page.
func (b *browser) waitTrue(session, what, expr string) {
	b.t.Helper()
	redistest.WaitFor(b.t, 10*time.Second, func() error {
		v, err := b.eval(session, expr)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if v != true {
			log, _ := b.eval(session, `document.getElementById("log") ? document.getElementById("log").innerText : ""`)
			state, _ := b.eval(session, `JSON.stringify({messages: [...document.querySelectorAll("#messages li")].map(li => (li.hidden ? "(hidden) " : "") + li.dataset.room + " " + li.innerText),`+
				` rooms: document.getElementById("rooms") ? document.getElementById("rooms").innerText : "", typing: document.getElementById("typing") ? document.getElementById("typing").textContent : ""})`)
			return fmt.Errorf("%s: not yet (page: %v; log: %v)", what, state, log)
		}
		return nil
	})
}

// pageMessages lists the page's messages, each as its seq and its line
// (#seq room from: body), without the marks and controls around it.
const pageMessages = `[...document.querySelectorAll("#messages li")].map(li => li.dataset.seq + " " + (li.querySelector(".line") || li).textContent).join("\n")`

// TestDemoPageInChromium drives the demo page, which runs on the embedded
// /roost.js: two pages in a room, a publish acknowledged and shown with its
// seq, a disconnect and connect that resumes from the tab's stored
// position, and a drain whose close code and retry hint the page shows
// while the client waits to reconnect.
func TestDemoPageInChromium(t *testing.T) {
	b := startBrowser(t)
	addr, _, stop := inProcessNodeStop(t, "--drain", "300ms", "--retry-min", "20s", "--retry-max", "30s")
	page := func(q url.Values) string { return "http://" + addr + "/?" + q.Encode() }

	alice := b.open(page(url.Values{"user": {"alice"}, "app": {"demo"}, "room": {"lobby"}, "autojoin": {"1"}}))
	b.waitTrue(alice, "alice joined", `window.demo !== undefined && demo.client !== null && demo.client.rooms.get("lobby").joined`)
	bob := b.open(page(url.Values{"user": {"bob"}, "app": {"demo"}, "room": {"lobby"}, "autojoin": {"1"}, "autopub": {"hello from bob"}}))
	b.waitTrue(bob, "bob's publish acknowledged", `Object.values(demo.acks).includes(1)`)
	b.waitTrue(alice, "alice shows bob's message with seq 1",
		pageMessages+` === "1 #1 lobby bob: hello from bob"`)

	// Disconnect and connect again: a new client resumes from the position
	// the tab stored, so alice gets what she missed, once.
	if _, err := b.eval(alice, `demo.disconnect()`); err != nil {
		t.Fatal(err)
	}
	b.waitTrue(alice, "alice disconnected", `document.body.dataset.state === "closed"`)
	if _, err := b.eval(bob, `demo.publish("while you were out")`); err != nil {
		t.Fatal(err)
	}
	b.waitTrue(bob, "bob's second publish acknowledged", `Object.values(demo.acks).includes(2)`)
	if _, err := b.eval(alice, `demo.connect()`); err != nil {
		t.Fatal(err)
	}
	b.waitTrue(alice, "alice rejoined with since and caught up",
		pageMessages+` === "1 #1 lobby bob: hello from bob\n2 #2 lobby bob: while you were out"`+
			` && document.getElementById("log").innerText.includes("join lobby since 1")`)

	// A publish while the node is gone waits in the outbox, shown on the
	// page. A drain closes both pages with 1001 and a retry hint they show.
	stop()
	b.waitTrue(alice, "alice shows the drain close and its retry hint",
		`demo.closes.length > 0 && demo.closes.at(-1).code === 1001 && demo.closes.at(-1).retry >= 20000`+
			` && /closed 1001 .*retry hint \d+ ms/.test(document.getElementById("log").innerText)`+
			` && document.body.dataset.state === "reconnecting"`)
	if _, err := b.eval(alice, `demo.publish("queued"), true`); err != nil {
		t.Fatal(err)
	}
	b.waitTrue(alice, "the outbox shows the queued publish",
		`demo.client.outbox.length === 1 && document.getElementById("outbox").innerText.includes("waiting for a connection")`)
}

// The node serves the very bytes of client/roost.js.
func TestClientScriptEmbedded(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("client", "roost.js"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(src, clientScript) {
		t.Fatal("the embedded client differs from client/roost.js")
	}
}
