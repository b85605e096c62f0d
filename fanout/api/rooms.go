package api

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
)

// An app's rooms listed by name, and a room's users (docs/protocol.md,
// Server API additions).

const (
	// defaultRoomsLimit is a listing's page without limit=; maxRoomsLimit
	// its largest (a larger limit counts as this, as history's does).
	defaultRoomsLimit = 100
	maxRoomsLimit     = 1000
	// readWait bounds the store and presence reads of one answer.
	readWait = 5 * time.Second
)

// validPrefix reports whether p can start a room name: empty, "@", or a
// room name's first characters.
func validPrefix(p string) bool {
	return p == "" || p == "@" || proto.ValidRoom([]byte(p))
}

// listRooms answers GET /v1/apps/{app}/rooms?prefix=P&after=NAME&limit=L:
// the app's rooms by name (byte order), each with its newest seq and its
// presence count on every node, one store read and one presence round
// trip per page.
func (s *Server) listRooms(w http.ResponseWriter, r *http.Request) {
	const route = RouteRooms
	t, ok := s.admit(w, r, route)
	if !ok {
		return
	}
	q := r.URL.Query()
	prefix, after := q.Get("prefix"), q.Get("after")
	limit, hasLimit, err := uintParam(r, "limit")
	switch {
	case err != nil || hasLimit && limit < 1:
		s.fail(w, route, http.StatusBadRequest, proto.CodeBadRequest, "limit must be an integer of at least 1 (above 1000 counts as 1000)")
		return
	case !validPrefix(prefix):
		s.fail(w, route, http.StatusBadRequest, proto.CodeBadRequest, "prefix must be the start of a room name: [A-Za-z0-9_.:-], after an optional @, at most 129 characters")
		return
	case after != "" && !proto.ValidRoom([]byte(after)):
		s.fail(w, route, http.StatusBadRequest, proto.CodeBadRequest, "after must be a room name (the last room of the previous page): want [A-Za-z0-9_.:-]{1,128}")
		return
	}
	if !hasLimit {
		limit = defaultRoomsLimit
	}
	lister, ok := s.store.(persist.RoomLister)
	if !ok {
		s.fail(w, route, http.StatusNotImplemented, proto.CodeInternal, "this node's store cannot list rooms")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), readWait)
	defer cancel()
	rooms, more, err := lister.ListRooms(ctx, t.app.ID, prefix, after, int(min(limit, maxRoomsLimit)))
	if err != nil {
		s.storeFail(w, route, err)
		return
	}
	keys := make([]string, len(rooms))
	for i := range rooms {
		keys[i] = proto.RoomKey(t.app.ID, rooms[i].Name)
	}
	counts := make([]int, len(rooms))
	if err := s.fan.PresenceCounts(ctx, keys, counts); err != nil {
		s.log.Warn("server API: cannot read rooms' presence", "app", t.app.ID, "err", err)
		s.failRetry(w, route, http.StatusServiceUnavailable, proto.CodeOverloaded, "cannot read the rooms' presence now: retry", 1000)
		return
	}
	out := make([]byte, 0, 64+len(rooms)*64)
	out = append(out, `{"rooms":[`...)
	for i := range rooms {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, `{"room":`...)
		out = strconv.AppendQuote(out, rooms[i].Name) // room names are plain ASCII
		out = append(out, `,"seq":`...)
		out = strconv.AppendUint(out, rooms[i].Last, 10)
		out = append(out, `,"presence":{"count":`...)
		out = strconv.AppendInt(out, int64(counts[i]), 10)
		out = append(out, `}}`...)
	}
	out = append(out, `],"more":`...)
	out = strconv.AppendBool(out, more)
	s.ok(w, route, append(out, '}'))
}

// presence answers GET /v1/apps/{app}/rooms/{room}/presence: the room's
// distinct users on every node, as the presence command counts them, with
// at most 1000 names (sorted) and more:true when there are others.
func (s *Server) presence(w http.ResponseWriter, r *http.Request) {
	const route = RoutePresence
	t, room, ok := s.roomOf(w, r, route)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), readWait)
	defer cancel()
	count, users, err := s.fan.PresenceUsers(ctx, proto.RoomKey(t.app.ID, room))
	if err != nil {
		s.log.Warn("server API: cannot read a room's presence", "app", t.app.ID, "room", room, "err", err)
		s.failRetry(w, route, http.StatusServiceUnavailable, proto.CodeOverloaded, "cannot read the room's presence now: retry", 1000)
		return
	}
	out := append([]byte(`{"room":`), quote(room)...)
	out = append(out, `,"count":`...)
	out = strconv.AppendInt(out, int64(count), 10)
	out = append(out, `,"users":[`...)
	for i, u := range users {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, quote(u)...)
	}
	out = append(out, `],"more":`...)
	out = strconv.AppendBool(out, count > len(users))
	s.ok(w, route, append(out, '}'))
}
