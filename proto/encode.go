package proto

import (
	"math"
	"slices"
	"strconv"

	"github.com/gobwas/ws"
)

// Every Append*Frame function appends one complete, unmasked, FIN WebSocket
// frame. The payload length is computed first so the header is written in
// front of the payload with no shifting, and dst grows at most once: with
// enough capacity nothing is allocated. Frames are immutable once built, so
// one frame may be written to every receiver.

// text is what the JSON string encoder accepts, so callers holding either a
// string or a []byte pay no conversion.
type text interface{ ~string | ~[]byte }

var codeNames = [...]string{
	CodeBadRequest:  "bad_request",
	CodeForbidden:   "forbidden",
	CodeNotFound:    "not_found",
	CodeTooLarge:    "too_large",
	CodeRateLimited: "rate_limited",
	CodeOverloaded:  "overloaded",
	CodeInternal:    "internal",
}

// String returns the code as the `err` frame spells it ("internal" for a
// value outside the protocol, which is what the client should assume).
func (c Code) String() string {
	if int(c) < len(codeNames) && codeNames[c] != "" {
		return codeNames[c]
	}
	return "internal"
}

// escLen is the escaped length of an ASCII byte: control characters become
// \u00XX, '"' and '\\' get a backslash. Bytes from 0x80 are handled by
// utf8Len: valid UTF-8 stays verbatim, anything else becomes \ufffd so a
// frame is always valid UTF-8 (a bad user name must not make clients close
// with 1007).
var escLen = func() (t [256]uint8) {
	for c := range t {
		switch {
		case c < 0x20:
			t[c] = 6
		case c == '"' || c == '\\':
			t[c] = 2
		default:
			t[c] = 1
		}
	}
	return t
}()

// utf8Len returns the length of the valid UTF-8 sequence at s[i] (s[i] >=
// 0x80), or 0 when it is not one.
func utf8Len[T text](s T, i int) int {
	c := s[i]
	n := len(s) - i
	lo, hi := byte(0x80), byte(0xbf)
	var size int
	switch {
	case c >= 0xc2 && c <= 0xdf:
		size = 2
	case c == 0xe0:
		size, lo = 3, 0xa0
	case c >= 0xe1 && c <= 0xec || c == 0xee || c == 0xef:
		size = 3
	case c == 0xed:
		size, hi = 3, 0x9f
	case c == 0xf0:
		size, lo = 4, 0x90
	case c >= 0xf1 && c <= 0xf3:
		size = 4
	case c == 0xf4:
		size, hi = 4, 0x8f
	default:
		return 0
	}
	if n < size || s[i+1] < lo || s[i+1] > hi {
		return 0
	}
	for k := 2; k < size; k++ {
		if s[i+k] < 0x80 || s[i+k] > 0xbf {
			return 0
		}
	}
	return size
}

// quotedLen is len(appendQuoted(nil, s)).
func quotedLen[T text](s T) int {
	n := 2
	for i := 0; i < len(s); {
		c := s[i]
		if c < 0x80 {
			n += int(escLen[c])
			i++
			continue
		}
		if k := utf8Len(s, i); k > 0 {
			n += k
			i += k
		} else {
			n += 6
			i++
		}
	}
	return n
}

const hexDigits = "0123456789abcdef"

func appendQuoted[T text](dst []byte, s T) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < 0x80 && escLen[c] == 1 {
			i++
			continue
		}
		k := 1
		if c >= 0x80 {
			if k = utf8Len(s, i); k > 0 {
				i += k
				continue
			}
			k = 1
		}
		dst = append(dst, s[start:i]...)
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		default:
			dst = append(dst, `\ufffd`...)
		}
		i += k
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

func uintLen(v uint64) int {
	n := 1
	for v >= 10 {
		v /= 10
		n++
	}
	return n
}

func intLen(v int64) int {
	if v < 0 {
		return 1 + uintLen(uint64(-v))
	}
	return uintLen(uint64(v))
}

func headerLen(n int) int {
	switch {
	case n <= 125:
		return 2
	case n <= 0xffff:
		return 4
	}
	return 10
}

// appendHeader writes a FIN frame header with opcode op for an n-byte
// payload; with mask set, it sets the mask bit (the key follows separately).
func appendHeader(dst []byte, op ws.OpCode, masked bool, n int) []byte {
	b0 := 0x80 | byte(op)
	var m byte
	if masked {
		m = 0x80
	}
	switch {
	case n <= 125:
		return append(dst, b0, m|byte(n))
	case n <= 0xffff:
		return append(dst, b0, m|126, byte(n>>8), byte(n))
	}
	u := uint64(n)
	return append(dst, b0, m|127, byte(u>>56), byte(u>>48), byte(u>>40), byte(u>>32),
		byte(u>>24), byte(u>>16), byte(u>>8), byte(u))
}

// beginText makes room for a text frame with an n-byte payload and writes its
// header.
func beginText(dst []byte, n int) []byte {
	dst = slices.Grow(dst, headerLen(n)+n)
	return appendHeader(dst, ws.OpText, false, n)
}

// endText checks the computed length, so a length bug shows at once
// instead of as a corrupt stream on every connection.
func endText(dst []byte, start, n int) []byte {
	if len(dst)-start != n {
		panic("BUG: proto: frame payload length differs from the computed length")
	}
	return dst
}

func bodyOrNull(body []byte) []byte {
	if len(body) == 0 {
		return nullBody
	}
	return body
}

var nullBody = []byte("null")

const (
	msgPrefix  = `{"op":"msg","room":`
	msgSeq     = `,"seq":`
	msgID      = `,"id":`
	msgFrom    = `,"from":`
	msgTS      = `,"ts":`
	msgBody    = `,"body":`
	msgFixed   = len(msgPrefix) + len(msgSeq) + len(msgID) + len(msgFrom) + len(msgTS) + len(msgBody) + 1
	historyPre = `{"op":"history","room":`
	historyMsg = `,"messages":[`
)

const (
	msgKind      = `,"kind":`
	msgRef       = `,"ref":`
	msgEdited    = `,"edited":`
	msgDeleted   = `,"deleted":true`
	msgReactions = `,"reactions":{`
)

// kindLen is what kind and ref add to a msg frame (nothing for a message).
func kindLen(kind Kind, ref uint64) int {
	if kind == KindMsg {
		return 0
	}
	return len(msgKind) + 2 + len(kind.String()) + len(msgRef) + uintLen(ref)
}

func appendKind(dst []byte, kind Kind, ref uint64) []byte {
	if kind == KindMsg {
		return dst
	}
	dst = append(dst, msgKind...)
	dst = append(dst, '"')
	dst = append(dst, kind.String()...)
	dst = append(dst, '"')
	dst = append(dst, msgRef...)
	return strconv.AppendUint(dst, ref, 10)
}

func msgLen[I text](room string, seq uint64, id I, from string, ts int64, kind Kind, ref uint64, body []byte) int {
	return msgFixed + quotedLen(room) + uintLen(seq) + quotedLen(id) + quotedLen(from) +
		intLen(ts) + kindLen(kind, ref) + len(bodyOrNull(body))
}

func appendMsg[I text](dst []byte, room string, seq uint64, id I, from string, ts int64, kind Kind, ref uint64, body []byte) []byte {
	dst = appendMsgHead(dst, room, seq, id, from, ts, kind, ref)
	dst = append(dst, msgBody...)
	dst = append(dst, bodyOrNull(body)...)
	return append(dst, '}')
}

func appendMsgHead[I text](dst []byte, room string, seq uint64, id I, from string, ts int64, kind Kind, ref uint64) []byte {
	dst = append(dst, msgPrefix...)
	dst = appendQuoted(dst, room)
	dst = append(dst, msgSeq...)
	dst = strconv.AppendUint(dst, seq, 10)
	dst = append(dst, msgID...)
	dst = appendQuoted(dst, id)
	dst = append(dst, msgFrom...)
	dst = appendQuoted(dst, from)
	dst = append(dst, msgTS...)
	dst = strconv.AppendInt(dst, ts, 10)
	return appendKind(dst, kind, ref)
}

// foldLen is what a folded message's state adds to its msg object.
func foldLen(m *Message) int {
	if !m.Folded {
		return 0
	}
	n := 0
	if m.Edited != 0 {
		n += len(msgEdited) + intLen(m.Edited)
	}
	if m.Deleted {
		n += len(msgDeleted)
	}
	if len(m.Reactions) > 0 {
		n += len(msgReactions) + 1
		for i, r := range m.Reactions {
			if i > 0 {
				n++
			}
			n += quotedLen(r.Text) + 1 + intLen(int64(r.Count))
		}
	}
	return n
}

func appendFold(dst []byte, m *Message) []byte {
	if !m.Folded {
		return dst
	}
	if m.Edited != 0 {
		dst = append(dst, msgEdited...)
		dst = strconv.AppendInt(dst, m.Edited, 10)
	}
	if m.Deleted {
		dst = append(dst, msgDeleted...)
	}
	if len(m.Reactions) > 0 {
		dst = append(dst, msgReactions...)
		for i, r := range m.Reactions {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendQuoted(dst, r.Text)
			dst = append(dst, ':')
			dst = strconv.AppendInt(dst, int64(r.Count), 10)
		}
		dst = append(dst, '}')
	}
	return dst
}

// msgJSONLen is the length of AppendMsgJSON's output.
func msgJSONLen(m *Message) int {
	body := m.Body
	if m.Deleted {
		body = nil
	}
	return msgLen(m.Room, m.Seq, m.ID, m.From, m.TS, m.Kind, m.Ref, body) + foldLen(m)
}

// AppendMsgFrame appends a `msg` frame of a message (KindMsg). body is the
// publisher's JSON value and is copied byte for byte (an empty body is
// written as null).
func AppendMsgFrame(dst []byte, room string, seq uint64, id []byte, from string, ts int64, body []byte) []byte {
	return AppendMsgFrameKind(dst, room, seq, id, from, ts, KindMsg, 0, body)
}

// AppendMsgFrameKind appends a `msg` frame of any kind: an edit, delete,
// react or unreact carries "kind" and "ref", a message neither.
func AppendMsgFrameKind(dst []byte, room string, seq uint64, id []byte, from string, ts int64, kind Kind, ref uint64, body []byte) []byte {
	n := msgLen(room, seq, id, from, ts, kind, ref, body)
	dst = beginText(dst, n)
	start := len(dst)
	dst = appendMsg(dst, room, seq, id, from, ts, kind, ref, body)
	return endText(dst, start, n)
}

// AppendMsgMessageFrame appends the `msg` frame of a stored message.
func AppendMsgMessageFrame(dst []byte, m *Message) []byte {
	n := msgJSONLen(m)
	dst = beginText(dst, n)
	start := len(dst)
	dst = AppendMsgJSON(dst, m)
	return endText(dst, start, n)
}

// AppendMsgJSON appends m as the JSON object of a `msg` frame, without a
// frame header; a folded message carries its state (edited, deleted with a
// null body, reactions).
func AppendMsgJSON(dst []byte, m *Message) []byte {
	if !m.Folded {
		return appendMsg(dst, m.Room, m.Seq, m.ID, m.From, m.TS, m.Kind, m.Ref, m.Body)
	}
	dst = appendMsgHead(dst, m.Room, m.Seq, m.ID, m.From, m.TS, m.Kind, m.Ref)
	dst = appendFold(dst, m)
	dst = append(dst, msgBody...)
	if m.Deleted {
		dst = append(dst, nullBody...)
	} else {
		dst = append(dst, bodyOrNull(m.Body)...)
	}
	return append(dst, '}')
}

// AppendHistoryFrame appends a `history` frame holding msgs in order; more
// adds "more":true (the answer stopped at its byte bound with older
// messages left).
func AppendHistoryFrame(dst, room []byte, msgs []Message, more bool) []byte {
	const moreField = `,"more":true`
	n := len(historyPre) + quotedLen(room) + len(historyMsg) + len("]}")
	if more {
		n += len(moreField)
	}
	for k := range msgs {
		m := &msgs[k]
		if k > 0 {
			n++
		}
		n += msgJSONLen(m)
	}
	dst = beginText(dst, n)
	start := len(dst)
	dst = append(dst, historyPre...)
	dst = appendQuoted(dst, room)
	dst = append(dst, historyMsg...)
	for k := range msgs {
		if k > 0 {
			dst = append(dst, ',')
		}
		dst = AppendMsgJSON(dst, &msgs[k])
	}
	dst = append(dst, ']')
	if more {
		dst = append(dst, moreField...)
	}
	dst = append(dst, '}')
	return endText(dst, start, n)
}

// Joined is what a `joined` frame says besides its room.
type Joined struct {
	Seq   uint64 // the room's newest seq at the join
	Epoch string // the history Seq belongs to
	// Resumed: the join had since, so the frame says whether every message
	// after since follows (Recovered) or, if not, From: the first seq that
	// will.
	Resumed   bool
	Recovered bool
	From      uint64
}

// MaxJoinedExtra bounds what a Joined adds to the room name in a frame,
// for callers sizing a buffer: the fields, two 20-digit seqs and an epoch
// of up to 32 characters written with escapes.
const MaxJoinedExtra = 64 + 2*20 + 6*32

// AppendJoinedFrame appends {"op":"joined","room":..,"seq":..,"epoch":..}
// with "recovered" (and "from") for a join that had since.
func AppendJoinedFrame(dst, room []byte, j *Joined) []byte {
	const pre, mid, ep = `{"op":"joined","room":`, `,"seq":`, `,"epoch":`
	const recT, recF, from = `,"recovered":true`, `,"recovered":false`, `,"from":`
	epoch := j.Epoch
	n := len(pre) + quotedLen(room) + len(mid) + uintLen(j.Seq) + len(ep) + quotedLen(epoch) + 1
	switch {
	case !j.Resumed:
	case j.Recovered:
		n += len(recT)
	default:
		n += len(recF) + len(from) + uintLen(j.From)
	}
	dst = beginText(dst, n)
	start := len(dst)
	dst = append(dst, pre...)
	dst = appendQuoted(dst, room)
	dst = append(dst, mid...)
	dst = strconv.AppendUint(dst, j.Seq, 10)
	dst = append(dst, ep...)
	dst = appendQuoted(dst, epoch)
	switch {
	case !j.Resumed:
	case j.Recovered:
		dst = append(dst, recT...)
	default:
		dst = append(dst, recF...)
		dst = append(dst, from...)
		dst = strconv.AppendUint(dst, j.From, 10)
	}
	dst = append(dst, '}')
	return endText(dst, start, n)
}

// AppendLeftFrame appends {"op":"left","room":..}.
func AppendLeftFrame(dst, room []byte) []byte {
	const pre = `{"op":"left","room":`
	n := len(pre) + quotedLen(room) + 1
	dst = beginText(dst, n)
	start := len(dst)
	dst = append(dst, pre...)
	dst = appendQuoted(dst, room)
	dst = append(dst, '}')
	return endText(dst, start, n)
}

// AppendAckFrame appends {"op":"ack","id":..,"room":..,"seq":..}.
func AppendAckFrame(dst, id, room []byte, seq uint64) []byte {
	const pre, mid, tail = `{"op":"ack","id":`, `,"room":`, `,"seq":`
	n := len(pre) + quotedLen(id) + len(mid) + quotedLen(room) + len(tail) + uintLen(seq) + 1
	dst = beginText(dst, n)
	start := len(dst)
	dst = append(dst, pre...)
	dst = appendQuoted(dst, id)
	dst = append(dst, mid...)
	dst = appendQuoted(dst, room)
	dst = append(dst, tail...)
	dst = strconv.AppendUint(dst, seq, 10)
	dst = append(dst, '}')
	return endText(dst, start, n)
}

// AppendErrFrame appends {"op":"err","ref":..,"code":..,"message":..}.
func AppendErrFrame(dst, ref []byte, code Code, message string) []byte {
	const pre, mid, tail = `{"op":"err","ref":`, `,"code":"`, `","message":`
	name := code.String()
	n := len(pre) + quotedLen(ref) + len(mid) + len(name) + len(tail) + quotedLen(message) + 1
	dst = beginText(dst, n)
	start := len(dst)
	dst = append(dst, pre...)
	dst = appendQuoted(dst, ref)
	dst = append(dst, mid...)
	dst = append(dst, name...)
	dst = append(dst, tail...)
	dst = appendQuoted(dst, message)
	dst = append(dst, '}')
	return endText(dst, start, n)
}

// AppendRateLimitedFrame appends {"op":"err","ref":..,"code":"rate_limited",
// "message":..,"retry_after":MS}: retry_after is how long the client waits
// before the publish can be accepted.
func AppendRateLimitedFrame(dst, ref []byte, message string, retryAfterMS int64) []byte {
	const pre, mid, tail = `{"op":"err","ref":`, `,"code":"rate_limited","message":`, `,"retry_after":`
	n := len(pre) + quotedLen(ref) + len(mid) + quotedLen(message) + len(tail) + uintLen(uint64(retryAfterMS)) + 1
	dst = beginText(dst, n)
	start := len(dst)
	dst = append(dst, pre...)
	dst = appendQuoted(dst, ref)
	dst = append(dst, mid...)
	dst = appendQuoted(dst, message)
	dst = append(dst, tail...)
	dst = strconv.AppendUint(dst, uint64(retryAfterMS), 10)
	dst = append(dst, '}')
	return endText(dst, start, n)
}

// AppendAuthedFrame appends {"op":"authed","exp":UNIX_S}, exp with its
// fraction of a second when it has one (millisecond precision).
func AppendAuthedFrame(dst []byte, exp float64) []byte {
	var num [32]byte
	e := strconv.AppendFloat(num[:0], math.Round(exp*1000)/1000, 'f', -1, 64)
	const pre = `{"op":"authed","exp":`
	n := len(pre) + len(e) + 1
	dst = beginText(dst, n)
	start := len(dst)
	dst = append(dst, pre...)
	dst = append(dst, e...)
	dst = append(dst, '}')
	return endText(dst, start, n)
}

// AppendPongFrame appends {"op":"pong"}.
func AppendPongFrame(dst []byte) []byte {
	return append(dst, pongFrame...)
}

var pongFrame = append([]byte{0x81, byte(len(`{"op":"pong"}`))}, `{"op":"pong"}`...)

// maxControl is the largest control frame payload (RFC 6455 5.5).
const maxControl = 125

// AppendCloseFrame appends a server close frame with code and reason; the
// reason is cut at a UTF-8 boundary to fit the 125-byte control payload.
// Code 0 sends a close frame without a status.
func AppendCloseFrame(dst []byte, code uint16, reason string) []byte {
	if code == 0 {
		return appendHeader(dst, ws.OpClose, false, 0)
	}
	if len(reason) > maxControl-2 {
		cut := maxControl - 2
		// Back off over continuation bytes so the reason stays valid UTF-8.
		for cut > 0 && reason[cut]&0xc0 == 0x80 {
			cut--
		}
		reason = reason[:cut]
	}
	dst = appendHeader(dst, ws.OpClose, false, 2+len(reason))
	dst = append(dst, byte(code>>8), byte(code))
	return append(dst, reason...)
}

// AppendControlFrame appends an unmasked FIN frame with opcode op, such as
// a pong echoing a ping's payload or a server ping. A control frame payload
// over 125 bytes is a caller bug.
func AppendControlFrame(dst []byte, op ws.OpCode, payload []byte) []byte {
	if op.IsControl() && len(payload) > maxControl {
		panic("BUG: proto: control frame payload over 125 bytes")
	}
	dst = slices.Grow(dst, headerLen(len(payload))+len(payload))
	dst = appendHeader(dst, op, false, len(payload))
	return append(dst, payload...)
}

// AppendRetryReason appends the 1013 close reason "retry=MS".
func AppendRetryReason(dst []byte, ms int) []byte {
	dst = append(dst, "retry="...)
	return strconv.AppendInt(dst, int64(ms), 10)
}

// AppendClientFrame appends a masked FIN frame as a client sends it (tests
// and the load generator).
func AppendClientFrame(dst []byte, op ws.OpCode, mask [4]byte, payload []byte) []byte {
	dst = slices.Grow(dst, headerLen(len(payload))+4+len(payload))
	dst = appendHeader(dst, op, true, len(payload))
	dst = append(dst, mask[:]...)
	start := len(dst)
	dst = append(dst, payload...)
	ws.Cipher(dst[start:], mask, 0)
	return dst
}

// MaxPresenceUsers bounds the names of a presence answer; past it the
// answer says "more":true and count still gives the total.
const MaxPresenceUsers = 1000

// AppendPresenceFrame appends
// {"op":"presence","room":..,"count":N,"users":[..]} (and "more":true when
// count is above len(users)).
func AppendPresenceFrame(dst, room []byte, count int, users []string) []byte {
	const pre, mid, us, more = `{"op":"presence","room":`, `,"count":`, `,"users":`, `,"more":true`
	n := len(pre) + quotedLen(room) + len(mid) + uintLen(uint64(count)) + len(us) + listLen(users) + 1
	if count > len(users) {
		n += len(more)
	}
	dst = beginText(dst, n)
	start := len(dst)
	dst = append(dst, pre...)
	dst = appendQuoted(dst, room)
	dst = append(dst, mid...)
	dst = strconv.AppendUint(dst, uint64(count), 10)
	dst = append(dst, us...)
	dst = appendList(dst, users)
	if count > len(users) {
		dst = append(dst, more...)
	}
	dst = append(dst, '}')
	return endText(dst, start, n)
}

// AppendPresenceDiffFrame appends
// {"op":"presence_diff","room":..,"joined":[..],"left":[..]}.
func AppendPresenceDiffFrame(dst, room []byte, joined, left []string) []byte {
	const pre, jn, lf = `{"op":"presence_diff","room":`, `,"joined":`, `,"left":`
	n := len(pre) + quotedLen(room) + len(jn) + listLen(joined) + len(lf) + listLen(left) + 1
	dst = beginText(dst, n)
	start := len(dst)
	dst = append(dst, pre...)
	dst = appendQuoted(dst, room)
	dst = append(dst, jn...)
	dst = appendList(dst, joined)
	dst = append(dst, lf...)
	dst = appendList(dst, left)
	dst = append(dst, '}')
	return endText(dst, start, n)
}

func listLen(l []string) int {
	n := 2
	for i, s := range l {
		if i > 0 {
			n++
		}
		n += quotedLen(s)
	}
	return n
}

func appendList(dst []byte, l []string) []byte {
	dst = append(dst, '[')
	for i, s := range l {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendQuoted(dst, s)
	}
	return append(dst, ']')
}
