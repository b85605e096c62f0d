package proto

import (
	"bytes"
	"slices"
	"strconv"
)

// Server-Sent Events (text/event-stream) carry the same JSON objects as
// WebSocket frames: an event's `data` is the WebSocket payload byte for
// byte, its `event` the object's op. A listener's stream position is the
// `id` of its events: every room with the newest seq delivered in it,
// "a:41,b:7".

// MaxSSEPosition bounds a position a client sends back (Last-Event-ID or
// since=): MaxRooms items of a 128-byte room name and a 20-digit seq fit,
// with the separators.
const MaxSSEPosition = 256 * (128 + 1 + 20 + 1)

// ErrBadPosition refuses a Last-Event-ID or since= that is not a list of
// room:seq items.
var ErrBadPosition = &HTTPError{400, "Last-Event-ID (or since=) must be room:seq items separated by commas, such as a:41,b:7"}

// ParseSSEPosition parses a stream position "a:41,b:7" and calls fn with
// each item in order; the seq follows the last ':' of an item (room names
// may hold ':'). An empty position has no items. fn returning false stops
// the walk. The room slice aliases b. It never allocates.
func ParseSSEPosition(b []byte, fn func(room []byte, seq uint64) bool) error {
	if len(b) > MaxSSEPosition {
		return ErrBadPosition
	}
	for len(b) > 0 {
		item := b
		if c := bytes.IndexByte(b, ','); c >= 0 {
			item, b = b[:c], b[c+1:]
			if len(b) == 0 {
				return ErrBadPosition // a trailing comma
			}
		} else {
			b = nil
		}
		colon := bytes.LastIndexByte(item, ':')
		if colon < 0 {
			return ErrBadPosition
		}
		room, digits := item[:colon], item[colon+1:]
		if !ValidRoom(room) || len(digits) == 0 || len(digits) > 20 {
			return ErrBadPosition
		}
		var seq uint64
		for _, c := range digits {
			if c < '0' || c > '9' {
				return ErrBadPosition
			}
			d := uint64(c - '0')
			if seq > (1<<64-1-d)/10 {
				return ErrBadPosition
			}
			seq = seq*10 + d
		}
		if !fn(room, seq) {
			return nil
		}
	}
	return nil
}

// AppendSSEPositionItem appends one item "room:seq" of a position, with a
// comma before it unless it is the first.
func AppendSSEPositionItem(dst []byte, first bool, room string, seq uint64) []byte {
	if !first {
		dst = append(dst, ',')
	}
	dst = append(dst, room...)
	dst = append(dst, ':')
	return strconv.AppendUint(dst, seq, 10)
}

// SSEEventLen bounds what AppendSSEEvent appends for data of n bytes with
// lines line breaks in it.
func SSEEventLen(event string, n, lines int) int {
	return len("event: \ndata: \n") + len(event) + n + lines*len("\ndata: ")
}

// AppendSSEEvent appends the event and data fields of one event, each
// line ending in LF, without the blank line that dispatches it (the caller
// adds the id line and the blank line). data is a JSON object: a line
// break in it (only possible in the whitespace between tokens of a
// publisher's body) starts another data line, which the client joins back
// with LF; a CR or CRLF there therefore arrives as LF, since SSE reads all
// three as line ends.
func AppendSSEEvent(dst []byte, event string, data []byte) []byte {
	dst = slices.Grow(dst, SSEEventLen(event, len(data), 0))
	dst = append(dst, "event: "...)
	dst = append(dst, event...)
	dst = append(dst, "\ndata: "...)
	for {
		i := bytes.IndexAny(data, "\r\n")
		if i < 0 {
			break
		}
		dst = append(dst, data[:i]...)
		dst = append(dst, "\ndata: "...)
		if data[i] == '\r' && i+1 < len(data) && data[i+1] == '\n' {
			i++
		}
		data = data[i+1:]
	}
	dst = append(dst, data...)
	return append(dst, '\n')
}

// ServerFramePayload returns the payload of the unmasked server frame at
// the start of b and the frame's length; n is 0 when b does not start with
// a whole one.
func ServerFramePayload(b []byte) (payload []byte, n int) {
	h, hn, err := ParseFrameHeader(b)
	if err != nil || hn == 0 || h.Masked || int64(len(b)-hn) < h.Length {
		return nil, 0
	}
	end := hn + int(h.Length)
	return b[hn:end], end
}

// FrameOp is the op of a JSON object this package encoded (they all begin
// with {"op":"NAME"), or "" for anything else.
func FrameOp(payload []byte) string {
	const pre = `{"op":"`
	if !bytes.HasPrefix(payload, []byte(pre)) {
		return ""
	}
	rest := payload[len(pre):]
	end := bytes.IndexByte(rest, '"')
	switch string(rest[:max(end, 0)]) {
	case "msg":
		return "msg"
	case "joined":
		return "joined"
	case "err":
		return "err"
	case "history":
		return "history"
	case "presence":
		return "presence"
	case "presence_diff":
		return "presence_diff"
	}
	return ""
}

// MsgSeq reads the seq of a msg object this package encoded
// ({"op":"msg","room":"R","seq":N,...}); ok is false for anything else.
func MsgSeq(payload []byte) (seq uint64, ok bool) {
	const pre = `{"op":"msg","room":"`
	if !bytes.HasPrefix(payload, []byte(pre)) {
		return 0, false
	}
	rest := payload[len(pre):]
	q := bytes.IndexByte(rest, '"') // room names hold no quote or escape
	if q < 0 || !bytes.HasPrefix(rest[q:], []byte(`","seq":`)) {
		return 0, false
	}
	digits := rest[q+len(`","seq":`):]
	n := 0
	for n < len(digits) && n < 20 && '0' <= digits[n] && digits[n] <= '9' {
		seq = seq*10 + uint64(digits[n]-'0')
		n++
	}
	return seq, n > 0
}
