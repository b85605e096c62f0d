//go:build linux

package bench

import (
	"bytes"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"strconv"
	"strings"
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

// appendSSERequest appends GET /sse for one room on the host of the --url
// (its query kept); a reconnection resumes after since.
func appendSSERequest(dst []byte, host, pathQuery string, room []byte, identity string, resume bool, since uint64) []byte {
	q := pathQuery[strings.IndexByte(pathQuery, '?')+1:]
	dst = append(dst, "GET /sse?"...)
	dst = append(dst, q...)
	dst = append(dst, "room="...)
	dst = append(dst, room...)
	dst = append(dst, '&')
	dst = append(dst, identity...)
	if resume {
		dst = append(dst, "&since="...)
		dst = append(dst, room...)
		dst = append(dst, ':')
		dst = strconv.AppendUint(dst, since, 10)
	}
	dst = append(dst, " HTTP/1.1\r\nHost: "...)
	dst = append(dst, host...)
	return append(dst, "\r\nAccept: text/event-stream\r\n\r\n"...)
}

// parseSSEResponse is parseUpgradeResponse for an SSE stream: 200 with
// Content-Type text/event-stream.
func parseSSEResponse(b []byte) (n int, ok bool) {
	i := bytes.Index(b, []byte("\r\n\r\n"))
	if i < 0 {
		return 0, false
	}
	head := b[:i+4]
	ok = bytes.HasPrefix(head, []byte("HTTP/1.1 200")) && bytes.Contains(head, []byte("Content-Type: text/event-stream"))
	return i + 4, ok
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

// bodyStamp reads the send time a bench publisher put last in its body:
// {"p":"xx…","t":UNIX_NANOS}. 0 when the body is not a bench body.
func bodyStamp(body []byte) int64 {
	if len(body) == 0 || body[len(body)-1] != '}' {
		return 0
	}
	return stampBefore(body[:len(body)-1])
}

// stampBefore parses the number that ends b when `"t":` precedes it, else
// returns 0. A stamp now has 19 digits: those are read at fixed offsets,
// eight at a time, with no scan for where the number starts.
func stampBefore(b []byte) int64 {
	const key, width = `"t":`, 19
	if len(b) >= len(key)+width && string(b[len(b)-width-len(key):len(b)-width]) == key {
		d := b[len(b)-width:]
		hi, ok1 := digits8(binary.LittleEndian.Uint64(d))
		mid, ok2 := digits8(binary.LittleEndian.Uint64(d[8:]))
		a, b2, c := d[16]-'0', d[17]-'0', d[18]-'0'
		if ok1 && ok2 && a <= 9 && b2 <= 9 && c <= 9 {
			return int64(hi*1e11 + mid*1e3 + uint64(a)*100 + uint64(b2)*10 + uint64(c))
		}
		return 0
	}
	i := len(b)
	for i > 0 && b[i-1]-'0' <= 9 && len(b)-i < width {
		i--
	}
	if i == len(b) || i < len(key) || string(b[i-len(key):i]) != key {
		return 0
	}
	var n int64
	for _, c := range b[i:] {
		n = n*10 + int64(c-'0')
	}
	return n
}

// digits8 parses eight ASCII digits loaded little-endian (first digit in the
// low byte), SWAR style (Lemire, "Parsing series of integers with SIMD"): ok
// is false unless all eight are digits.
func digits8(v uint64) (uint64, bool) {
	if (v&0xF0F0F0F0F0F0F0F0)|((v+0x0606060606060606)&0xF0F0F0F0F0F0F0F0)>>4 != 0x3333333333333333 {
		return 0, false
	}
	v -= 0x3030303030303030
	v = v*10 + v>>8 // adjacent pairs: 2-digit values in bytes 0, 2, 4, 6
	const mask, mul1, mul2 = 0x000000FF000000FF, 100 + 1000000<<32, 1 + 10000<<32
	return ((v&mask)*mul1 + (v>>16&mask)*mul2) >> 32, true
}

// msgPrefix and the keys after it are how proto.AppendMsgFrame lays out a
// msg frame; TestMsgFastMatchesProto pins that.
const (
	msgPrefix = `{"op":"msg","room":"`
	msgSeqKey = `,"seq":`
	msgIDKey  = `,"id":"`
)

// msgFast is the receive path's fast path: it reads the seq and the bench
// body's send stamp of a msg frame in the node's layout. It checks the keys
// up to the seq, skips what the node wrote between (id, from, ts), and reads
// the stamp the bench put at the very end of the body. Decoding every byte
// (proto.DecodeServer) cost 40% of the bench's CPU per received frame, and
// walking every key to the body still 30%: the bench must cost less per
// frame than the node it measures. room is the connection's room, whose
// length says where the seq key starts. ok is false for any other layout,
// and the caller takes the slow path through DecodeServer.
func msgFast(p, room []byte) (seq uint64, stamp int64, ok bool) {
	if len(p) < len(msgPrefix) || string(p[:len(msgPrefix)]) != msgPrefix {
		return 0, 0, false
	}
	i := len(msgPrefix) + len(room)
	if i < len(p) && p[i] == '"' {
		i++
	} else {
		i = skipString(p, len(msgPrefix))
	}
	if !keyAt(p, i, msgSeqKey) {
		return 0, 0, false
	}
	i += len(msgSeqKey)
	start := i
	for ; i < len(p) && p[i]-'0' <= 9; i++ {
		seq = seq*10 + uint64(p[i]-'0')
	}
	if i == start || !keyAt(p, i, msgIDKey) || p[len(p)-1] != '}' {
		return 0, 0, false
	}
	if p[len(p)-2] == '}' {
		stamp = stampBefore(p[:len(p)-2])
	}
	return seq, stamp, true
}

// skipString returns the index after the closing quote of the string whose
// first content byte is at i, or -1 when it holds an escape or has no end.
func skipString(p []byte, i int) int {
	for ; i < len(p); i++ {
		switch p[i] {
		case '"':
			return i + 1
		case '\\':
			return -1
		}
	}
	return -1
}

// keyAt reports whether p holds key at i (i may be -1).
func keyAt(p []byte, i int, key string) bool {
	return i >= 0 && len(p)-i >= len(key) && string(p[i:i+len(key)]) == key
}

// joinedResume reads what a joined frame says about a rejoin with since:
// the room's epoch, and whether every message after since follows
// (recovered absent or true) or only those from seq from on. The node
// writes its frames compactly, and this runs once per join, not per
// message, so a search for the keys does.
func joinedResume(p []byte) (epoch []byte, lost bool, from uint64) {
	if i := bytes.Index(p, []byte(`"epoch":"`)); i >= 0 {
		rest := p[i+len(`"epoch":"`):]
		if j := bytes.IndexByte(rest, '"'); j >= 0 {
			epoch = rest[:j]
		}
	}
	if !bytes.Contains(p, []byte(`"recovered":false`)) {
		return epoch, false, 0
	}
	if i := bytes.Index(p, []byte(`"from":`)); i >= 0 {
		rest := p[i+len(`"from":`):]
		j := 0
		for j < len(rest) && rest[j] >= '0' && rest[j] <= '9' {
			j++
		}
		from, _ = parseUint(rest[:j])
	}
	return epoch, true, from
}

// retryHint reads the jittered reconnect delay a node puts in the reason
// of its 1013 and 1001 closes ("retry=MS"); 0 when there is none.
func retryHint(reason []byte) int64 {
	i := bytes.Index(reason, []byte("retry="))
	if i < 0 {
		return 0
	}
	rest := reason[i+len("retry="):]
	j := 0
	for j < len(rest) && rest[j] >= '0' && rest[j] <= '9' {
		j++
	}
	v, ok := parseUint(rest[:j])
	if !ok || j == 0 {
		return 0
	}
	return int64(v) * 1e6
}
