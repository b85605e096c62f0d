package proto

import "unicode/utf8"

// Identities and keys that reach the store are checked where they enter
// (the upgrade, the token, the decoder): PostgreSQL refuses text with a NUL
// or invalid UTF-8, and one such value in a group commit would fail the
// whole statement, everybody's publishes with it.

const (
	// MaxUser is the longest user id (the `sub` of a token, or ?user= in
	// insecure mode), in characters.
	MaxUser = 128
	// MaxID is the longest pub id, in characters.
	MaxID = maxID
)

// ValidUser reports whether user can name a publisher: 1 to MaxUser
// characters of valid UTF-8 without control characters (C0, DEL, C1). The
// id is stored as text and copied into every msg frame and presence list,
// where a control character is never meant.
func ValidUser(user []byte) bool {
	if len(user) == 0 || len(user) > utf8.UTFMax*MaxUser {
		return false
	}
	n := 0
	for i := 0; i < len(user); {
		c := user[i]
		if c < utf8.RuneSelf {
			if c < 0x20 || c == 0x7f {
				return false
			}
			i++
		} else {
			r, w := utf8.DecodeRune(user[i:])
			if r == utf8.RuneError && w == 1 || r >= 0x80 && r <= 0x9f {
				return false
			}
			i += w
		}
		if n++; n > MaxUser {
			return false
		}
	}
	return true
}

// ValidID reports whether id can be a pub id: 1 to MaxID characters. The
// decoder hands over valid UTF-8 only (a lone surrogate escape decodes to
// U+FFFD); the id is stored as bytes, so any character does.
func ValidID(id []byte) bool {
	if len(id) == 0 || len(id) > utf8.UTFMax*MaxID {
		return false
	}
	return utf8.RuneCount(id) <= MaxID
}
