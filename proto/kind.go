package proto

import (
	"strconv"
	"unicode/utf8"
)

// Kind is what a stored entry of a room does (docs/protocol.md, "Messages
// that change"): a message, or a change of an earlier message named by its
// seq (Ref). Every kind is an entry of the room's log with its own seq.
type Kind uint8

const (
	KindMsg     Kind = iota // a message (the default; its frame names no kind)
	KindEdit                // a new body for Ref, from its sender or the Server API
	KindDelete              // Ref deleted, from its sender or the Server API (no body)
	KindReact               // a reaction (the body, a string) added to Ref
	KindUnreact             // a reaction taken back
)

// MaxReaction bounds a reaction's length in bytes, once unescaped.
const MaxReaction = 32

var kindNames = [...]string{KindMsg: "msg", KindEdit: "edit", KindDelete: "delete", KindReact: "react", KindUnreact: "unreact"}

// String is the kind's wire name.
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "kind" + strconv.Itoa(int(k))
}

// Valid reports whether k is one of the kinds above.
func (k Kind) Valid() bool { return k <= KindUnreact }

// Changes reports whether k changes an earlier message (it has a Ref).
func (k Kind) Changes() bool { return k != KindMsg }

// IsReaction reports react and unreact.
func (k Kind) IsReaction() bool { return k == KindReact || k == KindUnreact }

// ParseKind reads a kind's wire name; ok is false for any other string.
func ParseKind[T text](s T) (Kind, bool) {
	switch string(s) {
	case "msg":
		return KindMsg, true
	case "edit":
		return KindEdit, true
	case "delete":
		return KindDelete, true
	case "react":
		return KindReact, true
	case "unreact":
		return KindUnreact, true
	}
	return 0, false
}

// Client errors of the kinds (Decode, the Server API) and of their rules
// (the store answers a row with ErrRefNotFound or ErrRefForbidden; nothing
// is stored for it, and the rest of its batch is not affected).
var (
	ErrBadKind      = &Error{CodeBadRequest, "kind must be msg, edit, delete, react or unreact"}
	ErrBadRef       = &Error{CodeBadRequest, "ref must be the seq of a message: an integer of at least 1"}
	ErrMissingRef   = &Error{CodeBadRequest, "edit, delete, react and unreact need ref, the seq of a message"}
	ErrExtraRef     = &Error{CodeBadRequest, "ref is only for edit, delete, react and unreact"}
	ErrEmptyEdit    = &Error{CodeBadRequest, "an edit needs a body: the new body"}
	ErrDeleteBody   = &Error{CodeBadRequest, "a delete has no body"}
	ErrBadReaction  = &Error{CodeBadRequest, "a reaction is a JSON string of 1 to 32 bytes without control characters"}
	ErrRefNotFound  = &Error{CodeNotFound, "ref is not a message of this room (or it was deleted)"}
	ErrRefForbidden = &Error{CodeForbidden, "only the sender of a message may edit or delete it"}
)

// CheckKind checks the kind fields of a publish: kind, whether a ref was
// given (and its value), whether a body was given and the body. It is
// shared by the WebSocket decoder and the Server API.
func CheckKind(k Kind, hasRef bool, ref uint64, hasBody bool, body []byte) *Error {
	if k == KindMsg {
		if hasRef {
			return ErrExtraRef
		}
		return nil
	}
	switch {
	case !hasRef:
		return ErrMissingRef
	case ref == 0:
		return ErrBadRef
	}
	switch k {
	case KindEdit:
		if !hasBody {
			return ErrEmptyEdit
		}
	case KindDelete:
		if hasBody {
			return ErrDeleteBody
		}
	case KindReact, KindUnreact:
		if !hasBody {
			return ErrBadReaction
		}
		var buf [4 * MaxReaction]byte
		if _, ok := reaction(&buf, body); !ok {
			return ErrBadReaction
		}
	}
	return nil
}

// ReactionText appends to dst the reaction a react or unreact body names:
// the JSON string's content unescaped. ok is false when body is not a JSON
// string (surrounding whitespace allowed) of 1 to MaxReaction bytes once
// unescaped, valid UTF-8 without control characters. Two spellings of one
// string ("\u00e9", "é") are the same reaction.
func ReactionText(dst, body []byte) (out []byte, ok bool) {
	var buf [4 * MaxReaction]byte
	s, ok := reaction(&buf, body)
	if !ok {
		return dst, false
	}
	return append(dst, s...), true
}

// reaction is ReactionText's check; s aliases body or buf.
func reaction(buf *[4 * MaxReaction]byte, body []byte) (s []byte, ok bool) {
	i := skipWS(body, 0)
	if i >= len(body) || body[i] != '"' {
		return nil, false
	}
	end, esc, ok := scanString(body, i+1)
	if !ok || skipWS(body, end+1) != len(body) {
		return nil, false
	}
	s = body[i+1 : end]
	if len(s) > len(buf) {
		return nil, false
	}
	if esc {
		n, ok := unescape(buf[:], s)
		if !ok {
			return nil, false
		}
		s = buf[:n]
	}
	if len(s) == 0 || len(s) > MaxReaction || !utf8.Valid(s) {
		return nil, false
	}
	for _, c := range s {
		if c < 0x20 || c == 0x7f {
			return nil, false
		}
	}
	return s, true
}

// Reaction is one reaction of a folded message and how many users hold it.
type Reaction struct {
	Text  string
	Count int
}
