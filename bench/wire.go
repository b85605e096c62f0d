package bench

import (
	"bytes"
	"crypto/sha1"
	"encoding/base64"
)

// wsKey is the fixed Sec-WebSocket-Key every bench connection sends: the
// key only proves the server speaks WebSocket, and a fixed one lets the
// accept value be checked with one bytes.Contains.
const wsKey = "cm9vc3QtYmVuY2gta2V5MQ=="

var wsAccept = func() []byte {
	h := sha1.Sum([]byte(wsKey + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	return []byte(base64.StdEncoding.EncodeToString(h[:]))
}()

// appendUpgrade appends the HTTP upgrade request for path?query.
func appendUpgrade(dst []byte, host, pathQuery string) []byte {
	dst = append(dst, "GET "...)
	dst = append(dst, pathQuery...)
	dst = append(dst, " HTTP/1.1\r\nHost: "...)
	dst = append(dst, host...)
	dst = append(dst, "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: "...)
	dst = append(dst, wsKey...)
	dst = append(dst, "\r\nSec-WebSocket-Version: 13\r\n\r\n"...)
	return dst
}

// parseUpgradeResponse reports the length of a complete response head (0 if
// incomplete) and whether it accepted the upgrade.
func parseUpgradeResponse(b []byte) (n int, ok bool) {
	i := bytes.Index(b, []byte("\r\n\r\n"))
	if i < 0 {
		return 0, false
	}
	head := b[:i+4]
	ok = bytes.HasPrefix(head, []byte("HTTP/1.1 101")) && bytes.Contains(head, wsAccept)
	return i + 4, ok
}

func parseUint(v []byte) (uint64, bool) {
	if len(v) == 0 {
		return 0, false
	}
	var n uint64
	for _, c := range v {
		if c < '0' || c > '9' {
			return n, false
		}
		n = n*10 + uint64(c-'0')
	}
	return n, true
}

// bodyStamp reads the send time a bench publisher put first in its body:
// {"t":UNIX_NANOS,...}. 0 when the body is not a bench body.
func bodyStamp(body []byte) int64 {
	const prefix = `{"t":`
	if len(body) < len(prefix)+1 || string(body[:len(prefix)]) != prefix {
		return 0
	}
	var n int64
	for _, c := range body[len(prefix):] {
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + int64(c-'0')
	}
	return n
}

// msgPrefix and the keys after it are how proto.AppendMsgFrame lays out a
// msg frame; TestMsgFastMatchesProto pins that.
const (
	msgPrefix = `{"op":"msg","room":"`
	msgSeqKey = `","seq":`
	msgBodyTS = `,"body":{"t":`
)

// msgFast is the receive path's fast path: it reads the seq and the bench
// body's send stamp of a msg frame in the node's layout without validating
// the rest. proto.DecodeServer validates every byte of the body and cost 40%
// of the bench's CPU per received frame, more than the node spends on the
// frame, and the bench must not be what a run measures. ok is false for any
// other layout, and the caller takes the slow path through DecodeServer.
func msgFast(p []byte) (seq uint64, stamp int64, ok bool) {
	if len(p) < len(msgPrefix)+len(msgSeqKey)+2 || string(p[:len(msgPrefix)]) != msgPrefix {
		return 0, 0, false
	}
	i := len(msgPrefix)
	// room names are [A-Za-z0-9_.:-]: no escapes, the next quote ends it
	j := bytes.IndexByte(p[i:], '"')
	if j < 0 {
		return 0, 0, false
	}
	i += j
	if len(p)-i < len(msgSeqKey)+1 || string(p[i:i+len(msgSeqKey)]) != msgSeqKey {
		return 0, 0, false
	}
	i += len(msgSeqKey)
	start := i
	for ; i < len(p) && p[i] >= '0' && p[i] <= '9'; i++ {
		seq = seq*10 + uint64(p[i]-'0')
	}
	if i == start || i >= len(p) || p[i] != ',' {
		return 0, 0, false
	}
	// id and from are bench-made (digits, u<N>), so the first body key
	// found is the body's
	k := bytes.Index(p[i:], []byte(msgBodyTS))
	if k < 0 {
		return seq, 0, true
	}
	return seq, bodyStamp(p[i+k+len(`,"body":`):]), true
}
