// Package api is the server API: HTTP/1.1 JSON for an app's backend, on
// its own listener (docs/protocol.md, "Server API"). A backend keeps a few
// long-lived connections, so this is a plain net/http server, not the event
// loops; its publishes enter the same publish path as a socket's
// (fanout.Node.Publish), with the API as their fanout.Origin.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/roost-chat/roost/fanout"
	"github.com/roost-chat/roost/fanout/hist"
	"github.com/roost-chat/roost/fanout/tenancy"
	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
)

// Config is the API's settings.
type Config struct {
	// Rate is the requests per second one app may make on this node, all
	// routes together (0: no limit); Burst is how many it may make at
	// once.
	Rate  float64
	Burst int
	// MaxMsg is the default largest message body in bytes; an app's
	// max_msg in the registry overrides it (0: no bound but MaxRequest).
	MaxMsg int64
	// Static are the apps of --app-secret: id -> secret, served until
	// SetApps hands over the node's snapshot (which holds them too).
	Static map[string][]byte
	// Edge budgets the listener (edge.go); zero fields take the defaults.
	Edge Edge
	// Dev admits requests without a secret from loopback peers, for any
	// app, made on first use (at most DevMaxApps; 0: no cap): a node in
	// development mode whose API listens on loopback (dev.go).
	Dev        bool
	DevMaxApps int
}

// envelope is what a publish request may hold beyond its body: the id,
// the sender and the JSON around them.
const envelope = 4 << 10

// maxRequest bounds a publish request whose app has no max_msg.
const maxRequest = 16 << 20

// historyBytes bounds one history answer, as the socket's history is
// bounded: the answer says "more" when it stopped early.
const historyBytes = 1 << 20

// disconnectWait is how long a disconnect waits for this node's loops.
const disconnectWait = 2 * time.Second

// Parts are what the API is built on.
type Parts struct {
	Fan   *fanout.Node
	Store persist.Store
	// Disconnect closes the open connections of user of app on this node
	// with 1008 "disconnected" and returns how many it closed.
	Disconnect func(app, user string, wait time.Duration) int
	Log        *slog.Logger
}

// Routes, counted in Stats.
const (
	RoutePublish = iota
	RouteHistory
	RouteRoom
	RouteDisconnect
	RouteChat      // a user's read positions and unread counts
	RouteRooms     // an app's rooms listed (rooms.go)
	RoutePresence  // a room's users (rooms.go)
	RouteBroadcast // one message to many rooms (broadcast.go)
	RouteOther     // no such route
	numRoutes
)

// RouteNames label the routes in metrics.
var RouteNames = [numRoutes]string{"publish", "history", "room", "disconnect", "chat", "rooms", "presence", "broadcast", "other"}

// Answer codes counted per route: 0 is a 2xx answer, the others are the
// error codes (proto.Code values).
const numCodes = int(proto.CodeInternal) + 1

// CodeNames label the answers in metrics.
var CodeNames = func() [numCodes]string {
	var n [numCodes]string
	n[0] = "ok"
	for c := proto.CodeBadRequest; c <= proto.CodeInternal; c++ {
		n[c] = c.String()
	}
	return n
}()

// Stats are the API's counters.
type Stats struct {
	Requests     [numRoutes][numCodes]atomic.Uint64
	Published    atomic.Uint64 // messages stored through the API
	Duplicates   atomic.Uint64 // publishes answered with the seq of an earlier one
	Disconnected atomic.Uint64 // connections this node closed for its own disconnect calls (the "closed" answers)
}

// Server serves the API. Build it with New, serve Handler.
type Server struct {
	cfg   Config
	fan   *fanout.Node
	store persist.Store
	disc  func(app, user string, wait time.Duration) int
	log   *slog.Logger
	pubLa *hist.Histogram // seconds from a publish request read to its commit answered (roost_api_publish_seconds)

	rate tenancy.Rate // of each app's requests, all routes together

	mu   sync.RWMutex
	apps map[string]*tenant
	dev  map[string]*tenant // apps made on first use in development mode

	mux       *http.ServeMux
	edge      edge
	Stats     Stats
	EdgeStats EdgeStats
}

// tenant is one app as the API knows it: the view the client edges read
// too, and its request bucket.
type tenant struct {
	app *tenancy.View
	req *tenancy.Bucket // kept across registry changes
}

// New builds the API. SetApps gives it the registry.
func New(cfg Config, p Parts) *Server {
	s := &Server{cfg: cfg, fan: p.Fan, store: p.Store, disc: p.Disconnect, log: p.Log, pubLa: hist.New("roost_api_publish_seconds", hist.LatencyBuckets), apps: map[string]*tenant{}, dev: map[string]*tenant{},
		rate: tenancy.NewRate(cfg.Rate, int64(max(1, cfg.Burst)))}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.edge.init(cfg.Edge)
	// The static apps until the node hands its registry's snapshot over
	// (SetApps); a node without a registry hands the same one.
	s.SetApps(tenancy.NewSnapshot(tenancy.Limits{MaxMsg: cfg.MaxMsg}, cfg.Static, nil))
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/apps/{app}/rooms/{room}/messages", s.publish)
	mux.HandleFunc("GET /v1/apps/{app}/rooms/{room}/messages", s.history)
	mux.HandleFunc("GET /v1/apps/{app}/rooms/{room}", s.room)
	mux.HandleFunc("POST /v1/apps/{app}/users/{user}/disconnect", s.disconnect)
	mux.HandleFunc("POST /v1/apps/{app}/users/{user}/messages", s.publish) // into the user's inbox, "@user"
	mux.HandleFunc("PUT /v1/apps/{app}/users/{user}/read", s.markRead)
	mux.HandleFunc("GET /v1/apps/{app}/users/{user}/unread", s.unread)
	mux.HandleFunc("GET /v1/apps/{app}/rooms", s.listRooms)
	mux.HandleFunc("GET /v1/apps/{app}/rooms/{room}/presence", s.presence)
	mux.HandleFunc("POST /v1/apps/{app}/broadcast", s.broadcast)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.refuseUnauthenticated(w, r, RouteOther, http.StatusNotFound, proto.CodeNotFound, "no such route: "+r.Method+" "+r.URL.Path+" (see the Server API in docs/protocol.md)")
	})
	s.mux = mux
	return s
}

// Handler is the API's HTTP handler.
func (s *Server) Handler() http.Handler { return http.HandlerFunc(s.serveHTTP) }

// SetApps installs a snapshot of the registry (any goroutine): the same
// one the client edges are handed, so an app's view here is theirs. An app
// keeps its rate bucket across changes.
func (s *Server) SetApps(snap *tenancy.Snapshot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := make(map[string]*tenant, len(snap.Entries))
	for _, e := range snap.Entries {
		next[e.App.ID] = newTenant(e.View, s.apps[e.App.ID])
	}
	s.apps = next
}

// newTenant is an app as the API serves it; it keeps old's rate bucket.
func newTenant(v *tenancy.View, old *tenant) *tenant {
	t := &tenant{app: v, req: new(tenancy.Bucket)}
	if old != nil {
		t.req = old.req // the request bucket outlives registry changes
	}
	return t
}

// apiError is the body of every error answer.
type apiError struct {
	Error struct {
		Code       string `json:"code"`
		Message    string `json:"message"`
		RetryAfter int64  `json:"retry_after,omitempty"` // ms, rate_limited only
	} `json:"error"`
}

func (s *Server) fail(w http.ResponseWriter, route, status int, code proto.Code, msg string) {
	s.failRetry(w, route, status, code, msg, 0)
}

func (s *Server) failRetry(w http.ResponseWriter, route, status int, code proto.Code, msg string, retryMS int64) {
	s.Stats.Requests[route][code].Add(1)
	var e apiError
	e.Error.Code, e.Error.Message, e.Error.RetryAfter = code.String(), msg, retryMS
	b, _ := json.Marshal(&e)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	if retryMS > 0 {
		h.Set("Retry-After", strconv.FormatInt((retryMS+999)/1000, 10))
	}
	if status == http.StatusUnauthorized {
		h.Set("WWW-Authenticate", `Bearer realm="roost"`)
	}
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func (s *Server) ok(w http.ResponseWriter, route int, body []byte) {
	s.Stats.Requests[route][0].Add(1)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(body, '\n'))
}

// admit checks the app in the path, the request's secret, the app's rate
// and its budget on the listener (edge.go); it answers the refusal itself.
// A request without a valid secret holds nothing past its answer.
func (s *Server) admit(w http.ResponseWriter, r *http.Request, route int) (*tenant, bool) {
	id := r.PathValue("app")
	if !proto.ValidAppID([]byte(id)) {
		s.refuseUnauthenticated(w, r, route, http.StatusBadRequest, proto.CodeBadRequest, "invalid app id: want [A-Za-z0-9_.-]{1,64}")
		return nil, false
	}
	auth := r.Header.Get("Authorization")
	var t *tenant
	if auth == "" && s.cfg.Dev {
		var ok bool
		if t, ok = s.devTenant(w, r, id, route); !ok {
			return nil, false
		}
	} else {
		scheme, secret, found := strings.Cut(auth, " ")
		if !found || !strings.EqualFold(scheme, "Bearer") || secret == "" {
			s.refuseUnauthenticated(w, r, route, http.StatusUnauthorized, proto.CodeForbidden, "missing secret: send Authorization: Bearer SECRET with a current secret of the app")
			return nil, false
		}
		s.mu.RLock()
		t = s.apps[id]
		s.mu.RUnlock()
		// One answer for an unknown app and a wrong secret: a caller without
		// a secret learns nothing about which apps exist.
		if t == nil || !t.app.SecretMatches([]byte(secret), time.Now()) {
			s.refuseUnauthenticated(w, r, route, http.StatusUnauthorized, proto.CodeForbidden, "unknown app or wrong secret")
			return nil, false
		}
	}
	if t.app.Disabled {
		w.Header().Set("Connection", "close")
		s.fail(w, route, http.StatusForbidden, proto.CodeForbidden, "app disabled")
		return nil, false
	}
	if wait := t.req.Take(tenancy.Now(), s.rate); wait > 0 {
		s.failRetry(w, route, http.StatusTooManyRequests, proto.CodeRateLimited, "request rate of this app exceeded (--api-rate): retry after retry_after ms", tenancy.RetryAfterMS(wait))
		return nil, false
	}
	if !s.hold(w, r, route, t.app.ID) {
		return nil, false
	}
	return t, true
}

// roomOf admits a request on a room's route and reads its room (a user's
// inbox on the inbox routes).
func (s *Server) roomOf(w http.ResponseWriter, r *http.Request, route int) (*tenant, string, bool) {
	t, ok := s.admit(w, r, route)
	if !ok {
		return nil, "", false
	}
	if user := r.PathValue("user"); user != "" {
		if room := "@" + user; proto.ValidRoom([]byte(room)) {
			return t, room, true
		}
		s.fail(w, route, http.StatusBadRequest, proto.CodeBadRequest, "invalid user for an inbox: want [A-Za-z0-9_.:-]{1,128}")
		return nil, "", false
	}
	room := r.PathValue("room")
	if !proto.ValidRoom([]byte(room)) {
		s.fail(w, route, http.StatusBadRequest, proto.CodeBadRequest, "invalid room name: want [A-Za-z0-9_.:-]{1,128}")
		return nil, "", false
	}
	return t, room, true
}

// storeFail answers a store error.
func (s *Server) storeFail(w http.ResponseWriter, route int, err error) {
	switch {
	case errors.Is(err, proto.ErrRoomLimit):
		s.fail(w, route, http.StatusForbidden, proto.CodeForbidden, "the app has its maximum of rooms")
	case errors.Is(err, proto.ErrOverloaded), errors.Is(err, proto.ErrClosed), errors.Is(err, context.DeadlineExceeded):
		s.failRetry(w, route, http.StatusServiceUnavailable, proto.CodeOverloaded, "store unavailable: retry later", 1000)
	default:
		s.log.Warn("server API: store error", "err", err)
		s.fail(w, route, http.StatusInternalServerError, proto.CodeInternal, "internal error")
	}
}

// pubRequest is a publish request's JSON. The body is kept as sent.
type pubRequest struct {
	ID   *string         `json:"id"`
	From *string         `json:"from"`
	Body json.RawMessage `json:"body"`
	// Kind and Ref: an edit, delete, react or unreact of the message Ref
	// (docs/protocol.md, "Messages that change"); the API may edit or
	// delete any message.
	Kind *string `json:"kind"`
	Ref  *uint64 `json:"ref"`
}

// waiter is the fanout.Origin of one API publish: the publish worker hands
// it the outcome, the request's goroutine waits for it.
type waiter chan persist.Stored

func (c waiter) Published(req *fanout.PubRequest) {
	c <- req.Stored // buffered: never blocks
}

func (s *Server) publish(w http.ResponseWriter, r *http.Request) {
	const route = RoutePublish
	start := time.Now()
	t, room, ok := s.roomOf(w, r, route)
	if !ok {
		return
	}
	limit := int64(maxRequest)
	if t.app.MaxMsg > 0 {
		limit = t.app.MaxMsg + envelope
	}
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			s.fail(w, route, http.StatusRequestEntityTooLarge, proto.CodeTooLarge, "request larger than the app's max-msg allows")
			return
		}
		s.fail(w, route, http.StatusBadRequest, proto.CodeBadRequest, "cannot read the request body")
		return
	}
	// Bodies reach clients in text frames, which must be valid UTF-8; the
	// JSON decoder would silently replace bad bytes in the id and sender.
	if !utf8.Valid(raw) {
		s.fail(w, route, http.StatusBadRequest, proto.CodeBadRequest, "request body is not valid UTF-8")
		return
	}
	// One depth limit with WebSocket frames (encoding/json alone takes
	// 10,000 levels, which sockets would then be sent).
	if proto.CheckValue(raw, 0) == proto.ErrTooDeep {
		s.fail(w, route, http.StatusBadRequest, proto.CodeBadRequest, "request body: "+proto.ErrTooDeep.Message)
		return
	}
	var req pubRequest
	if err := json.Unmarshal(raw, &req); err != nil {
		s.fail(w, route, http.StatusBadRequest, proto.CodeBadRequest, "request body is not a JSON object of id, from and body: "+err.Error())
		return
	}
	switch {
	case req.ID == nil || !proto.ValidID([]byte(*req.ID)):
		s.fail(w, route, http.StatusBadRequest, proto.CodeBadRequest, "id must be a string of 1 to 64 characters")
		return
	case req.From == nil || !proto.ValidUser([]byte(*req.From)):
		s.fail(w, route, http.StatusBadRequest, proto.CodeBadRequest, "from must be a user id: 1 to 128 characters without control characters")
		return
	case len(req.Body) == 0 && (req.Kind == nil || *req.Kind == "msg"):
		s.fail(w, route, http.StatusBadRequest, proto.CodeBadRequest, "missing body")
		return
	case t.app.MaxMsg > 0 && int64(len(req.Body)) > t.app.MaxMsg:
		s.fail(w, route, http.StatusRequestEntityTooLarge, proto.CodeTooLarge, "message body larger than the app's max-msg")
		return
	}
	kind := proto.KindMsg
	if req.Kind != nil {
		k, ok := proto.ParseKind(*req.Kind)
		if !ok {
			s.fail(w, route, http.StatusBadRequest, proto.CodeBadRequest, proto.ErrBadKind.Message)
			return
		}
		kind = k
	}
	var ref uint64
	if req.Ref != nil {
		ref = *req.Ref
	}
	if kind == proto.KindDelete && string(req.Body) == "null" {
		req.Body = nil // a delete's body, if named, is null
	}
	if e := proto.CheckKind(kind, req.Ref != nil, ref, len(req.Body) > 0, req.Body); e != nil {
		s.fail(w, route, http.StatusBadRequest, e.Code, e.Message)
		return
	}
	done := make(waiter, 1)
	pr := &fanout.PubRequest{
		Row: persist.Row{
			Key:  proto.RoomKey(t.app.ID, room),
			From: *req.From,
			ID:   []byte(*req.ID),
			Body: req.Body, // aliases raw, which nothing else holds
			Kind: kind,
			Ref:  ref,
			Any:  true,
		},
		Origin: done,
	}
	if err := s.fan.Publish(pr); err != nil {
		msg := "publish queue full: retry later with the same id"
		if errors.Is(err, proto.ErrClosed) {
			msg = "node shutting down: retry on another node with the same id"
		}
		s.failRetry(w, route, http.StatusServiceUnavailable, proto.CodeOverloaded, msg, 1000)
		return
	}
	var res persist.Stored
	select {
	case res = <-done:
	case <-r.Context().Done():
		// The caller left; the publish completes anyway, and a retry with
		// the same id gets its seq.
		return
	}
	if res.Err != nil {
		var pe *proto.Error
		if errors.As(res.Err, &pe) {
			status := http.StatusBadRequest
			switch pe.Code {
			case proto.CodeNotFound:
				status = http.StatusNotFound
			case proto.CodeForbidden:
				status = http.StatusForbidden
			}
			s.fail(w, route, status, pe.Code, pe.Message)
			return
		}
		s.storeFail(w, route, res.Err)
		return
	}
	s.pubLa.Observe(time.Since(start).Seconds())
	if res.Duplicate {
		s.Stats.Duplicates.Add(1)
	} else {
		s.Stats.Published.Add(1)
	}
	b := append([]byte(`{"room":`), quote(room)...)
	b = append(b, `,"seq":`...)
	b = strconv.AppendUint(b, res.Seq, 10)
	b = append(b, `,"id":`...)
	b = append(b, quote(*req.ID)...)
	s.ok(w, route, append(b, '}'))
}

func quote(s string) []byte {
	b, _ := json.Marshal(s)
	return b
}

// uintParam reads a query parameter as an unsigned integer.
func uintParam(r *http.Request, name string) (v uint64, present bool, err error) {
	q := r.URL.Query()
	if !q.Has(name) {
		return 0, false, nil
	}
	v, err = strconv.ParseUint(q.Get(name), 10, 64)
	return v, true, err
}

func (s *Server) history(w http.ResponseWriter, r *http.Request) {
	const route = RouteHistory
	t, room, ok := s.roomOf(w, r, route)
	if !ok {
		return
	}
	after, hasAfter, err1 := uintParam(r, "after")
	before, hasBefore, err2 := uintParam(r, "before")
	limit, hasLimit, err3 := uintParam(r, "limit")
	switch {
	case err1 != nil || err2 != nil || err3 != nil:
		s.fail(w, route, http.StatusBadRequest, proto.CodeBadRequest, "after, before and limit must be unsigned integers")
		return
	case hasAfter && hasBefore:
		s.fail(w, route, http.StatusBadRequest, proto.CodeBadRequest, "give after or before, not both")
		return
	case hasLimit && limit < 1:
		s.fail(w, route, http.StatusBadRequest, proto.CodeBadRequest, "limit must be at least 1")
		return
	}
	if !hasLimit {
		limit = proto.DefaultLimit
	}
	b := persist.Bounds{Limit: int(min(limit, proto.MaxLimit)), MaxBytes: historyBytes}
	key := proto.RoomKey(t.app.ID, room)
	ctx := r.Context()
	head, err := s.store.Head(ctx, key)
	if err != nil {
		s.storeFail(w, route, err)
		return
	}
	var msgs []proto.Message
	var more bool
	fold := false
	if q := r.URL.Query(); q.Has("fold") {
		switch q.Get("fold") {
		case "true", "1":
			fold = true
		case "false", "0":
		default:
			s.fail(w, route, http.StatusBadRequest, proto.CodeBadRequest, "fold must be true or false")
			return
		}
	}
	folder, _ := s.store.(persist.Folder)
	switch {
	case fold && folder == nil:
		s.fail(w, route, http.StatusNotImplemented, proto.CodeInternal, "this store cannot fold history")
		return
	case fold && hasBefore && before <= 1:
	case fold:
		msgs, more, err = folder.Fold(ctx, key, persist.FoldQuery{Before: before, After: after, Forward: hasAfter}, b)
	case hasAfter:
		msgs, more, err = s.store.Range(ctx, key, after, head.Last, b)
	case hasBefore && before <= 1:
		// before is exclusive and seqs start at 1 (the store reads 0 as
		// "no bound").
	default:
		msgs, more, err = s.store.History(ctx, key, before, b)
	}
	if err != nil {
		s.storeFail(w, route, err)
		return
	}
	out := append([]byte(`{"room":`), quote(room)...)
	out = append(out, `,"epoch":`...)
	out = append(out, quote(head.Epoch)...)
	out = append(out, `,"messages":[`...)
	for i := range msgs {
		if i > 0 {
			out = append(out, ',')
		}
		msgs[i].Room = room
		out = proto.AppendMsgJSON(out, &msgs[i])
	}
	out = append(out, `],"more":`...)
	out = strconv.AppendBool(out, more)
	s.ok(w, route, append(out, '}'))
}

func (s *Server) room(w http.ResponseWriter, r *http.Request) {
	const route = RouteRoom
	t, room, ok := s.roomOf(w, r, route)
	if !ok {
		return
	}
	key := proto.RoomKey(t.app.ID, room)
	head, err := s.store.Head(r.Context(), key)
	if err != nil {
		s.storeFail(w, route, err)
		return
	}
	count, err := s.fan.PresenceCount(r.Context(), key)
	if err != nil {
		s.log.Warn("server API: cannot read a room's presence", "app", t.app.ID, "room", room, "err", err)
		s.failRetry(w, route, http.StatusServiceUnavailable, proto.CodeOverloaded, "cannot read the room's presence now: retry", 1000)
		return
	}
	out := append([]byte(`{"room":`), quote(room)...)
	out = append(out, `,"epoch":`...)
	out = append(out, quote(head.Epoch)...)
	out = append(out, `,"seq":`...)
	out = strconv.AppendUint(out, head.Last, 10)
	out = append(out, `,"presence":{"count":`...)
	out = strconv.AppendInt(out, int64(count), 10)
	out = append(out, `}}`...)
	s.ok(w, route, out)
}

// userOf admits a request on a user's route and reads its user.
func (s *Server) userOf(w http.ResponseWriter, r *http.Request, route int) (*tenant, string, bool) {
	t, ok := s.admit(w, r, route)
	if !ok {
		return nil, "", false
	}
	user := r.PathValue("user")
	if !proto.ValidUser([]byte(user)) {
		s.fail(w, route, http.StatusBadRequest, proto.CodeBadRequest, "invalid user id: 1 to 128 characters without control characters")
		return nil, "", false
	}
	return t, user, true
}

func (s *Server) disconnect(w http.ResponseWriter, r *http.Request) {
	const route = RouteDisconnect
	t, user, ok := s.userOf(w, r, route)
	if !ok {
		return
	}
	n := s.disc(t.app.ID, user, disconnectWait)
	s.Stats.Disconnected.Add(uint64(n))
	msg := proto.AppendControl(nil, &proto.Control{Op: proto.ControlDisconnect, App: t.app.ID, User: user})
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.fan.Control(ctx, msg); err != nil {
		s.log.Warn("server API: cannot send a disconnect to the other nodes", "app", t.app.ID, "err", err)
		s.failRetry(w, route, http.StatusServiceUnavailable, proto.CodeOverloaded,
			"closed "+strconv.Itoa(n)+" connection(s) on this node but cannot reach the other nodes through the broker: retry", 1000)
		return
	}
	b := strconv.AppendInt([]byte(`{"closed":`), int64(n), 10)
	s.ok(w, route, append(b, '}'))
}
