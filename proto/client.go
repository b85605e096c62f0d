package proto

import (
	"errors"
	"slices"
)

// ErrServerFrame means a server frame is valid JSON but a known field has
// the wrong type (seq or ts not an integer, a string field not a string).
var ErrServerFrame = errors.New("proto: server frame field has the wrong type")

// ServerFrame is one decoded server frame, for clients: tests and the load
// generator. The string fields (Op, Room, ID, From, Code, Ref, Message) are
// the raw content between the quotes, NOT unescaped: the server only
// escapes '"', '\\', control characters and invalid UTF-8, so they equal
// the value unless it held one of those; use AppendUnescaped when it may.
// Body and Messages are the raw JSON values. All alias the payload.
//
// `from` has two meanings on the wire: the sender of a msg (a string), and
// on a joined frame answered recovered:false the first seq that follows (a
// number). The first goes to From, the second to FromSeq.
type ServerFrame struct {
	Op, Room, ID, From, Code, Ref, Message, Body, Messages, Epoch []byte
	Seq, FromSeq                                                  uint64
	TS                                                            int64
	// Kind and RefSeq: a msg frame's kind and ref (an edit, delete, react
	// or unreact; `ref` as a number goes to RefSeq, as a string to Ref).
	Kind   []byte
	RefSeq uint64
}

// DecodeServer parses a server frame payload into f (reset first). It
// validates the whole payload like Decode and returns ErrMalformed or
// ErrServerFrame. Unknown fields are ignored; duplicate keys, last wins.
func DecodeServer(payload []byte, f *ServerFrame) error {
	*f = ServerFrame{}
	b := payload
	i, more, ok := objectOpen(b)
	if !ok {
		return ErrMalformed
	}
	var bad bool
	for more {
		ks, ke, kesc, vs, ok := memberKey(b, i)
		if !ok {
			return ErrMalformed
		}
		i = vs
		if i, ok = skipValue(b, i, 1); !ok {
			return ErrMalformed
		}
		v := b[vs:i]
		fl := keyField(b[ks:ke], kesc)
		if fl == fieldFrom && v[0] != '"' {
			f.FromSeq, ok = parseUint(v)
			bad = bad || !ok
			fl = fieldUnknown
		}
		if fl == fieldRef && v[0] != '"' {
			f.RefSeq, ok = parseUint(v)
			bad = bad || !ok
			fl = fieldUnknown
		}
		switch fl {
		case fieldOp, fieldRoom, fieldID, fieldFrom, fieldCode, fieldRef, fieldMessage, fieldEpoch, fieldKind:
			var s []byte
			if v[0] == '"' {
				s = v[1 : len(v)-1]
			} else {
				bad = true
			}
			switch fl {
			case fieldOp:
				f.Op = s
			case fieldRoom:
				f.Room = s
			case fieldID:
				f.ID = s
			case fieldFrom:
				f.From = s
			case fieldCode:
				f.Code = s
			case fieldRef:
				f.Ref = s
			case fieldEpoch:
				f.Epoch = s
			case fieldKind:
				f.Kind = s
			default:
				f.Message = s
			}
		case fieldBody:
			f.Body = v
		case fieldMessages:
			f.Messages = v
		case fieldSeq:
			f.Seq, ok = parseUint(v)
			bad = bad || !ok
		case fieldTS:
			f.TS, ok = parseInt(v)
			bad = bad || !ok
		}
		if i, more, ok = memberNext(b, i); !ok {
			return ErrMalformed
		}
	}
	if skipWS(b, i) != len(b) {
		return ErrMalformed
	}
	if bad {
		return ErrServerFrame
	}
	return nil
}

// AppendUnescaped appends the decoded content of a raw JSON string (as
// ServerFrame holds it) to dst; lone surrogates become U+FFFD. ok is false,
// and dst is returned unchanged, when raw is not valid string content.
func AppendUnescaped(dst, raw []byte) (out []byte, ok bool) {
	// scanString stops with ok=false at the end of input when it has not met
	// a closing quote: that is exactly "valid content, no quote".
	if end, _, quoted := scanString(raw, 0); quoted || end != len(raw) {
		return dst, false
	}
	// Decoding never lengthens: an escape of k bytes yields at most k bytes.
	start := len(dst)
	dst = slices.Grow(dst, len(raw))
	n, _ := unescape(dst[start:start+len(raw)], raw)
	return dst[:start+n], true
}
