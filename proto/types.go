package proto

// Op is a client command.
type Op uint8

const (
	OpInvalid Op = iota
	OpJoin
	OpLeave
	OpPub
	OpHistory
	OpPing
	OpAuth     // token refresh
	OpPresence // who is in a room
	OpSignal   // an ephemeral frame to the room's other members (typing)
	OpRead     // move the user's read position in a room
	OpUnread   // the user's unread counts in some rooms
	OpReceipts // every user's read position in a room
)

// Command is one decoded client frame. Its byte slices alias the decoded
// payload: they are valid only as long as that buffer is (for the loop,
// until the frame is discarded from gnet's inbound buffer).
type Command struct {
	Op   Op
	Room []byte // "room", validated against [A-Za-z0-9_.:-]{1,128}
	ID   []byte // "id" (pub), 1 to 64 characters, raw JSON string content unescaped
	Body []byte // "body" (pub): the raw JSON value bytes exactly as sent
	// Token is "token" (auth): a JWT, which never needs JSON escapes.
	Token []byte

	Seq uint64 // "seq" (read)
	// Rooms (unread) is the raw JSON array of room names, validated:
	// walk it with RoomList.
	Rooms     []byte
	Since     uint64 // "since" (join), valid if HasSince
	Before    uint64 // "before" (history), valid if HasBefore
	Limit     int    // "limit" (history), valid if HasLimit
	HasSince  bool
	HasBefore bool
	HasLimit  bool
	// Epoch (join): the epoch the client last saw, at most MaxEpoch
	// bytes once unescaped; valid if HasEpoch.
	Epoch    []byte
	HasEpoch bool
	// Presence (join): the join also subscribes to the room's
	// presence_diff frames.
	Presence bool
	// NoEcho (join, "echo":false): the connection is not sent the msg
	// frames of its own publishes in the room.
	NoEcho bool
	// Receipts (join): the join also subscribes to the room's receipts
	// frames.
	Receipts bool
	// Kind (pub): what the publish does; Ref (pub) the seq of the message
	// it changes, valid if HasRef. Decode checks them (CheckKind).
	Kind   Kind
	Ref    uint64
	HasRef bool
	// After (history): list what follows this seq, oldest first; valid if
	// HasAfter.
	After    uint64
	HasAfter bool
	// Fold (history): list only messages, each as it stands now.
	Fold bool

	// Scratch for a room or id that arrived with JSON escapes: Room and ID
	// then point here instead of into the payload, so Decode stays
	// allocation-free. A copied Command still points into the original.
	roomBuf  [maxRoom + 1]byte // an inbox's @ and a room name
	idBuf    [maxID * 4]byte   // 64 characters of up to 4 bytes
	epochBuf [MaxEpoch]byte
	listBuf  [maxRoom + 1]byte // a name of Rooms, checked
}

// MaxEpoch bounds a room epoch's length in bytes (an epoch names the
// history a room's seqs belong to; docs/protocol.md, Resume).
const MaxEpoch = 32

// Message is a stored message as the wire shows it (the room name without
// its app).
type Message struct {
	Room string
	Seq  uint64
	ID   string
	From string
	TS   int64 // commit time, Unix ms
	Body []byte
	// Kind and Ref: a change of the message Ref (KindMsg: a message, Ref 0).
	Kind Kind
	Ref  uint64
	// Folded history only (a KindMsg as it stands now): Edited is the
	// commit time of its latest edit (0: never edited; Body is then the
	// edit's), Deleted that it was deleted (Body nil), Reactions its
	// reactions held by at least one user, by text.
	Folded    bool
	Edited    int64
	Deleted   bool
	Reactions []Reaction
}

// Code is an `err` frame code.
type Code uint8

const (
	CodeBadRequest Code = iota + 1
	CodeForbidden
	CodeNotFound
	CodeTooLarge
	CodeRateLimited
	CodeOverloaded
	CodeInternal
)

// WebSocket close codes of the protocol.
const (
	CloseNormal        = 1000
	CloseGoingAway     = 1001 // drain
	CloseProtocolError = 1002 // unmasked frame, bad opcode, bad continuation
	CloseUnsupported   = 1003 // binary data frame
	CloseInvalidData   = 1007 // not UTF-8, not a JSON object
	ClosePolicy        = 1008 // token expired, app disabled, app limit
	CloseTooBig        = 1009 // frame over the limit
	CloseTryAgain      = 1013 // slow consumer, overload, drain: "retry=MS"
)
