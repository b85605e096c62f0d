package main

import (
	"net/url"
	"testing"
)

// The demo page says when messages were missed: a tab that rejoins a node
// whose memory store started afresh (its history is gone) is told
// recovered:false, and the page shows a "missed messages" notice.
func TestDemoPageShowsMissedMessages(t *testing.T) {
	b := startBrowser(t)
	addr, _, stop := inProcessNodeStop(t, "--drain", "100ms")
	page := "http://" + addr + "/?" + url.Values{"user": {"carol"}, "app": {"demo"}, "room": {"lobby"},
		"autojoin": {"1"}, "autopub": {"before the restart"}}.Encode()
	carol := b.open(page)
	b.waitTrue(carol, "carol's publish acknowledged", `Object.values(demo.acks).includes(1)`)
	b.waitTrue(carol, "carol shows her message", pageMessages+` === "1 #1 lobby carol: before the restart"`)
	if _, err := b.eval(carol, `demo.disconnect()`); err != nil {
		t.Fatal(err)
	}
	b.waitTrue(carol, "carol disconnected", `document.body.dataset.state === "closed"`)
	stop()
	inProcessNode(t, "--listen", addr) // the same address, a fresh memory store
	if _, err := b.eval(carol, `demo.connect()`); err != nil {
		t.Fatal(err)
	}
	b.waitTrue(carol, "the page says messages were missed",
		`demo.resets.length === 1 && document.querySelector("#messages li.missed") !== null`+
			` && document.querySelector("#messages li.missed").innerText.includes("missed messages")`)
}
