package proto

import (
	"bytes"
	"errors"
)

// Control messages travel between nodes on the broker beside the rooms'
// messages, on a key no room can have (ControlKey has no "/", every room
// key has one). They are rare (a backend's disconnect call), so their
// encoding favours plainness over speed.

// ControlKey is the broker key every node subscribes to for control
// messages.
const ControlKey = "roost.control"

// PresenceKey is the broker key every node subscribes to for the rooms'
// presence changes (one message per node per tick, gathering every room's).
const PresenceKey = "roost.presence"

// Control is one control message.
type Control struct {
	Op   string // "disconnect"
	App  string
	User string
}

// ControlDisconnect closes every connection of Control.User of
// Control.App on every node.
const ControlDisconnect = "disconnect"

// AppendControl encodes c as "op\x00app\x00user". App ids and user ids
// never hold a NUL (ValidAppID, ValidUser), so the split is unambiguous.
func AppendControl(dst []byte, c *Control) []byte {
	dst = append(dst, c.Op...)
	dst = append(dst, 0)
	dst = append(dst, c.App...)
	dst = append(dst, 0)
	return append(dst, c.User...)
}

var errBadControl = errors.New("malformed control message")

// ParseControl decodes what AppendControl encoded and checks the ids as
// they are checked where they enter.
func ParseControl(b []byte, c *Control) error {
	parts := bytes.Split(b, []byte{0})
	if len(parts) != 3 || string(parts[0]) != ControlDisconnect || !ValidAppID(parts[1]) || !ValidUser(parts[2]) {
		return errBadControl
	}
	c.Op, c.App, c.User = string(parts[0]), string(parts[1]), string(parts[2])
	return nil
}
