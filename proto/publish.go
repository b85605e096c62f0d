package proto

import (
	"bytes"
	"errors"
)

// The vocabulary of the publish path, shared by every package on it: room
// keys, reading a msg frame's commit time, and the errors a store or the
// publish path answers with.

// Sentinel errors of the publish path. Callers map them to err codes.
var (
	// ErrOverloaded: the publish or read cannot be taken now (queue full,
	// database unreachable, statement timeout). The client gets `err`
	// `overloaded`; nothing was acknowledged, so nothing is lost.
	ErrOverloaded = errors.New("overloaded")
	// ErrClosed: the publish path or the store was closed.
	ErrClosed = errors.New("closed")
)

// RoomKey is the node-wide name of a room: app + "/" + room. App ids match
// [A-Za-z0-9_.-]{1,64} (ValidAppID) and room names [A-Za-z0-9_.:-]{1,128}
// (ValidRoom), so "/" never occurs in either and the key splits
// unambiguously (SplitKey).
func RoomKey(app, room string) string { return app + "/" + room }

// SplitKey is the inverse of RoomKey.
func SplitKey(key string) (app, room string) {
	for i := 0; i < len(key); i++ {
		if key[i] == '/' {
			return key[:i], key[i+1:]
		}
	}
	return "", key
}

// ValidAppID reports whether id can name an app: [A-Za-z0-9_.-]{1,64}.
func ValidAppID(id []byte) bool {
	if len(id) == 0 || len(id) > 64 {
		return false
	}
	for _, ch := range id {
		if !(ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || ch == '_' || ch == '.' || ch == '-') {
			return false
		}
	}
	return true
}

// FrameTS reads the commit time out of a pre-encoded msg frame without
// decoding it. The bytes `,"ts":` cannot occur inside the escaped id or
// from strings before it (a quote in a string is always escaped), so the
// first match is the field.
func FrameTS(frame []byte) (int64, bool) {
	i := bytes.Index(frame, []byte(`,"ts":`))
	if i < 0 {
		return 0, false
	}
	var ts int64
	j := i + len(`,"ts":`)
	for ; j < len(frame) && frame[j] >= '0' && frame[j] <= '9'; j++ {
		ts = ts*10 + int64(frame[j]-'0')
	}
	return ts, j > i+len(`,"ts":`)
}
