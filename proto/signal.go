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
