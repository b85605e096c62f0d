package proto

// A signal (typing, a cursor) is carried like a msg frame but never
// stored: no seq, no id, no ts. Its frame is encoded once by the sending
// node and shared by every receiver on every node.

const (
	signalPrefix = `{"op":"signal","room":`
	signalFrom   = `,"from":`
	signalBody   = `,"body":`
)

// SignalFrameLen is the length of the signal frame AppendSignalFrame
// appends, header included: a caller sizes its buffer with it.
func SignalFrameLen[R text](room R, from string, body []byte) int {
	n := signalPayloadLen(room, from, body)
	return headerLen(n) + n
}

func signalPayloadLen[R text](room R, from string, body []byte) int {
	return len(signalPrefix) + quotedLen(room) + len(signalFrom) + quotedLen(from) +
		len(signalBody) + len(bodyOrNull(body)) + 1
}

// AppendSignalFrame appends {"op":"signal","room":..,"from":..,"body":..}.
// body is the sender's JSON value, copied byte for byte.
func AppendSignalFrame[R text](dst []byte, room R, from string, body []byte) []byte {
	n := signalPayloadLen(room, from, body)
	dst = beginText(dst, n)
	start := len(dst)
	dst = append(dst, signalPrefix...)
	dst = appendQuoted(dst, room)
	dst = append(dst, signalFrom...)
	dst = appendQuoted(dst, from)
	dst = append(dst, signalBody...)
	dst = append(dst, bodyOrNull(body)...)
	dst = append(dst, '}')
	return endText(dst, start, n)
}
