package main

// The demo page's chat state in Chromium across two nodes sharing
// PostgreSQL and Redis: alice's page on one node, bob's on the other. Who
// is typing, an unread count per room that clears when the room is looked
// at while the page is visible (and comes back from the node after a
// reload), and a read tick on one's own message once the other has read
// it. Then edits, deletes and reactions made with the page's controls.

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/roost-chat/roost/persist/pgtest"
	"github.com/roost-chat/roost/pubsub/redistest"
)

// twoChatNodes starts two nodes (in development mode, for the demo page)
// on one PostgreSQL database and one Redis prefix, and returns their
// client addresses.
func twoChatNodes(t *testing.T) (a, b string) {
	t.Helper()
	redistest.Require(t)
	db := pgtest.NewDB(t)
	redisURL := "redis://" + redistest.Addr + "?prefix=" + redistest.Prefix(t)
	a, _ = inProcessNode(t, "--database-url", db, "--migrate", "--redis-url", redisURL, "--node-id", "a", "--loops", "1")
	b, _ = inProcessNode(t, "--database-url", db, "--redis-url", redisURL, "--node-id", "b", "--loops", "1")
	return a, b
}

// chatPage opens the demo page of user on the node at addr, joined to
// lobby (looked at) and side, and waits until both are joined.
func chatPage(b *browser, addr, user string) string {
	b.t.Helper()
	p := b.openWindow("http://" + addr + "/?" + url.Values{"user": {user}, "app": {"demo"}, "room": {"lobby"}, "autojoin": {"1"}}.Encode())
	b.waitTrue(p, user+" joined lobby", `window.demo !== undefined && demo.client !== null && demo.client.rooms.get("lobby") !== undefined && demo.client.rooms.get("lobby").joined`)
	b.run(p, `demo.join("side")`)
	b.waitTrue(p, user+" joined side", `demo.client.rooms.get("side") !== undefined && demo.client.rooms.get("side").joined`)
	b.waitTrue(p, user+"'s page is visible", `document.visibilityState === "visible"`)
	return p
}

// run evaluates a statement in a page, failing the test on an exception.
func (b *browser) run(session, stmt string) {
	b.t.Helper()
	if _, err := b.eval(session, "("+stmt+", true)"); err != nil {
		b.t.Fatal(err)
	}
}

// await evaluates an expression in a page, waiting for its promise, and
// returns its JSON value.
func (b *browser) await(session, expr string) any {
	b.t.Helper()
	res, err := b.call(session, "Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true, "awaitPromise": true})
	if err != nil {
		b.t.Fatal(err)
	}
	var r struct {
		Result struct {
			Value any `json:"value"`
		} `json:"result"`
		Exception *struct {
			Text      string `json:"text"`
			Exception struct {
				Description string `json:"description"`
			} `json:"exception"`
		} `json:"exceptionDetails"`
	}
	if err := json.Unmarshal(res, &r); err != nil {
		b.t.Fatal(err)
	}
	if r.Exception != nil {
		b.t.Fatalf("%s: %s %s", expr, r.Exception.Text, r.Exception.Exception.Description)
	}
	return r.Result.Value
}

// Expressions on the demo page: a room's badge as shown ("" when hidden),
// the typing line, the tick of a message.
func badge(room string) string {
	return `(() => { const b = document.querySelector('#rooms li[data-room="` + room + `"] .badge'); return b === null ? "none" : b.hidden ? "" : b.textContent; })()`
}

const typingLine = `document.getElementById("typing").textContent`

func tickOf(room string, seq int) string {
	return `(() => { const t = document.querySelector('#messages li[data-room="` + room + `"][data-seq="` + strconv.Itoa(seq) + `"] .tick'); return t === null ? "none" : t.textContent + "|" + (t.getAttribute("aria-label") || ""); })()`
}

func TestDemoPageChatStateAcrossNodes(t *testing.T) {
	b := startBrowser(t)
	nodeA, nodeB := twoChatNodes(t)
	alice := chatPage(b, nodeA, "alice")
	bob := chatPage(b, nodeB, "bob")
	for _, p := range []string{alice, bob} {
		b.waitTrue(p, "the page looks at lobby, no unread", `document.querySelector('#rooms li[data-room="lobby"] button').getAttribute("aria-current") === "true"`+
			` && `+badge("lobby")+` === "" && `+badge("side")+` === ""`)
	}

	// Typing: bob types into the message field (real key input); alice,
	// on the other node, sees him typing, and no longer once he has sent.
	b.run(bob, `document.getElementById("body").focus()`)
	if _, err := b.call(bob, "Input.insertText", map[string]any{"text": "hello al"}); err != nil {
		t.Fatal(err)
	}
	b.waitTrue(alice, "alice sees bob typing", typingLine+` === "bob is typing…"`)
	b.waitTrue(bob, "bob does not see himself typing", typingLine+` === ""`)
	if _, err := b.call(bob, "Input.insertText", map[string]any{"text": "ice"}); err != nil {
		t.Fatal(err)
	}
	b.run(bob, `document.getElementById("publish").click()`)
	b.waitTrue(alice, "bob's message shown, his typing gone", pageMessages+` === "1 #1 lobby bob: hello alice" && `+typingLine+` === ""`)
	// Signals are not stored: bob's message is the room's first.
	b.waitTrue(bob, "bob's message is seq 1", `Object.values(demo.acks).join() === "1" && document.getElementById("body").value === ""`)
	// Typing again, then clearing the field: alice sees him start and stop.
	if _, err := b.call(bob, "Input.insertText", map[string]any{"text": "and"}); err != nil {
		t.Fatal(err)
	}
	b.waitTrue(alice, "alice sees bob typing again", typingLine+` === "bob is typing…"`)
	b.run(bob, `(() => { const i = document.getElementById("body"); i.value = ""; i.dispatchEvent(new Event("input")); })()`)
	// (Repeats while he types are dropped: one goes out every 2 s.)
	b.waitTrue(alice, "alice sees bob stop (his signal, not the line's expiry)",
		typingLine+` === "" && JSON.stringify(demo.signals.map(s => s.from + ":" + s.body.typing).filter((x, i, all) => i === 0 || x !== all[i-1])) === '["bob:true","bob:false","bob:true","bob:false"]'`)

	// Read ticks: bob looks at side; alice's message in lobby is stored
	// (one tick) and unread for bob (his badge); once bob looks at lobby
	// his page marks it read, and alice's tick says so.
	b.run(bob, `document.querySelector('#rooms li[data-room="side"] button').click()`)
	b.waitTrue(bob, "bob looks at side", `demo.current === "side" && document.getElementById("current").textContent === " in side"`)
	b.run(alice, `demo.publish("hi bob", "lobby")`)
	b.waitTrue(alice, "alice's message stored, not read", tickOf("lobby", 2)+` === "✓|stored, not read yet"`)
	b.waitTrue(bob, "bob's lobby badge counts alice's message", badge("lobby")+` === "1"`)
	// Bob's own message needs no tick on alice's page, nor does it count.
	b.waitTrue(alice, "no tick on bob's message", tickOf("lobby", 1)+` === "|"`)
	b.run(bob, `document.querySelector('#rooms li[data-room="lobby"] button').click()`)
	b.waitTrue(bob, "bob's lobby badge cleared", badge("lobby")+` === "" && demo.client.rooms.get("lobby").read === 2`)
	b.waitTrue(alice, "alice's message read by bob", tickOf("lobby", 2)+` === "✓✓|read by bob"`)

	// Unread badges: alice looks at lobby while bob writes twice in side,
	// through the other node; looking at side clears it, on the node too.
	b.run(bob, `demo.publish("side one", "side"), demo.publish("side two", "side")`)
	b.waitTrue(alice, "alice's side badge counts both", badge("side")+` === "2" && `+badge("lobby")+` === ""`+
		` && document.querySelector('#rooms li[data-room="side"] button').getAttribute("aria-label") === "side, 2 unread"`)
	b.run(alice, `document.querySelector('#rooms li[data-room="side"] button').click()`)
	b.waitTrue(alice, "alice's side badge cleared, side's messages shown",
		badge("side")+` === "" && [...document.querySelectorAll("#messages li")].filter(li => !li.hidden).map(li => li.dataset.seq).join() === "1,2"`)
	// The mark reached the node: a fresh query counts nothing.
	redistest.WaitFor(t, 10*time.Second, func() error {
		u := b.await(alice, `demo.client.unread(["side", "lobby"])`)
		if m, _ := u.(map[string]any); fmt.Sprint(m["side"]) != "map[count:0 read:2 seq:2]" || fmt.Sprint(m["lobby"]) != "map[count:0 read:2 seq:2]" {
			return fmt.Errorf("unread from the node %v", u)
		}
		return nil
	})
	// And the node's count is what a reloaded page shows: one more in side
	// while alice looks at lobby, then a reload.
	b.run(alice, `demo.select("lobby")`)
	b.run(bob, `demo.publish("side three", "side")`)
	b.waitTrue(alice, "alice's side badge counts the new one", badge("side")+` === "1"`)
	// A receipts query answers the store's positions and the answering
	// node's own unwritten ones: bob's mark, made on the other node, is in
	// it once that node has written it (positions are written once a
	// second), which the reloaded page needs for its tick.
	redistest.WaitFor(t, 10*time.Second, func() error {
		r := b.await(alice, `demo.client.rooms.get("lobby").receipts().then(r => r.read)`)
		if m, _ := r.(map[string]any); m["bob"] != float64(2) {
			return fmt.Errorf("lobby's receipts from alice's node %v", r)
		}
		return nil
	})
	b.run(alice, `location.reload()`)
	b.waitTrue(alice, "the reloaded page has its rooms back with the node's counts",
		`window.demo !== undefined && demo.client !== null && demo.client.rooms.get("side") !== undefined && demo.client.rooms.get("side").joined`+
			` && `+badge("side")+` === "1" && `+badge("lobby")+` === ""`)
	// The tick survives the reload too (from the room's receipts).
	b.waitTrue(alice, "alice's message still read by bob", tickOf("lobby", 2)+` === "✓✓|read by bob"`)

	// A page out of sight marks nothing read: with alice's window
	// minimized, bob's new message in the room she looks at counts as
	// unread and his tick stays single, until the window is back.
	b.windowState(alice, "minimized")
	b.waitTrue(alice, "alice's page is hidden", `document.visibilityState === "hidden"`)
	b.run(bob, `demo.publish("are you there?", "lobby")`)
	b.waitTrue(alice, "alice's lobby badge counts it", badge("lobby")+` === "1"`)
	b.waitTrue(bob, "bob's message stored, not read", tickOf("lobby", 3)+` === "✓|stored, not read yet"`)
	b.windowState(alice, "normal")
	b.waitTrue(alice, "alice's lobby badge cleared", badge("lobby")+` === ""`)
	b.waitTrue(bob, "bob's message read by alice", tickOf("lobby", 3)+` === "✓✓|read by alice"`)
}

// windowState minimizes ("minimized") or restores ("normal") the window
// of a page.
func (b *browser) windowState(session, state string) {
	b.t.Helper()
	res, err := b.call(session, "Browser.getWindowForTarget", nil)
	if err != nil {
		b.t.Fatal(err)
	}
	var w struct {
		WindowID int `json:"windowId"`
	}
	if err := json.Unmarshal(res, &w); err != nil {
		b.t.Fatal(err)
	}
	if _, err := b.call("", "Browser.setWindowBounds", map[string]any{"windowId": w.WindowID, "bounds": map[string]any{"windowState": state}}); err != nil {
		b.t.Fatal(err)
	}
}

// itemOf is the page's item of message seq in room.
func itemOf(room string, seq int) string {
	return `document.querySelector('#messages li[data-room="` + room + `"][data-seq="` + strconv.Itoa(seq) + `"]')`
}

// reactionsOf is a message's reactions as shown: "👍 2*" for each, * when
// the reaction is the page user's own (its button pressed).
func reactionsOf(room string, seq int) string {
	return `[...` + itemOf(room, seq) + `.querySelectorAll(".reactions > *")].map(b => b.textContent + (b.getAttribute("aria-pressed") === "true" ? "*" : "")).join(" ")`
}

// click clicks the button of message seq matched by sel.
func (b *browser) click(session, room string, seq int, sel string) {
	b.t.Helper()
	b.waitTrue(session, "button "+sel+" on #"+strconv.Itoa(seq), itemOf(room, seq)+` !== null && `+itemOf(room, seq)+`.querySelector('`+sel+`') !== null`)
	b.run(session, itemOf(room, seq)+`.querySelector('`+sel+`').click()`)
}

// Edits, deletes and reactions made with the page's controls on one node
// appear on the page of the other (and, with who is typing, on a
// listen-only SSE page), applied in order as their frames arrive; a
// reload shows each message as it stands (folded history), and the
// changes are never items of their own.
func TestDemoPageChangesAcrossNodes(t *testing.T) {
	b := startBrowser(t)
	nodeA, nodeB := twoChatNodes(t)
	alice := chatPage(b, nodeA, "alice")
	bob := chatPage(b, nodeB, "bob")
	both := []string{alice, bob}
	// carol listens over SSE (the browser's EventSource) on alice's node.
	carol := b.openWindow("http://" + nodeA + "/?" + url.Values{"user": {"carol"}, "app": {"demo"}, "room": {"lobby"}, "autojoin": {"1"}, "sse": {"1"}}.Encode())
	b.waitTrue(carol, "carol listens over SSE", `window.demo !== undefined && demo.sseState.es !== null && demo.rooms.get("lobby").joined === true`)
	// Typing reaches an SSE page too (event: signal).
	b.run(bob, `document.getElementById("body").focus()`)
	if _, err := b.call(bob, "Input.insertText", map[string]any{"text": "helo"}); err != nil {
		t.Fatal(err)
	}
	b.waitTrue(carol, "carol sees bob typing over SSE", typingLine+` === "bob is typing…"`)
	b.run(bob, `(() => { const i = document.getElementById("body"); i.value = ""; i.dispatchEvent(new Event("input")); })()`)
	b.waitTrue(carol, "carol sees bob stop", typingLine+` === "" && demo.signals.length === 2`)

	b.run(bob, `demo.publish("helo", "lobby")`)
	for _, p := range append(both, carol) {
		b.waitTrue(p, "bob's message shown", pageMessages+` === "1 #1 lobby bob: helo"`)
	}
	// Only the sender may edit or delete: alice's page offers neither.
	b.waitTrue(alice, "no edit or delete on another's message",
		itemOf("lobby", 1)+`.querySelector('button[data-act="edit"], button[data-act="delete"]') === null`+
			` && `+itemOf("lobby", 1)+`.querySelector('.actions button[data-act="react"]') !== null`)

	// bob fixes his message with the editor (Enter saves).
	b.click(bob, "lobby", 1, `button[data-act="edit"]`)
	b.run(bob, `(() => { const i = `+itemOf("lobby", 1)+`.querySelector("input.editor"); i.value = "hello"; i.dispatchEvent(new KeyboardEvent("keydown", {key: "Enter", bubbles: true})); })()`)
	for _, p := range append(both, carol) {
		b.waitTrue(p, "the edit shown", pageMessages+` === "1 #1 lobby bob: hello" && `+itemOf("lobby", 1)+`.querySelector(".edited").textContent === " (edited)"`)
	}

	// Reactions: alice 👍, bob too (on her chip), alice takes hers back.
	b.click(alice, "lobby", 1, `.actions button[data-r="👍"]`)
	b.waitTrue(bob, "alice's reaction reaches bob", reactionsOf("lobby", 1)+` === "👍 1"`)
	b.waitTrue(alice, "alice's own reaction pressed", reactionsOf("lobby", 1)+` === "👍 1*"`)
	b.click(bob, "lobby", 1, `.reactions button[data-r="👍"]`)
	b.waitTrue(alice, "bob's reaction counted", reactionsOf("lobby", 1)+` === "👍 2*"`)
	b.waitTrue(bob, "bob's reaction pressed", reactionsOf("lobby", 1)+` === "👍 2*"`)
	b.click(alice, "lobby", 1, `.reactions button[data-r="👍"]`)
	b.waitTrue(bob, "alice's reaction taken back", reactionsOf("lobby", 1)+` === "👍 1*"`)
	b.waitTrue(alice, "alice's chip no longer pressed", reactionsOf("lobby", 1)+` === "👍 1"`)
	b.waitTrue(carol, "the reactions reach the SSE page, without controls", reactionsOf("lobby", 1)+` === "👍 1" && `+itemOf("lobby", 1)+`.querySelector("button") === null`)

	// bob deletes it: gone on both pages, without controls.
	b.click(bob, "lobby", 1, `button[data-act="delete"]`)
	for _, p := range append(both, carol) {
		b.waitTrue(p, "the delete shown", pageMessages+` === "1 #1 lobby bob: message deleted"`+
			` && `+itemOf("lobby", 1)+`.classList.contains("deleted") && `+itemOf("lobby", 1)+`.querySelector("button") === null`)
	}

	// Changes in a row apply in order: two edits, the last one stands.
	b.run(bob, `demo.publish("second", "lobby")`)
	b.waitTrue(alice, "bob's second message shown", pageMessages+` === "1 #1 lobby bob: message deleted\n7 #7 lobby bob: second"`)
	b.run(bob, `demo.client.rooms.get("lobby").edit(7, "second, edited once"), demo.client.rooms.get("lobby").edit(7, "second, edited twice")`)
	b.click(alice, "lobby", 7, `.actions button[data-r="🎉"]`)
	b.waitTrue(alice, "both edits and the reaction applied", pageMessages+` === "1 #1 lobby bob: message deleted\n7 #7 lobby bob: second, edited twice"`+
		` && `+reactionsOf("lobby", 7)+` === "🎉 1*"`)

	// A reload shows each message as it stands, from folded history.
	b.run(alice, `location.reload()`)
	b.waitTrue(alice, "the reloaded page shows the messages as they stand",
		`window.demo !== undefined && demo.client !== null && demo.client.rooms.get("lobby") !== undefined && demo.client.rooms.get("lobby").joined`+
			` && `+pageMessages+` === "1 #1 lobby bob: message deleted\n7 #7 lobby bob: second, edited twice"`+
			` && `+itemOf("lobby", 7)+`.querySelector(".edited").textContent === " (edited)" && `+reactionsOf("lobby", 7)+` === "🎉 1"`)
	// Folded history does not say whose a reaction is: alice's click
	// reacts again, which the node acks without storing a second one, and
	// the page then knows it as hers; the next click takes it back.
	b.click(alice, "lobby", 7, `.reactions button[data-r="🎉"]`)
	b.waitTrue(alice, "alice's reaction known as hers, counted once", reactionsOf("lobby", 7)+` === "🎉 1*"`)
	b.click(alice, "lobby", 7, `.reactions button[data-r="🎉"]`)
	b.waitTrue(bob, "alice's reaction taken back", reactionsOf("lobby", 7)+` === "" && `+itemOf("lobby", 7)+`.querySelector('.actions button[data-r="🎉"]') !== null`)
	b.waitTrue(alice, "alice's page offers it again", reactionsOf("lobby", 7)+` === "" && `+itemOf("lobby", 7)+`.querySelector('.actions button[data-r="🎉"]') !== null`)
}
