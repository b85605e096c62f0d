package proto

import (
	"fmt"
	"strconv"
)

// Connection events (docs/protocol.md, Connection events): an app's
// webhook may receive, besides its messages, who joined and left its rooms
// (presence) and who came online and went offline (connection). Each kind
// is named in Webhook.Events.
const (
	WebhookEventMsg        = "msg"        // the app's messages (the default)
	WebhookEventPresence   = "presence"   // joined, left: a user's first connection in a room, the end of its last one
	WebhookEventConnection = "connection" // online, offline: a user's first connection to the app, the end of its last one
)

// Reserved room names: no client or API request can name them (ValidRoom
// refuses '~'), so they can never meet a real room.
const (
	// EventsRoom is the log of an app's connection events: each event is
	// stored as a message of app/~events (its body the event's JSON), so
	// that the webhook pipeline delivers it as it does messages: durably
	// with PostgreSQL, per app in commit order, at least once.
	EventsRoom = "~events"
	// OnlineRoom is the presence key of an app's connected users
	// (app/~online): a user is "in" it while it has a connection to the
	// app, so that online and offline follow the presence rules (grace,
	// leases) exactly as joined and left do.
	OnlineRoom = "~online"
)

// ConnEvent is a kind of connection event, as its "type" says.
type ConnEvent uint8

const (
	EventOnline ConnEvent = iota + 1
	EventJoined
	EventLeft
	EventOffline
)

var connEventNames = [...]string{EventOnline: "online", EventJoined: "joined", EventLeft: "left", EventOffline: "offline"}

func (e ConnEvent) String() string {
	if int(e) < len(connEventNames) && e > 0 {
		return connEventNames[e]
	}
	return "ConnEvent(" + strconv.Itoa(int(e)) + ")"
}

// AppendConnEvent appends one event's JSON object:
// {"type":"joined","room":"r","user":"bob","ts":MS} for joined and left,
// {"type":"online","user":"bob","ts":MS} for online and offline. Room
// names and user ids are appended escaped.
func AppendConnEvent(dst []byte, e ConnEvent, room, user string, ts int64) []byte {
	dst = append(dst, `{"type":"`...)
	dst = append(dst, e.String()...)
	dst = append(dst, '"')
	if e == EventJoined || e == EventLeft {
		dst = append(dst, `,"room":`...)
		dst = appendQuoted(dst, room)
	}
	dst = append(dst, `,"user":`...)
	dst = appendQuoted(dst, user)
	dst = append(dst, `,"ts":`...)
	dst = strconv.AppendInt(dst, ts, 10)
	return append(dst, '}')
}

// EventPrefix starts every webhook event object that is not a message
// (a connection event); a message's starts with {"type":"msg",.
const EventPrefix = `{"type":"`

// WantsMsgs reports whether the webhook receives the app's messages.
func (w *Webhook) WantsMsgs() bool { return len(w.Events) == 0 || w.has(WebhookEventMsg) }

// WantsPresence reports whether the webhook receives joined and left.
func (w *Webhook) WantsPresence() bool { return w.has(WebhookEventPresence) }

// WantsConnection reports whether the webhook receives online and offline.
func (w *Webhook) WantsConnection() bool { return w.has(WebhookEventConnection) }

func (w *Webhook) has(kind string) bool {
	for _, e := range w.Events {
		if e == kind {
			return true
		}
	}
	return false
}

// Wants reports whether the webhook is owed what is committed in room:
// the events room when it wants connection events of either kind, another
// room when it wants messages and its patterns match the room.
func (w *Webhook) Wants(room string) bool {
	if room == EventsRoom {
		return w.WantsPresence() || w.WantsConnection()
	}
	return w.WantsMsgs() && w.Matches(room)
}

// WantsEvent reports whether the webhook wants the event e of room (""
// for online and offline): joined and left of the rooms its patterns
// match, when it wants presence; online and offline when it wants
// connection.
func (w *Webhook) WantsEvent(e ConnEvent, room string) bool {
	if e == EventOnline || e == EventOffline {
		return w.WantsConnection()
	}
	return w.WantsPresence() && w.Matches(room)
}

func (w *Webhook) validateEvents() error {
	seen := map[string]bool{}
	for _, e := range w.Events {
		switch e {
		case WebhookEventMsg, WebhookEventPresence, WebhookEventConnection:
		default:
			return fmt.Errorf("webhook event kind %q: want msg, presence or connection", e)
		}
		if seen[e] {
			return fmt.Errorf("webhook event kind %q given twice", e)
		}
		seen[e] = true
	}
	return nil
}
