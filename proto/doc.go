// Package proto owns the wire and the vocabulary every layer shares.
//
// The wire: protocol v1 as in docs/protocol.md. It decodes client frames
// without allocating, encodes server frames once (WebSocket header and
// JSON in one buffer, so the same bytes go to every receiver), parses the
// HTTP upgrade and RFC 6455 frame headers from any split of the input,
// and maps client errors to err codes and close codes; the Server-Sent
// Events framing, tokens and request signatures likewise.
//
// The vocabulary: room keys (RoomKey, SplitKey), the sentinel errors of
// the publish path (ErrOverloaded, ErrClosed, ErrRoomLimit), stored
// messages (Message), and an app's registry entry (App) with its limits.
// A publish on its way (fanout.PubRequest) and a committed row
// (persist.Row) belong to the packages that make them, not here.
//
// proto imports no other roost package.
package proto
