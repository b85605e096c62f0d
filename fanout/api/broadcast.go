package api

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"unicode/utf8"

	"github.com/roost-chat/roost/fanout"
	"github.com/roost-chat/roost/fanout/tenancy"
	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
)

// POST /v1/apps/{app}/broadcast: one body to many rooms, each room's
// message an ordinary publish (docs/protocol.md, Server API additions).

// MaxBroadcastRooms bounds the rooms of one broadcast.
const MaxBroadcastRooms = 1000

// broadcastRoomBytes is what one room may take in a request's rooms list:
// a name of at most 129 characters, its quotes and a comma, and some
// white space.
const broadcastRoomBytes = 136

// broadcastRequest is a broadcast request's JSON. The body is kept as
// sent.
type broadcastRequest struct {
	Rooms *[]string       `json:"rooms"`
	ID    *string         `json:"id"`
	From  *string         `json:"from"`
	Body  json.RawMessage `json:"body"`
}

// broadcastMsg is a broadcast that parseBroadcast accepted.
type broadcastMsg struct {
	rooms    []string // distinct, valid, 1 to MaxBroadcastRooms
	id, from string
	body     []byte // aliases the request
}

// refusal is why a request is answered with an error: its HTTP status,
// code and reason.
type refusal struct {
	status int
	code   proto.Code
	msg    string
}

func badRequest(msg string) *refusal {
	return &refusal{http.StatusBadRequest, proto.CodeBadRequest, msg}
}

// parseBroadcast checks a broadcast request's body (maxMsg: the app's
// largest message body, 0: no bound). Nothing is published for a refused
// one.
func parseBroadcast(raw []byte, maxMsg int64) (broadcastMsg, *refusal) {
	// As for a publish: text frames carry only valid UTF-8, and JSON
	// depth is bounded as for WebSocket frames.
	if !utf8.Valid(raw) {
		return broadcastMsg{}, badRequest("request body is not valid UTF-8")
	}
	if proto.CheckValue(raw, 0) == proto.ErrTooDeep {
		return broadcastMsg{}, badRequest("request body: " + proto.ErrTooDeep.Message)
	}
	var req broadcastRequest
	if err := json.Unmarshal(raw, &req); err != nil {
		return broadcastMsg{}, badRequest("request body is not a JSON object of rooms, id, from and body: " + err.Error())
	}
	switch {
	case req.Rooms == nil || len(*req.Rooms) == 0:
		return broadcastMsg{}, badRequest("rooms must be a list of 1 to 1000 room names")
	case len(*req.Rooms) > MaxBroadcastRooms:
		return broadcastMsg{}, badRequest("at most 1000 rooms per broadcast, " + strconv.Itoa(len(*req.Rooms)) + " given: split it; nothing was published")
	case req.ID == nil || !proto.ValidID([]byte(*req.ID)):
		return broadcastMsg{}, badRequest("id must be a string of 1 to 64 characters")
	case req.From == nil || !proto.ValidUser([]byte(*req.From)):
		return broadcastMsg{}, badRequest("from must be a user id: 1 to 128 characters without control characters")
	case len(req.Body) == 0:
		return broadcastMsg{}, badRequest("missing body")
	case maxMsg > 0 && int64(len(req.Body)) > maxMsg:
		return broadcastMsg{}, &refusal{http.StatusRequestEntityTooLarge, proto.CodeTooLarge, "message body larger than the app's max-msg"}
	}
	rooms := *req.Rooms
	seen := make(map[string]struct{}, len(rooms))
	for _, room := range rooms {
		if !proto.ValidRoom([]byte(room)) {
			return broadcastMsg{}, badRequest("invalid room name " + strconv.Quote(room) + ": want [A-Za-z0-9_.:-]{1,128}, or an inbox @user; nothing was published")
		}
		if _, dup := seen[room]; dup {
			return broadcastMsg{}, badRequest("room " + strconv.Quote(room) + " listed twice; nothing was published")
		}
		seen[room] = struct{}{}
	}
	return broadcastMsg{rooms: rooms, id: *req.ID, from: *req.From, body: req.Body}, nil
}

// answers is the fanout.Origin of one broadcast's publishes: the publish
// workers signal each outcome (in its PubRequest), the request's goroutine
// counts them.
type answers chan struct{}

func (c answers) Published(*fanout.PubRequest) {
	c <- struct{}{} // buffered for every room: never blocks
}

// broadcast publishes one message per room, all submitted into the
// publish pool at once so that they share its group commits (each
// worker's batch takes the rooms it owns), each an ordinary publish: its
// own seq, the room's order, delivery, webhooks, and the (from, id)
// idempotency per room, so a retried broadcast stores nothing again and
// is answered with the same seqs. It counts as one API request per room
// against --api-rate.
func (s *Server) broadcast(w http.ResponseWriter, r *http.Request) {
	const route = RouteBroadcast
	t, ok := s.admit(w, r, route)
	if !ok {
		return
	}
	limit := int64(maxRequest)
	if t.app.MaxMsg > 0 {
		limit = t.app.MaxMsg + envelope + MaxBroadcastRooms*broadcastRoomBytes
	}
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			s.fail(w, route, http.StatusRequestEntityTooLarge, proto.CodeTooLarge, "request larger than the app's max-msg and 1000 rooms allow")
			return
		}
		s.fail(w, route, http.StatusBadRequest, proto.CodeBadRequest, "cannot read the request body")
		return
	}
	b, bad := parseBroadcast(raw, t.app.MaxMsg)
	if bad != nil {
		s.fail(w, route, bad.status, bad.code, bad.msg)
		return
	}
	// The request took one from the app's bucket (admit); each further
	// room takes one more, all at once or none.
	if n := int64(len(b.rooms)); n > 1 {
		if !s.rate.Fits(n) {
			s.fail(w, route, http.StatusBadRequest, proto.CodeBadRequest,
				"a broadcast to "+strconv.FormatInt(n, 10)+" rooms counts as as many API requests, more than --api-burst allows at once ("+strconv.Itoa(s.cfg.Burst)+"): broadcast to fewer rooms at a time; nothing was published")
			return
		}
		if wait := t.req.TakeN(tenancy.Now(), s.rate, n-1); wait > 0 {
			s.failRetry(w, route, http.StatusTooManyRequests, proto.CodeRateLimited,
				"request rate of this app exceeded (--api-rate; a broadcast counts one request per room): retry after retry_after ms; nothing was published", tenancy.RetryAfterMS(wait))
			return
		}
	}
	n := len(b.rooms)
	done := make(answers, n)
	reqs := make([]fanout.PubRequest, n)
	id := []byte(b.id)
	submitted := 0
	var pubErr error
	for i, room := range b.rooms {
		reqs[i] = fanout.PubRequest{
			// Every row shares id and body: the store only reads them,
			// and the frame is encoded into the publish worker's arena.
			Row:    persist.Row{Key: proto.RoomKey(t.app.ID, room), From: b.from, ID: id, Body: b.body},
			Origin: done,
		}
		if pubErr = s.fan.Publish(&reqs[i]); pubErr != nil {
			break
		}
		submitted++
	}
	for range submitted {
		select {
		case <-done:
		case <-r.Context().Done():
			// The caller left; the publishes complete anyway, and a retry
			// with the same id gets their seqs.
			return
		}
	}
	failed := n - submitted
	var first error
	for i := range reqs[:submitted] {
		switch res := &reqs[i].Stored; {
		case res.Err != nil:
			failed++
			if first == nil {
				first = res.Err
			}
		case res.Duplicate:
			s.Stats.Duplicates.Add(1)
		default:
			s.Stats.Published.Add(1)
		}
	}
	out := make([]byte, 0, 64+n*32)
	if failed > 0 {
		var f refusal
		var retryMS int64
		if pubErr != nil && first == nil {
			f, retryMS = refusal{http.StatusServiceUnavailable, proto.CodeOverloaded, "publish queue full"}, 1000
			if errors.Is(pubErr, proto.ErrClosed) {
				f.msg = "node shutting down"
			}
		} else {
			f, retryMS = storeRefusal(first)
		}
		f.msg = strconv.Itoa(failed) + " of " + strconv.Itoa(n) + " rooms not published (" + f.msg + "); the others are: retry with the same id, which stores nothing twice"
		s.Stats.Requests[route][f.code].Add(1)
		if f.status == http.StatusInternalServerError {
			s.log.Warn("server API: broadcast: store error", "app", t.app.ID, "err", first)
		}
		var e apiError
		e.Error.Code, e.Error.Message, e.Error.RetryAfter = f.code.String(), f.msg, retryMS
		eb, _ := json.Marshal(&e)
		out = append(out, eb[:len(eb)-1]...) // the object, open
		out = appendResults(append(out, `,"results":`...), b.rooms, reqs, submitted)
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("X-Content-Type-Options", "nosniff")
		if retryMS > 0 {
			h.Set("Retry-After", strconv.FormatInt((retryMS+999)/1000, 10))
		}
		w.WriteHeader(f.status)
		_, _ = w.Write(append(out, "}\n"...))
		return
	}
	out = appendResults(append(out, `{"results":`...), b.rooms, reqs, submitted)
	s.ok(w, route, append(out, '}'))
}

// appendResults appends the results list: per room its seq, or its error
// (not submitted: not published, the queue was full).
func appendResults(out []byte, rooms []string, reqs []fanout.PubRequest, submitted int) []byte {
	out = append(out, '[')
	for i, room := range rooms {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, `{"room":`...)
		out = strconv.AppendQuote(out, room) // room names are plain ASCII
		switch {
		case i >= submitted:
			out = append(out, `,"error":{"code":"overloaded","message":"not published: retry"}}`...)
		case reqs[i].Err != nil:
			f, _ := storeRefusal(reqs[i].Err)
			out = append(out, `,"error":{"code":`...)
			out = append(out, quote(f.code.String())...)
			out = append(out, `,"message":`...)
			out = append(out, quote(f.msg)...)
			out = append(out, `}}`...)
		default:
			out = append(out, `,"seq":`...)
			out = strconv.AppendUint(out, reqs[i].Seq, 10)
			out = append(out, '}')
		}
	}
	return append(out, ']')
}

// storeRefusal is how a room's publish error is answered, as storeFail
// answers a publish's.
func storeRefusal(err error) (refusal, int64) {
	switch {
	case errors.Is(err, proto.ErrRoomLimit):
		return refusal{http.StatusForbidden, proto.CodeForbidden, "the app has its maximum of rooms"}, 0
	case errors.Is(err, proto.ErrOverloaded), errors.Is(err, proto.ErrClosed), errors.Is(err, context.DeadlineExceeded):
		return refusal{http.StatusServiceUnavailable, proto.CodeOverloaded, "store unavailable: retry later"}, 1000
	default:
		return refusal{http.StatusInternalServerError, proto.CodeInternal, "internal error"}, 0
	}
}
