package proto

import "strconv"

// A signal (typing, a cursor) is carried like a msg frame but never
// stored: no seq, no id, no ts. Its frame is encoded once by the sending
// node and shared by every receiver on every node.

const (
	signalPrefix = `{"op":"signal","room":`
	signalFrom   = `,"from":`
	signalBody   = `,"body":`
)

// SignalFrameLen is the length of the signal frame AppendSignalFrame
// appends, header included: a caller sizes its buffer with it.
func SignalFrameLen[R text](room R, from string, body []byte) int {
	n := signalPayloadLen(room, from, body)
	return headerLen(n) + n
}

func signalPayloadLen[R text](room R, from string, body []byte) int {
	return len(signalPrefix) + quotedLen(room) + len(signalFrom) + quotedLen(from) +
		len(signalBody) + len(bodyOrNull(body)) + 1
}

// AppendSignalFrame appends {"op":"signal","room":..,"from":..,"body":..}.
// body is the sender's JSON value, copied byte for byte.
func AppendSignalFrame[R text](dst []byte, room R, from string, body []byte) []byte {
	n := signalPayloadLen(room, from, body)
	dst = beginText(dst, n)
	start := len(dst)
	dst = append(dst, signalPrefix...)
	dst = appendQuoted(dst, room)
	dst = append(dst, signalFrom...)
	dst = appendQuoted(dst, from)
	dst = append(dst, signalBody...)
	dst = append(dst, bodyOrNull(body)...)
	dst = append(dst, '}')
	return endText(dst, start, n)
}

// MsgOrigin reads the id and from of a msg object this package encoded
// ({"op":"msg","room":"R","seq":N,"id":"K","from":"U",...}), unescaped
// into buf when they hold escapes (buf must hold both: 4*MaxID + 4*MaxUser
// bytes always do); ok is false for anything else. A member that asked
// not to get its own publishes (echo off) tells them by these.
func MsgOrigin(payload, buf []byte) (id, from []byte, ok bool) {
	const pre = `{"op":"msg","room":"`
	if !hasPrefix(payload, pre) {
		return nil, nil, false
	}
	i := len(pre)
	e, _, ok := scanString(payload, i)
	if !ok || !hasPrefix(payload[e:], `","seq":`) {
		return nil, nil, false
	}
	i = e + len(`","seq":`)
	for i < len(payload) && '0' <= payload[i] && payload[i] <= '9' {
		i++
	}
	if !hasPrefix(payload[i:], `,"id":"`) {
		return nil, nil, false
	}
	if id, i, buf, ok = stringAt(payload, i+len(`,"id":"`), buf); !ok || !hasPrefix(payload[i:], `,"from":"`) {
		return nil, nil, false
	}
	from, _, _, ok = stringAt(payload, i+len(`,"from":"`), buf)
	return id, from, ok
}

// stringAt reads the JSON string whose content starts at b[i], unescaped
// into buf when needed; next is past its closing quote, rest what is left
// of buf.
func stringAt(b []byte, i int, buf []byte) (s []byte, next int, rest []byte, ok bool) {
	e, esc, ok := scanString(b, i)
	if !ok {
		return nil, 0, buf, false
	}
	s = b[i:e]
	if esc {
		n, ok := unescape(buf, s)
		if !ok {
			return nil, 0, buf, false
		}
		s, buf = buf[:n:n], buf[n:]
	}
	return s, e + 1, buf, true
}

func hasPrefix(b []byte, p string) bool { return len(b) >= len(p) && string(b[:len(p)]) == p }

// IsInbox reports whether room names a user's inbox: "@" and the user's
// id (the @ is reserved to inboxes). Only that user's connections may
// join it, and only the Server API writes to it.
func IsInbox[R text](room R) bool { return len(room) > 1 && room[0] == '@' }

// InboxOf reports whether room is user's own inbox.
func InboxOf[R text](room R, user string) bool {
	return IsInbox(room) && string(room[1:]) == user
}

// ReadKey is the broker key every node subscribes to for read positions:
// a user's `read` answer reaches the user's connections on every node
// through it. Like ControlKey it has no "/", so no room has it.
const ReadKey = "roost.read"

const readPrefix = `{"op":"read","room":`

// AppendReadFrame appends {"op":"read","room":..,"seq":..}.
func AppendReadFrame[R text](dst []byte, room R, seq uint64) []byte {
	n := len(readPrefix) + quotedLen(room) + len(`,"seq":`) + uintLen(seq) + 1
	dst = beginText(dst, n)
	start := len(dst)
	dst = append(dst, readPrefix...)
	dst = appendQuoted(dst, room)
	dst = append(dst, `,"seq":`...)
	dst = strconv.AppendUint(dst, seq, 10)
	dst = append(dst, '}')
	return endText(dst, start, n)
}

// ReadFrameOf reads the room and seq of a read object AppendReadFrame
// encoded; ok is false for anything else.
func ReadFrameOf(payload []byte) (room string, seq uint64, ok bool) {
	if !hasPrefix(payload, readPrefix+`"`) {
		return "", 0, false
	}
	i := len(readPrefix) + 1
	e, esc, ok := scanString(payload, i)
	if !ok || esc || !hasPrefix(payload[e:], `","seq":`) {
		return "", 0, false
	}
	room = string(payload[i:e])
	d := payload[e+len(`","seq":`):]
	n := 0
	for n < len(d) && n < 20 && '0' <= d[n] && d[n] <= '9' {
		seq = seq*10 + uint64(d[n]-'0')
		n++
	}
	return room, seq, n > 0
}

// MaxUnreadRooms bounds the rooms of one unread request.
const MaxUnreadRooms = 100

// ErrBadRooms refuses an unread request's rooms.
var ErrBadRooms = &Error{CodeBadRequest, "rooms must be an array of 1 to 100 room names"}

// RoomList walks a JSON array of room names (an unread request's rooms,
// validated by Decode): fn gets each name, unescaped into a scratch buffer
// when it held escapes (valid during the call only). It reports false
// when raw is not an array of at most MaxUnreadRooms valid names (at
// least one).
func RoomList(raw []byte, fn func(room []byte)) bool {
	var buf [maxRoom + 1]byte
	return walkRooms(raw, buf[:], fn)
}

// walkRooms is RoomList with the caller's scratch buffer (Decode passes
// its Command's, so that validating allocates nothing).
func walkRooms(raw, buf []byte, fn func(room []byte)) bool {
	i := skipWS(raw, 0)
	if i >= len(raw) || raw[i] != '[' {
		return false
	}
	i = skipWS(raw, i+1)
	n := 0
	if i < len(raw) && raw[i] == ']' {
		return false
	}
	for {
		if i >= len(raw) || raw[i] != '"' {
			return false
		}
		e, esc, ok := scanString(raw, i+1)
		if !ok {
			return false
		}
		room := raw[i+1 : e]
		if esc {
			k, ok := unescape(buf, room)
			if !ok {
				return false
			}
			room = buf[:k]
		}
		if !ValidRoom(room) {
			return false
		}
		if n++; n > MaxUnreadRooms {
			return false
		}
		if fn != nil {
			fn(room)
		}
		i = skipWS(raw, e+1)
		if i < len(raw) && raw[i] == ',' {
			i = skipWS(raw, i+1)
			continue
		}
		return i < len(raw) && raw[i] == ']' && skipWS(raw, i+1) == len(raw)
	}
}

// AppendUnreadObject appends the rooms object of an unread answer,
// {"a":{"read":55,"seq":58,"count":3},...}: for each room its user's read
// position, its newest seq and the messages after the position.
func AppendUnreadObject(dst []byte, rooms []string, read, last, count []uint64) []byte {
	dst = append(dst, '{')
	for i, r := range rooms {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendQuoted(dst, r)
		dst = append(dst, `:{"read":`...)
		dst = strconv.AppendUint(dst, read[i], 10)
		dst = append(dst, `,"seq":`...)
		dst = strconv.AppendUint(dst, last[i], 10)
		dst = append(dst, `,"count":`...)
		dst = strconv.AppendUint(dst, count[i], 10)
		dst = append(dst, '}')
	}
	return append(dst, '}')
}

// AppendUnreadFrame appends {"op":"unread","rooms":{...}} (AppendUnreadObject).
func AppendUnreadFrame(dst []byte, rooms []string, read, last, count []uint64) []byte {
	obj := AppendUnreadObject(nil, rooms, read, last, count)
	n := len(`{"op":"unread","rooms":}`) + len(obj)
	dst = beginText(dst, n)
	start := len(dst)
	dst = append(dst, `{"op":"unread","rooms":`...)
	dst = append(dst, obj...)
	dst = append(dst, '}')
	return endText(dst, start, n)
}

// Receipt is one user's read position in a receipts frame.
type Receipt struct {
	User string
	Seq  uint64
}

// AppendReceiptsFrame appends {"op":"receipts","room":..,"read":{"bob":58,...}},
// with "more":true when more is set, the users in the order given.
func AppendReceiptsFrame(dst []byte, room string, read []Receipt, more bool) []byte {
	n := len(`{"op":"receipts","room":,"read":{}}`) + quotedLen(room)
	for i, r := range read {
		if i > 0 {
			n++
		}
		n += quotedLen(r.User) + 1 + uintLen(r.Seq)
	}
	if more {
		n += len(`,"more":true`)
	}
	dst = beginText(dst, n)
	start := len(dst)
	dst = append(dst, `{"op":"receipts","room":`...)
	dst = appendQuoted(dst, room)
	dst = append(dst, `,"read":{`...)
	for i, r := range read {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendQuoted(dst, r.User)
		dst = append(dst, ':')
		dst = strconv.AppendUint(dst, r.Seq, 10)
	}
	dst = append(dst, '}')
	if more {
		dst = append(dst, `,"more":true`...)
	}
	dst = append(dst, '}')
	return endText(dst, start, n)
}
