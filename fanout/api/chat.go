package api

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/roost-chat/roost/fanout"
	"github.com/roost-chat/roost/proto"
)

// readRequest is PUT .../users/{user}/read: the read op's fields.
type readRequest struct {
	Room *string          `json:"room"`
	Seq  *json.RawMessage `json:"seq"`
}

// markRead sets a user's read position as the read op does, answered with
// the resulting position.
func (s *Server) markRead(w http.ResponseWriter, r *http.Request) {
	const route = RouteChat
	t, user, ok := s.userOf(w, r, route)
	if !ok {
		return
	}
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 4096))
	if err != nil {
		s.fail(w, route, http.StatusBadRequest, proto.CodeBadRequest, "cannot read the request body (at most 4 KiB)")
		return
	}
	var req readRequest
	if err := json.Unmarshal(raw, &req); err != nil {
		s.fail(w, route, http.StatusBadRequest, proto.CodeBadRequest, "request body is not a JSON object of room and seq: "+err.Error())
		return
	}
	if req.Room == nil || !proto.ValidRoom([]byte(*req.Room)) {
		s.fail(w, route, http.StatusBadRequest, proto.CodeBadRequest, "room must match [A-Za-z0-9_.:-]{1,128}, or be an inbox")
		return
	}
	var seq uint64
	if req.Seq == nil {
		s.fail(w, route, http.StatusBadRequest, proto.CodeBadRequest, "missing seq")
		return
	}
	if seq, err = strconv.ParseUint(string(*req.Seq), 10, 64); err != nil {
		s.fail(w, route, http.StatusBadRequest, proto.CodeBadRequest, "seq must be a non-negative integer")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	pos, err := s.fan.MarkRead(ctx, proto.RoomKey(t.app.ID, *req.Room), user, seq)
	switch {
	case errors.Is(err, fanout.ErrReadBeyond):
		s.fail(w, route, http.StatusBadRequest, proto.CodeBadRequest, err.Error())
		return
	case err != nil:
		s.storeFail(w, route, err)
		return
	}
	b := append([]byte(`{"room":`), quote(*req.Room)...)
	b = append(b, `,"seq":`...)
	b = strconv.AppendUint(b, pos, 10)
	s.ok(w, route, append(b, '}'))
}

// unread answers a user's unread counts in the rooms named by the room
// parameters, as the unread op's rooms object.
func (s *Server) unread(w http.ResponseWriter, r *http.Request) {
	const route = RouteChat
	t, user, ok := s.userOf(w, r, route)
	if !ok {
		return
	}
	rooms := r.URL.Query()["room"]
	if len(rooms) == 0 || len(rooms) > proto.MaxUnreadRooms {
		s.fail(w, route, http.StatusBadRequest, proto.CodeBadRequest, "name 1 to 100 rooms with room=")
		return
	}
	for _, room := range rooms {
		if !proto.ValidRoom([]byte(room)) {
			s.fail(w, route, http.StatusBadRequest, proto.CodeBadRequest, "invalid room name: "+strconv.Quote(room))
			return
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	obj, err := s.fan.Unread(ctx, t.app.ID, user, rooms)
	if err != nil {
		s.storeFail(w, route, err)
		return
	}
	s.ok(w, route, obj)
}
