package proto

import "errors"

// ErrRoomLimit: the publish or join would make a new room of an app that
// has its maximum of rooms already (--max-rooms-per-app). Nothing was
// stored; the client gets `err` `forbidden`.
var ErrRoomLimit = errors.New("room limit of the app reached")
