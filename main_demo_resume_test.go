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

// The demo page connects by itself, and a reload of the tab rejoins its
// rooms and shows their recent messages again (the page's list is gone
// with the reload; the client resumes from the tab's stored position).
func TestDemoPageRestoresRoomsAfterReload(t *testing.T) {
	b := startBrowser(t)
	addr, _ := inProcessNode(t)
	base := "http://" + addr + "/"
	dave := b.open(base + "?" + url.Values{"user": {"dave"}, "app": {"demo"}, "room": {"lobby"},
		"autojoin": {"1"}, "autopub": {"one"}}.Encode())
	b.waitTrue(dave, "dave's first publish acknowledged", `Object.values(demo.acks).includes(1)`)
	if _, err := b.eval(dave, `demo.join("side"), demo.publish("two", "lobby"), demo.publish("three", "side"), true`); err != nil {
		t.Fatal(err)
	}
	b.waitTrue(dave, "both publishes acknowledged", `Object.keys(demo.acks).length === 3`)

	// A page with no query: it connects by itself as the tab's user.
	erin := b.open(base + "?user=erin")
	b.waitTrue(erin, "a bare page connects by itself", `document.body.dataset.state === "open"`)
	// The same page of a new user joining a room sees its recent messages.
	if _, err := b.eval(erin, `demo.join("lobby"), true`); err != nil {
		t.Fatal(err)
	}
	b.waitTrue(erin, "a first join shows the room's recent messages",
		pageMessages+` === "1 #1 lobby dave: one\n2 #2 lobby dave: two"`)

	// dave reloads without any query: same user (the tab's), rooms back,
	// earlier messages shown again, live ones after.
	if _, err := b.eval(dave, `location.href = "/"; true`); err != nil {
		t.Fatal(err)
	}
	b.waitTrue(dave, "the reloaded page rejoined both rooms and shows their messages",
		`document.body.dataset.state === "open" && demo.client.rooms.get("lobby").joined && demo.client.rooms.get("side").joined`+
			` && [...document.querySelectorAll("#messages li")].map(li => li.dataset.room + ":" + li.dataset.seq).sort().join(",") === "lobby:1,lobby:2,side:1"`)
	if _, err := b.eval(erin, `demo.publish("after the reload", "lobby"), true`); err != nil {
		t.Fatal(err)
	}
	b.waitTrue(dave, "live messages follow the restored ones",
		`[...document.querySelectorAll('#messages li[data-room="lobby"]')].map(li => li.dataset.seq).join(",") === "1,2,3"`)
}
