package main

import (
	"net/url"
	"testing"
)

// The demo page's SSE switch listens through the browser's EventSource:
// a message published over WebSocket is shown with its seq, a dropped
// stream reopens from its position (nothing missed, nothing twice), and a
// room joined later opens a stream for both rooms that resumes the first.
func TestDemoPageSSEInChromium(t *testing.T) {
	b := startBrowser(t)
	addr, _, _ := inProcessNodeStop(t)
	page := func(q url.Values) string { return "http://" + addr + "/?" + q.Encode() }

	alice := b.open(page(url.Values{"user": {"alice"}, "app": {"demo"}, "room": {"lobby"}, "autojoin": {"1"}, "sse": {"1"}}))
	b.waitTrue(alice, "alice listens over SSE", `window.demo !== undefined && demo.sseState.es !== null && demo.rooms.get("lobby").joined === true`+
		` && document.getElementById("transport").textContent === "(sse)"`)
	bob := b.open(page(url.Values{"user": {"bob"}, "app": {"demo"}, "room": {"lobby"}, "autojoin": {"1"}, "autopub": {"hello"}}))
	b.waitTrue(bob, "bob's publish acknowledged", `Object.values(demo.acks).includes(1)`)
	b.waitTrue(alice, "alice shows bob's message with seq 1", pageMessages+` === "1 #1 lobby bob: hello"`)

	if _, err := b.eval(alice, `document.getElementById("drop").click(), true`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.eval(bob, `demo.publish("after the drop"), true`); err != nil {
		t.Fatal(err)
	}
	b.waitTrue(alice, "alice resumed from her position", pageMessages+` === "1 #1 lobby bob: hello\n2 #2 lobby bob: after the drop"`+
		` && document.getElementById("log").innerText.includes("resumed, nothing missed")`)

	if _, err := b.eval(alice, `demo.join("side"), true`); err != nil {
		t.Fatal(err)
	}
	b.waitTrue(alice, "alice's new stream has both rooms", `demo.rooms.get("side").joined === true && demo.rooms.get("lobby").joined === true`)
	if _, err := b.eval(bob, `demo.publish("in side", "side"), demo.publish("in lobby"), true`); err != nil {
		t.Fatal(err)
	}
	b.waitTrue(alice, "alice shows both rooms' messages once", pageMessages+` === "1 #1 lobby bob: hello\n2 #2 lobby bob: after the drop\n1 #1 side bob: in side\n3 #3 lobby bob: in lobby"`+
		` || `+pageMessages+` === "1 #1 lobby bob: hello\n2 #2 lobby bob: after the drop\n3 #3 lobby bob: in lobby\n1 #1 side bob: in side"`)
	if _, err := b.eval(alice, `demo.publish("x").catch(() => {}), true`); err != nil {
		t.Fatal(err)
	}
	b.waitTrue(alice, "a publish over SSE is refused on the page", `document.getElementById("log").innerText.includes("SSE is listen only")`)
}
