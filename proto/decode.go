package proto

import "errors"

// ErrMalformed means a client payload is not valid JSON (RFC 8259) or not a
// JSON object. The connection is closed with 1007. (Valid JSON nested past
// MaxDepth is ErrTooDeep instead.)
var ErrMalformed = errors.New("proto: payload is not a JSON object")

// Error is a client error: the command is answered with an `err` frame
// carrying Code and Message, and the connection stays open. The package
// holds every value Decode returns, so reporting one allocates nothing;
// compare them by pointer.
type Error struct {
	Code    Code
	Message string
}

func (e *Error) Error() string { return e.Message }

// Client errors returned by Decode.
var (
	ErrMissingOp   = &Error{CodeBadRequest, "missing op"}
	ErrUnknownOp   = &Error{CodeBadRequest, "unknown op"}
	ErrMissingRoom = &Error{CodeBadRequest, "missing room"}
	ErrBadRoom     = &Error{CodeBadRequest, "room must match [A-Za-z0-9_.:-]{1,128}"}
	ErrMissingID   = &Error{CodeBadRequest, "missing id"}
	ErrBadID       = &Error{CodeBadRequest, "id must be a string of 1 to 64 characters"}
	ErrMissingBody = &Error{CodeBadRequest, "missing body"}
	ErrBadNumber   = &Error{CodeBadRequest, "since, before and limit must be non-negative integers"}
	ErrBadEpoch    = &Error{CodeBadRequest, "epoch must be a string of at most 32 bytes"}
	ErrBadLimit    = &Error{CodeBadRequest, "limit must be at least 1"}
	ErrBadToken    = &Error{CodeBadRequest, "token must be a JWT string (no escapes)"}
	ErrMissingTok  = &Error{CodeBadRequest, "missing token"}
	ErrBadPresence = &Error{CodeBadRequest, "presence must be true or false"}
	ErrBadEcho     = &Error{CodeBadRequest, "echo must be true or false"}
	ErrBadReceipts = &Error{CodeBadRequest, "receipts must be true or false"}
	ErrBadSeq      = &Error{CodeBadRequest, "seq must be a non-negative integer"}
	ErrMissingSeq  = &Error{CodeBadRequest, "missing seq"}
	ErrSignalSize  = &Error{CodeTooLarge, "signal body larger than 1024 bytes"}
	ErrBadFold     = &Error{CodeBadRequest, "fold must be true or false"}
	ErrBeforeAfter = &Error{CodeBadRequest, "give before or after, not both"}
)

const (
	maxRoom = 128
	maxID   = 64

	// MaxSignalBody bounds a signal's body: signals are typing and cursor
	// notes, carried to every member on every node without a commit.
	MaxSignalBody = 1024

	// DefaultLimit and MaxLimit bound a history request.
	DefaultLimit = 50
	MaxLimit     = 1000
)

var roomChar = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
		t[c-'a'+'A'] = true
	}
	for _, c := range "_.:-" {
		t[c] = true
	}
	return t
}()

// ValidRoom reports whether room matches [A-Za-z0-9_.:-]{1,128}, or is
// an inbox: "@" and such a name (IsInbox).
func ValidRoom(room []byte) bool {
	if len(room) > 1 && room[0] == '@' {
		room = room[1:]
	}
	if len(room) == 0 || len(room) > maxRoom {
		return false
	}
	for _, c := range room {
		if !roomChar[c] {
			return false
		}
	}
	return true
}

type field uint8

const (
	fieldUnknown field = iota
	fieldOp
	fieldRoom
	fieldID
	fieldBody
	fieldSince
	fieldBefore
	fieldLimit
	fieldToken
	fieldEpoch
	fieldPresence
	fieldEcho
	fieldRooms
	fieldReceipts
	fieldKind
	fieldAfter
	fieldFold
	// DecodeServer only (and ref, a number, in Decode).
	fieldFrom
	fieldCode
	fieldRef
	fieldMessage
	fieldMessages
	fieldSeq
	fieldTS
)

// keyField names a top-level key. Keys spelled with escapes ("\u006fp") are
// the same key once decoded, so they are decoded first (rare, slow path).
func keyField(raw []byte, esc bool) field {
	if esc {
		var buf [8]byte
		n, ok := unescape(buf[:], raw)
		if !ok {
			return fieldUnknown
		}
		raw = buf[:n]
	}
	switch string(raw) {
	case "op":
		return fieldOp
	case "room":
		return fieldRoom
	case "id":
		return fieldID
	case "body":
		return fieldBody
	case "since":
		return fieldSince
	case "before":
		return fieldBefore
	case "limit":
		return fieldLimit
	case "token":
		return fieldToken
	case "epoch":
		return fieldEpoch
	case "presence":
		return fieldPresence
	case "echo":
		return fieldEcho
	case "rooms":
		return fieldRooms
	case "receipts":
		return fieldReceipts
	case "kind":
		return fieldKind
	case "after":
		return fieldAfter
	case "fold":
		return fieldFold
	case "from":
		return fieldFrom
	case "code":
		return fieldCode
	case "ref":
		return fieldRef
	case "message":
		return fieldMessage
	case "messages":
		return fieldMessages
	case "seq":
		return fieldSeq
	case "ts":
		return fieldTS
	}
	return fieldUnknown
}

func opOf(raw []byte, esc bool) Op {
	if esc {
		var buf [8]byte
		n, ok := unescape(buf[:], raw)
		if !ok {
			return OpInvalid
		}
		raw = buf[:n]
	}
	switch string(raw) {
	case "join":
		return OpJoin
	case "leave":
		return OpLeave
	case "pub":
		return OpPub
	case "history":
		return OpHistory
	case "ping":
		return OpPing
	case "auth":
		return OpAuth
	case "presence":
		return OpPresence
	case "signal":
		return OpSignal
	case "read":
		return OpRead
	case "unread":
		return OpUnread
	case "receipts":
		return OpReceipts
	}
	return OpInvalid
}

// Presence of a known field in a client frame; last occurrence wins.
type presence uint8

const (
	absent presence = iota
	valid
	invalid
)

// Decode parses one client frame: payload is the unmasked text payload,
// already checked to be UTF-8. The whole payload is validated, including
// unknown fields and the body. It returns ErrMalformed for anything that is
// not one JSON object, else an *Error for a well-formed but wrong command,
// else nil. Precedence: op, then room, id, since, before, limit, then what
// the op requires.
//
// cmd is reset first. Room, ID and Body alias payload (or cmd's scratch when
// the string held escapes). On an *Error, Room and ID hold the valid values
// seen (an invalid room or id is left empty) so the caller can build Ref.
// Known fields are checked whatever the op; since and before are set for any
// op, limit's default and minimum apply to history only. Valid JSON nested
// deeper than MaxDepth is ErrTooDeep (an *Error: the connection stays).
func Decode(payload []byte, cmd *Command) error {
	err := decode(payload, cmd)
	if err != ErrMalformed {
		return err
	}
	// Slow path, the frame refused anyway: was it the depth?
	if i := skipWS(payload, 0); i < len(payload) && payload[i] == '{' && tooDeep(payload, i, 0) {
		return ErrTooDeep
	}
	return err
}

func decode(payload []byte, cmd *Command) error {
	cmd.reset()
	b := payload
	i, more, ok := objectOpen(b)
	if !ok {
		return ErrMalformed
	}
	var op, room, id, body, since, before, limit, token, epoch, pres, echo, seq, rooms, rcpt presence
	var kind, ref, after, fold presence
	var limitVal uint64
	for more {
		ks, ke, kesc, vs, ok := memberKey(b, i)
		if !ok {
			return ErrMalformed
		}
		i = vs
		switch f := keyField(b[ks:ke], kesc); f {
		case fieldOp, fieldRoom, fieldID:
			if b[i] != '"' {
				if i, ok = skipValue(b, i, 1); !ok {
					return ErrMalformed
				}
				switch f {
				case fieldOp:
					op, cmd.Op = invalid, OpInvalid
				case fieldRoom:
					room, cmd.Room = invalid, nil
				default:
					id, cmd.ID = invalid, nil
				}
				break
			}
			ve, esc, ok := scanString(b, i+1)
			if !ok {
				return ErrMalformed
			}
			i = ve + 1
			raw := b[vs+1 : ve]
			switch f {
			case fieldOp:
				cmd.Op = opOf(raw, esc)
				op = valid
				if cmd.Op == OpInvalid {
					op = invalid
				}
			case fieldRoom:
				room, cmd.Room = invalid, nil
				if esc {
					n, ok := unescape(cmd.roomBuf[:], raw)
					if !ok {
						break
					}
					raw = cmd.roomBuf[:n]
				}
				if ValidRoom(raw) {
					room, cmd.Room = valid, raw
				}
			default:
				id, cmd.ID = invalid, nil
				if esc {
					n, ok := unescape(cmd.idBuf[:], raw)
					if !ok {
						break
					}
					raw = cmd.idBuf[:n]
				}
				if ValidID(raw) {
					id, cmd.ID = valid, raw
				}
			}
		case fieldKind:
			kind, cmd.Kind = invalid, KindMsg
			if b[i] != '"' {
				if i, ok = skipValue(b, i, 1); !ok {
					return ErrMalformed
				}
				break
			}
			ve, esc, ok := scanString(b, i+1)
			if !ok {
				return ErrMalformed
			}
			i = ve + 1
			if !esc {
				if k, ok := ParseKind(b[vs+1 : ve]); ok {
					kind, cmd.Kind = valid, k
				}
			}
		case fieldSince, fieldBefore, fieldLimit, fieldSeq, fieldRef, fieldAfter:
			var v uint64
			ok := false
			if c := b[i]; c == '-' || '0' <= c && c <= '9' {
				if i, ok = scanNumber(b, i); !ok {
					return ErrMalformed
				}
				v, ok = parseUint(b[vs:i])
			} else if i, ok = skipValue(b, i, 1); !ok {
				return ErrMalformed
			} else {
				ok = false
			}
			p := invalid
			if ok {
				p = valid
			}
			switch f {
			case fieldSince:
				since, cmd.Since = p, v
			case fieldBefore:
				before, cmd.Before = p, v
			case fieldSeq:
				seq, cmd.Seq = p, v
			case fieldRef:
				ref, cmd.Ref = p, v
			case fieldAfter:
				after, cmd.After = p, v
			default:
				limit, limitVal = p, v
			}
		case fieldEpoch:
			epoch, cmd.Epoch = invalid, nil
			if b[i] != '"' {
				if i, ok = skipValue(b, i, 1); !ok {
					return ErrMalformed
				}
				break
			}
			ve, esc, ok := scanString(b, i+1)
			if !ok {
				return ErrMalformed
			}
			i = ve + 1
			raw := b[vs+1 : ve]
			if esc {
				n, ok := unescape(cmd.epochBuf[:], raw)
				if !ok {
					break
				}
				raw = cmd.epochBuf[:n]
			}
			if len(raw) <= MaxEpoch {
				epoch, cmd.Epoch = valid, raw
			}
		case fieldPresence, fieldReceipts, fieldEcho, fieldFold:
			if i, ok = skipValue(b, i, 1); !ok {
				return ErrMalformed
			}
			p, v := boolValue(b[vs:i])
			switch f {
			case fieldPresence:
				pres, cmd.Presence = p, v
			case fieldReceipts:
				rcpt, cmd.Receipts = p, v
			case fieldFold:
				fold, cmd.Fold = p, v
			default:
				echo, cmd.NoEcho = p, p == valid && !v
			}
		case fieldBody:
			if i, ok = skipValue(b, i, 1); !ok {
				return ErrMalformed
			}
			body, cmd.Body = valid, b[vs:i]
		case fieldRooms:
			if i, ok = skipValue(b, i, 1); !ok {
				return ErrMalformed
			}
			rooms, cmd.Rooms = valid, b[vs:i]
		case fieldToken:
			token, cmd.Token = invalid, nil
			if b[i] != '"' {
				if i, ok = skipValue(b, i, 1); !ok {
					return ErrMalformed
				}
				break
			}
			ve, esc, ok := scanString(b, i+1)
			if !ok {
				return ErrMalformed
			}
			i = ve + 1
			if !esc {
				token, cmd.Token = valid, b[vs+1:ve]
			}
		default:
			if i, ok = skipValue(b, i, 1); !ok {
				return ErrMalformed
			}
		}
		if i, more, ok = memberNext(b, i); !ok {
			return ErrMalformed
		}
	}
	if skipWS(b, i) != len(b) {
		return ErrMalformed
	}

	cmd.HasSince = since == valid
	cmd.HasBefore = before == valid
	cmd.HasEpoch = epoch == valid
	cmd.HasRef = ref == valid
	cmd.HasAfter = after == valid
	if limit == valid {
		cmd.HasLimit = true
		cmd.Limit = int(min(limitVal, MaxLimit))
	} else if cmd.Op == OpHistory {
		cmd.Limit = DefaultLimit
	}
	switch {
	case op == absent:
		return ErrMissingOp
	case op == invalid:
		return ErrUnknownOp
	case room == invalid:
		return ErrBadRoom
	case id == invalid:
		return ErrBadID
	case since == invalid, before == invalid, limit == invalid, after == invalid:
		return ErrBadNumber
	case token == invalid:
		return ErrBadToken
	case epoch == invalid:
		return ErrBadEpoch
	case pres == invalid:
		return ErrBadPresence
	case echo == invalid:
		return ErrBadEcho
	case rcpt == invalid:
		return ErrBadReceipts
	case seq == invalid:
		return ErrBadSeq
	case kind == invalid:
		return ErrBadKind
	case ref == invalid:
		return ErrBadRef
	case fold == invalid:
		return ErrBadFold
	}
	switch cmd.Op {
	case OpJoin, OpLeave, OpPresence, OpReceipts:
		if room == absent {
			return ErrMissingRoom
		}
	case OpHistory:
		if room == absent {
			return ErrMissingRoom
		}
		if limit == valid && limitVal == 0 {
			return ErrBadLimit
		}
		if before == valid && after == valid {
			return ErrBeforeAfter
		}
	case OpUnread:
		if rooms == absent || !walkRooms(cmd.Rooms, cmd.listBuf[:], nil) {
			return ErrBadRooms
		}
	case OpRead:
		switch {
		case room == absent:
			return ErrMissingRoom
		case seq == absent:
			return ErrMissingSeq
		}
	case OpSignal:
		switch {
		case room == absent:
			return ErrMissingRoom
		case body == absent:
			return ErrMissingBody
		case len(cmd.Body) > MaxSignalBody:
			return ErrSignalSize
		}
	case OpAuth:
		if token == absent {
			return ErrMissingTok
		}
	case OpPub:
		switch {
		case room == absent:
			return ErrMissingRoom
		case id == absent:
			return ErrMissingID
		case body == absent && cmd.Kind != KindDelete && cmd.Kind != KindEdit && !cmd.Kind.IsReaction():
			return ErrMissingBody
		}
		if e := CheckKind(cmd.Kind, ref != absent, cmd.Ref, body != absent, cmd.Body); e != nil {
			return e
		}
	}
	return nil
}

// boolValue reads a JSON true or false; anything else is invalid.
func boolValue(raw []byte) (presence, bool) {
	switch string(raw) {
	case "true":
		return valid, true
	case "false":
		return valid, false
	}
	return invalid, false
}

// reset clears the decoded fields but not the scratch arrays: clearing
// those too would cost a 192-byte memclr per frame for bytes nobody reads.
func (cmd *Command) reset() {
	cmd.Op, cmd.Room, cmd.ID, cmd.Body, cmd.Token, cmd.Epoch, cmd.Rooms = OpInvalid, nil, nil, nil, nil, nil, nil
	cmd.Since, cmd.Before, cmd.Limit, cmd.Seq = 0, 0, 0, 0
	cmd.HasSince, cmd.HasBefore, cmd.HasLimit, cmd.HasEpoch, cmd.Presence, cmd.NoEcho, cmd.Receipts = false, false, false, false, false, false, false
	cmd.Kind, cmd.Ref, cmd.HasRef, cmd.After, cmd.HasAfter, cmd.Fold = KindMsg, 0, false, 0, false, false
}

// Ref is what an `err` frame echoes for cmd: its id, else its room (a
// signal's is always its room: it has no id).
func Ref(cmd *Command) []byte {
	if len(cmd.ID) > 0 && cmd.Op != OpSignal {
		return cmd.ID
	}
	return cmd.Room
}
