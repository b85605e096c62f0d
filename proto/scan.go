package proto

import (
	"encoding/binary"
	"math/bits"
	"strconv"
)

// This file holds the strict RFC 8259 scanner shared by Decode and
// DecodeServer. It validates while it walks, so one pass both checks the
// whole payload and finds the top-level fields: a separate validator pass
// (sonic.Valid) would read every byte twice and is not strict anyway (it
// accepts raw control characters and unknown escapes inside strings).
// UTF-8 is not checked here: the caller has already validated the text frame.

// MaxDepth bounds nesting (the top-level object is depth 1), as sonic does:
// one limit for every edge that takes JSON (WebSocket frames, the server
// API's requests), so that nothing stored is deeper than a socket takes
// or sonic encodes. RFC 8259 section 9 allows the limit; it keeps the
// container stack small.
const MaxDepth = 4096

// ErrTooDeep refuses JSON nested deeper than MaxDepth: an `err`
// bad_request on a WebSocket (the connection stays), a 400 on the API.
var ErrTooDeep = &Error{CodeBadRequest, "JSON nested deeper than " + strconv.Itoa(MaxDepth) + " levels (the outer object is the first)"}

// CheckValue validates the JSON value b (surrounding whitespace allowed)
// nested inside depth containers: nil, ErrTooDeep, or ErrMalformed.
func CheckValue(b []byte, depth int) error {
	i := skipWS(b, 0)
	end, ok := skipValue(b, i, depth)
	switch {
	case ok && skipWS(b, end) == len(b):
		return nil
	case !ok && tooDeep(b, i, depth):
		return ErrTooDeep
	}
	return ErrMalformed
}

// tooDeep reports whether the walk of the value at b[i] stops at the depth
// limit rather than on bad syntax (the first problem met decides). Only
// on the way to an error: it walks the value again.
func tooDeep(b []byte, i, depth int) bool {
	var big [MaxDepth / 64]uint64
	_, res := walkValue(b, i, depth, big[:])
	return res == walkDeep
}

// strStop marks bytes that end the fast path inside a string: the quote, the
// backslash and the control characters RFC 8259 forbids unescaped.
var strStop = func() (t [256]bool) {
	for c := 0; c < 0x20; c++ {
		t[c] = true
	}
	t['"'] = true
	t['\\'] = true
	return t
}()

func isSpace(c byte) bool { return c == ' ' || c == '\n' || c == '\r' || c == '\t' }

func skipWS(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

func hexVal(c byte) rune {
	switch {
	case '0' <= c && c <= '9':
		return rune(c - '0')
	case 'a' <= c && c <= 'f':
		return rune(c - 'a' + 10)
	case 'A' <= c && c <= 'F':
		return rune(c - 'A' + 10)
	}
	return -1
}

// scanString validates a string whose opening quote is at b[i-1]. It returns
// the index of the closing quote and whether the content holds escapes.
func scanString(b []byte, i int) (end int, esc bool, ok bool) {
	for i < len(b) {
		// Fast path: eight bytes at a time. A byte stops the scan when it is
		// '"', '\\' or below 0x20; the classic SWAR tests flag such bytes, and
		// the lowest flag is exact (borrows only run upwards), so the scan
		// jumps straight to the first stop byte.
		for i+8 <= len(b) {
			w := binary.LittleEndian.Uint64(b[i:])
			const lo, hi = 0x0101010101010101, 0x8080808080808080
			q := w ^ (lo * '"')
			s := w ^ (lo * '\\')
			hit := ((w - lo*0x20) | (q - lo) | (s - lo)) & ^w & hi
			if hit != 0 {
				i += bits.TrailingZeros64(hit) >> 3
				break
			}
			i += 8
		}
		if i >= len(b) {
			break
		}
		c := b[i]
		if !strStop[c] {
			i++
			continue
		}
		switch c {
		case '"':
			return i, esc, true
		case '\\':
			esc = true
			if i+1 >= len(b) {
				return i, esc, false
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) || hexVal(b[i+2]) < 0 || hexVal(b[i+3]) < 0 || hexVal(b[i+4]) < 0 || hexVal(b[i+5]) < 0 {
					return i, esc, false
				}
				i += 6
			default:
				return i, esc, false
			}
		default: // a raw control character
			return i, esc, false
		}
	}
	return i, esc, false
}

// scanNumber validates -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? at b[i]
// and returns the index after it.
func scanNumber(b []byte, i int) (int, bool) {
	if i < len(b) && b[i] == '-' {
		i++
	}
	if i >= len(b) {
		return i, false
	}
	switch c := b[i]; {
	case c == '0':
		i++
	case '1' <= c && c <= '9':
		i++
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	default:
		return i, false
	}
	if i < len(b) && b[i] == '.' {
		i++
		s := i
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
		if i == s {
			return i, false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		s := i
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
		if i == s {
			return i, false
		}
	}
	return i, true
}

// parseUint reads a number already validated by scanNumber as a plain
// non-negative integer: no sign, fraction or exponent, and fitting uint64.
func parseUint(num []byte) (uint64, bool) {
	if len(num) == 0 {
		return 0, false
	}
	var v uint64
	for _, c := range num {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if v > (1<<64-1-d)/10 {
			return 0, false
		}
		v = v*10 + d
	}
	return v, true
}

// parseInt is parseUint allowing a leading minus and fitting int64.
func parseInt(num []byte) (int64, bool) {
	neg := len(num) > 0 && num[0] == '-'
	if neg {
		num = num[1:]
	}
	u, ok := parseUint(num)
	if !ok {
		return 0, false
	}
	if neg {
		if u > 1<<63 {
			return 0, false
		}
		return -int64(u), true
	}
	if u > 1<<63-1 {
		return 0, false
	}
	return int64(u), true
}

func matchLit(b []byte, i int, lit string) (int, bool) {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return i, false
	}
	return i + len(lit), true
}

// skipValue validates the JSON value starting at b[i] (no leading space),
// nested inside containers of the given depth, and returns the index after
// it. Fast path: 64 levels of container bits in one word; deeper values are
// walked again with a stack sized for MaxDepth, so the common case does not
// clear 512 bytes of stack on every call.
func skipValue(b []byte, i, depth int) (int, bool) {
	var small [1]uint64
	end, res := walkValue(b, i, depth, small[:])
	if res == walkTooDeep {
		var big [MaxDepth / 64]uint64
		end, res = walkValue(b, i, depth, big[:])
	}
	return end, res == walkOK
}

type walkResult uint8

const (
	walkOK walkResult = iota
	walkBad
	walkTooDeep // the stack given was too small, not MaxDepth
	walkDeep    // past MaxDepth
)

// walkValue is skipValue's iterative core. stk holds one bit per open
// container (1: object, 0: array).
func walkValue(b []byte, i, depth int, stk []uint64) (int, walkResult) {
	lvl := 0
	for {
		// A value is expected at b[i].
		if i >= len(b) {
			return i, walkBad
		}
		var ok bool
		switch c := b[i]; c {
		case '"':
			i, _, ok = scanString(b, i+1)
			i++
		case '{', '[':
			if depth+lvl+1 > MaxDepth {
				return i, walkDeep
			}
			if lvl >= len(stk)*64 {
				return i, walkTooDeep
			}
			obj := c == '{'
			if obj {
				stk[lvl>>6] |= 1 << (lvl & 63)
			} else {
				stk[lvl>>6] &^= 1 << (lvl & 63)
			}
			lvl++
			i = skipWS(b, i+1)
			if i >= len(b) {
				return i, walkBad
			}
			if obj && b[i] == '}' || !obj && b[i] == ']' {
				lvl--
				i++
				ok = true
				break
			}
			if obj {
				if i, ok = skipKey(b, i); !ok {
					return i, walkBad
				}
			}
			continue
		case 't':
			i, ok = matchLit(b, i, "true")
		case 'f':
			i, ok = matchLit(b, i, "false")
		case 'n':
			i, ok = matchLit(b, i, "null")
		default:
			i, ok = scanNumber(b, i)
		}
		if !ok {
			return i, walkBad
		}
		// After a value: close containers or move to the next element.
		for {
			if lvl == 0 {
				return i, walkOK
			}
			i = skipWS(b, i)
			if i >= len(b) {
				return i, walkBad
			}
			obj := stk[(lvl-1)>>6]&(1<<((lvl-1)&63)) != 0
			c := b[i]
			if c == ',' {
				i = skipWS(b, i+1)
				if obj {
					if i, ok = skipKey(b, i); !ok {
						return i, walkBad
					}
				}
				break
			}
			if obj && c == '}' || !obj && c == ']' {
				lvl--
				i++
				continue
			}
			return i, walkBad
		}
	}
}

// skipKey reads `"key" :` plus the space after it, at b[i].
func skipKey(b []byte, i int) (int, bool) {
	if i >= len(b) || b[i] != '"' {
		return i, false
	}
	i, _, ok := scanString(b, i+1)
	if !ok {
		return i, false
	}
	i = skipWS(b, i+1)
	if i >= len(b) || b[i] != ':' {
		return i, false
	}
	return skipWS(b, i+1), true
}

// unescape decodes the validated content of a JSON string into dst and
// returns the number of bytes written, or ok=false when dst is too small.
// Lone or broken surrogates become U+FFFD, as encoding/json does.
func unescape(dst, raw []byte) (n int, ok bool) {
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' {
			if n >= len(dst) {
				return n, false
			}
			dst[n] = c
			n++
			i++
			continue
		}
		var r rune
		switch raw[i+1] {
		case 'b':
			r = '\b'
		case 'f':
			r = '\f'
		case 'n':
			r = '\n'
		case 'r':
			r = '\r'
		case 't':
			r = '\t'
		case 'u':
			r = hex4(raw[i+2:])
			i += 4
			if 0xd800 <= r && r < 0xe000 {
				r2 := rune(-1)
				if r < 0xdc00 && i+8 <= len(raw) && raw[i+2] == '\\' && raw[i+3] == 'u' {
					r2 = hex4(raw[i+4:])
				}
				if 0xdc00 <= r2 && r2 < 0xe000 {
					r = (r-0xd800)<<10 | (r2 - 0xdc00) + 0x10000
					i += 6
				} else {
					r = 0xfffd
				}
			}
		default: // '"', '\\', '/'
			r = rune(raw[i+1])
		}
		i += 2
		w := appendRune(dst[n:], r)
		if w == 0 {
			return n, false
		}
		n += w
	}
	return n, true
}

func hex4(b []byte) rune {
	return hexVal(b[0])<<12 | hexVal(b[1])<<8 | hexVal(b[2])<<4 | hexVal(b[3])
}

// appendRune writes r as UTF-8 at the start of dst and returns its length,
// or 0 when dst is too short.
func appendRune(dst []byte, r rune) int {
	switch {
	case r < 0x80:
		if len(dst) < 1 {
			return 0
		}
		dst[0] = byte(r)
		return 1
	case r < 0x800:
		if len(dst) < 2 {
			return 0
		}
		dst[0] = 0xc0 | byte(r>>6)
		dst[1] = 0x80 | byte(r)&0x3f
		return 2
	case r < 0x10000:
		if len(dst) < 3 {
			return 0
		}
		dst[0] = 0xe0 | byte(r>>12)
		dst[1] = 0x80 | byte(r>>6)&0x3f
		dst[2] = 0x80 | byte(r)&0x3f
		return 3
	default:
		if len(dst) < 4 {
			return 0
		}
		dst[0] = 0xf0 | byte(r>>18)
		dst[1] = 0x80 | byte(r>>12)&0x3f
		dst[2] = 0x80 | byte(r>>6)&0x3f
		dst[3] = 0x80 | byte(r)&0x3f
		return 4
	}
}

// The top-level object walk that Decode and DecodeServer share; ok=false
// means the input is not one well-formed JSON object (ErrMalformed). A walk
// is objectOpen, then per member memberKey, the caller's own handling of the
// value (leaving i just past it), and memberNext; then only whitespace may
// follow.

// objectOpen reads the opening brace of a top-level object. more reports
// that a member follows at i; otherwise the object was {} and i is past it.
func objectOpen(b []byte) (i int, more, ok bool) {
	i = skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return i, false, false
	}
	i = skipWS(b, i+1)
	if i >= len(b) {
		return i, false, false
	}
	if b[i] == '}' {
		return i + 1, false, true
	}
	return i, true, true
}

// memberKey reads `"key" :` at b[i]: the key's raw content b[ks:ke],
// whether it holds escapes, and where the value starts (within b).
func memberKey(b []byte, i int) (ks, ke int, esc bool, vs int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return 0, 0, false, i, false
	}
	ks = i + 1
	ke, esc, ok = scanString(b, ks)
	if !ok {
		return ks, ke, esc, i, false
	}
	i = skipWS(b, ke+1)
	if i >= len(b) || b[i] != ':' {
		return ks, ke, esc, i, false
	}
	vs = skipWS(b, i+1)
	return ks, ke, esc, vs, vs < len(b)
}

// memberNext reads what follows a member's value: a comma (more: the next
// member starts at next) or the closing brace (next is past it).
func memberNext(b []byte, i int) (next int, more, ok bool) {
	i = skipWS(b, i)
	if i >= len(b) {
		return i, false, false
	}
	if b[i] == ',' {
		i = skipWS(b, i+1)
		return i, true, i < len(b)
	}
	if b[i] != '}' {
		return i, false, false
	}
	return i + 1, false, true
}
