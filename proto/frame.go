package proto

import (
	"errors"

	"github.com/gobwas/ws"
)

// ErrProtocol means a frame header breaks RFC 6455: reserved bits set (no
// extension is negotiated), an unknown opcode, a fragmented or over-long
// control frame, or a 64-bit length with the top bit set. The connection is
// closed with 1002.
var ErrProtocol = errors.New("proto: invalid websocket frame header")

// ParseFrameHeader parses the frame header at the start of b and returns it
// with its length in bytes. When b holds only part of a header it returns
// n=0 and no error, and the caller waits for more bytes; errors visible in
// the first two bytes are reported as soon as they arrive. It checks neither
// the masking requirement nor the size limit: those are the caller's
// (1002, 1009).
func ParseFrameHeader(b []byte) (h ws.Header, n int, err error) {
	if len(b) < 2 {
		return h, 0, nil
	}
	b0, b1 := b[0], b[1]
	h.Fin = b0&0x80 != 0
	h.Rsv = (b0 >> 4) & 0x7
	h.OpCode = ws.OpCode(b0 & 0x0f)
	h.Masked = b1&0x80 != 0
	l := int64(b1 & 0x7f)
	if h.Rsv != 0 {
		return ws.Header{}, 0, ErrProtocol
	}
	switch h.OpCode {
	case ws.OpContinuation, ws.OpText, ws.OpBinary:
	case ws.OpClose, ws.OpPing, ws.OpPong:
		if !h.Fin || l > maxControl {
			return ws.Header{}, 0, ErrProtocol
		}
	default:
		return ws.Header{}, 0, ErrProtocol
	}
	n = 2
	switch l {
	case 126:
		if len(b) < 4 {
			return ws.Header{}, 0, nil
		}
		l = int64(b[2])<<8 | int64(b[3])
		n = 4
	case 127:
		if len(b) < 10 {
			return ws.Header{}, 0, nil
		}
		if b[2]&0x80 != 0 {
			return ws.Header{}, 0, ErrProtocol
		}
		l = int64(b[2])<<56 | int64(b[3])<<48 | int64(b[4])<<40 | int64(b[5])<<32 |
			int64(b[6])<<24 | int64(b[7])<<16 | int64(b[8])<<8 | int64(b[9])
		n = 10
	}
	h.Length = l
	if h.Masked {
		if len(b) < n+4 {
			return ws.Header{}, 0, nil
		}
		copy(h.Mask[:], b[n:n+4])
		n += 4
	}
	return h, n, nil
}

// Unmask unmasks a client payload in place. For a payload handled in pieces,
// use ws.Cipher with the offset of the piece.
func Unmask(payload []byte, mask [4]byte) {
	ws.Cipher(payload, mask, 0)
}
