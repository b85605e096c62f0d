package proto

import (
	"encoding/json"
	"testing"
)

func TestAppendConnEvent(t *testing.T) {
	for _, c := range []struct {
		e          ConnEvent
		room, user string
		want       string
	}{
		{EventJoined, "lobby", "bob", `{"type":"joined","room":"lobby","user":"bob","ts":1764484800123}`},
		{EventLeft, "@bob", "bob", `{"type":"left","room":"@bob","user":"bob","ts":1764484800123}`},
		{EventOnline, "", "bob", `{"type":"online","user":"bob","ts":1764484800123}`},
		{EventOffline, "ignored", `a"b\`, `{"type":"offline","user":"a\"b\\","ts":1764484800123}`},
	} {
		got := string(AppendConnEvent(nil, c.e, c.room, c.user, 1764484800123))
		if got != c.want {
			t.Errorf("%v: %s, want %s", c.e, got, c.want)
		}
		if !json.Valid([]byte(got)) {
			t.Errorf("%v: not JSON: %s", c.e, got)
		}
	}
}

// Which kinds a webhook gets: msg alone by default; the events room only
// with presence or connection; joined and left only of matching rooms.
func TestWebhookWants(t *testing.T) {
	def := &Webhook{URL: "http://x/", Rooms: []string{"team-*"}}
	if !def.Wants("team-a") || def.Wants("lobby") || def.Wants(EventsRoom) || def.WantsEvent(EventJoined, "team-a") || def.WantsEvent(EventOnline, "") {
		t.Fatal("default webhook")
	}
	w := &Webhook{URL: "http://x/", Rooms: []string{"team-*"}, Events: []string{WebhookEventPresence}}
	if w.Wants("team-a") || !w.Wants(EventsRoom) || !w.WantsEvent(EventLeft, "team-a") || w.WantsEvent(EventJoined, "lobby") || w.WantsEvent(EventOffline, "") {
		t.Fatal("presence only")
	}
	c := &Webhook{URL: "http://x/", Events: []string{WebhookEventMsg, WebhookEventConnection}}
	if !c.Wants("lobby") || !c.Wants(EventsRoom) || c.WantsEvent(EventJoined, "lobby") || !c.WantsEvent(EventOnline, "") || !c.WantsEvent(EventOffline, "") {
		t.Fatal("msg and connection")
	}
	for _, bad := range [][]string{{"typing"}, {"msg", "msg"}, {""}} {
		a := App{ID: "a", Secret: "0123456789abcdef", Webhook: &Webhook{URL: "http://x/", Events: bad}}
		if err := a.Validate(); err == nil {
			t.Errorf("events %q accepted", bad)
		}
	}
	if ValidRoom([]byte(EventsRoom)) || ValidRoom([]byte(OnlineRoom)) {
		t.Fatal("a reserved room name is a valid room")
	}
}
