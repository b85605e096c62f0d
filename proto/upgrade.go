package proto

import (
	"bytes"
	"crypto/sha1"
	"encoding/base64"
	"slices"
	"strconv"
)

// MaxRequestHead bounds an HTTP request head, terminator included.
const MaxRequestHead = 8192

// HTTPError is a refused HTTP request: the caller answers it with
// AppendHTTPError and closes. Every value ParseRequest returns is one of the
// package's, so compare by pointer.
type HTTPError struct {
	Status int
	Reason string
}

func (e *HTTPError) Error() string { return e.Reason }

// Errors returned by ParseRequest. A version other than HTTP/1.0 and 1.1
// that is still well-formed (HTTP/2.0) gets 505; anything else malformed in
// the request line gets 400.
var (
	ErrBadRequestLine   = &HTTPError{400, "malformed request line"}
	ErrBadHeader        = &HTTPError{400, "malformed header line"}
	ErrVersion          = &HTTPError{505, "only HTTP/1.1 and HTTP/1.0 are supported"}
	ErrMethod           = &HTTPError{405, "method not allowed"}
	ErrHeadTooLarge     = &HTTPError{431, "request head larger than 8192 bytes"}
	ErrWebSocketVersion = &HTTPError{426, "Sec-WebSocket-Version must be 13"}
	ErrWebSocketKey     = &HTTPError{400, "Sec-WebSocket-Key must be the base64 of 16 bytes"}
	ErrUpgradeHTTP10    = &HTTPError{400, "a websocket upgrade needs HTTP/1.1"}
)

// Request is a parsed request head. Its slices alias the parsed bytes.
type Request struct {
	Method, Path, Query, Key, Version []byte
	// Authorization is the Authorization header's value (a client's
	// "Bearer JWT"), nil when absent.
	Authorization []byte
	// Upgrade is true when the Upgrade header names websocket and the
	// Connection header holds the upgrade token; Key and the version are
	// then checked.
	Upgrade bool
	// IfNoneMatch is the If-None-Match header of a plain GET (the ETag a
	// browser revalidates a cached file with).
	IfNoneMatch []byte
	// LastEventID is the Last-Event-ID header: the position an SSE client
	// (a browser's EventSource) resumes from.
	LastEventID []byte
	// Head is a HEAD request: answered as its GET would be, without the
	// body, and never an upgrade.
	Head bool
}

var crlfcrlf = []byte("\r\n\r\n")

// tchar marks RFC 9110 token characters (header names, methods).
var tchar = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
		t[c-'a'+'A'] = true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

// ParseRequest parses the request head at the start of b, which may be any
// prefix of what the peer sent. It returns n=0 and no error until the head
// is complete (through CRLFCRLF), then the head's length; bytes after it
// are not looked at (they may already be frames). A head over
// MaxRequestHead fails with ErrHeadTooLarge, other refusals with the
// *HTTPError values above. It does not judge the path, and accepts a
// request that is not an upgrade (Upgrade false) for the caller to serve.
func ParseRequest(b []byte, r *Request) (n int, err error) {
	*r = Request{}
	end := bytes.Index(b[:min(len(b), MaxRequestHead)], crlfcrlf)
	if end < 0 {
		if len(b) >= MaxRequestHead {
			return 0, ErrHeadTooLarge
		}
		return 0, nil
	}
	n = end + 4
	head := b[:end+2] // every line with its CRLF

	// Request line: method SP target SP version.
	eol := bytes.Index(head, []byte("\r\n"))
	line := head[:eol]
	sp1 := bytes.IndexByte(line, ' ')
	if sp1 <= 0 {
		return 0, ErrBadRequestLine
	}
	r.Method = line[:sp1]
	for _, c := range r.Method {
		if !tchar[c] {
			return 0, ErrBadRequestLine
		}
	}
	rest := line[sp1+1:]
	sp2 := bytes.IndexByte(rest, ' ')
	if sp2 <= 0 {
		return 0, ErrBadRequestLine
	}
	// Only origin-form ("/path?query"): a GET to a server, not a proxy.
	target := rest[:sp2]
	if target[0] != '/' {
		return 0, ErrBadRequestLine
	}
	for _, c := range target {
		if c <= ' ' || c == 0x7f {
			return 0, ErrBadRequestLine
		}
	}
	r.Path = target
	if q := bytes.IndexByte(target, '?'); q >= 0 {
		r.Path, r.Query = target[:q], target[q+1:]
	}
	r.Version = rest[sp2+1:]
	v := r.Version
	if len(v) != 8 || string(v[:5]) != "HTTP/" || !isDigit(v[5]) || v[6] != '.' || !isDigit(v[7]) {
		return 0, ErrBadRequestLine
	}
	http10 := string(v) == "HTTP/1.0"
	if !http10 && string(v) != "HTTP/1.1" {
		return 0, ErrVersion
	}

	var upgradeWS, connUpgrade bool
	var wsVersion []byte
	haveVersion := false
	for p := eol + 2; p < len(head); {
		e := p + bytes.Index(head[p:], []byte("\r\n"))
		line := head[p:e]
		p = e + 2
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 {
			return 0, ErrBadHeader
		}
		name := line[:colon]
		for _, c := range name {
			if !tchar[c] {
				return 0, ErrBadHeader
			}
		}
		val := line[colon+1:]
		for _, c := range val {
			if c < ' ' && c != '\t' || c == 0x7f {
				return 0, ErrBadHeader
			}
		}
		val = trimOWS(val)
		// Switch on the length first: most headers (Host, User-Agent,
		// Accept-*) then cost one comparison.
		switch len(name) {
		case len("Upgrade"), len("Connection"), len("Sec-WebSocket-Key"), len("Sec-WebSocket-Version"), len("If-None-Match"): // = len("Authorization") = len("Last-Event-ID")
		default:
			continue
		}
		switch {
		case bytes.EqualFold(name, []byte("Upgrade")):
			upgradeWS = upgradeWS || hasToken(val, "websocket")
		case bytes.EqualFold(name, []byte("Connection")):
			connUpgrade = connUpgrade || hasToken(val, "upgrade")
		case bytes.EqualFold(name, []byte("Sec-WebSocket-Key")):
			r.Key = val
		case bytes.EqualFold(name, []byte("Sec-WebSocket-Version")):
			wsVersion, haveVersion = val, true
		case bytes.EqualFold(name, []byte("If-None-Match")):
			r.IfNoneMatch = val
		case bytes.EqualFold(name, []byte("Authorization")):
			r.Authorization = val
		case bytes.EqualFold(name, []byte("Last-Event-ID")):
			r.LastEventID = val
		}
	}
	r.Head = string(r.Method) == "HEAD"
	if string(r.Method) != "GET" && !r.Head {
		return 0, ErrMethod
	}
	r.Upgrade = upgradeWS && connUpgrade && !r.Head
	if !r.Upgrade {
		return n, nil
	}
	if http10 {
		return 0, ErrUpgradeHTTP10
	}
	if !haveVersion || string(wsVersion) != "13" {
		return 0, ErrWebSocketVersion
	}
	if !validKey(r.Key) {
		return 0, ErrWebSocketKey
	}
	return n, nil
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func trimOWS(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// hasToken reports whether the comma-separated list holds token, ignoring
// case ("keep-alive, Upgrade").
func hasToken(list []byte, token string) bool {
	for len(list) > 0 {
		item := list
		if c := bytes.IndexByte(list, ','); c >= 0 {
			item, list = list[:c], list[c+1:]
		} else {
			list = nil
		}
		if bytes.EqualFold(trimOWS(item), []byte(token)) {
			return true
		}
	}
	return false
}

// strictBase64 also rejects non-zero padding bits, so exactly one spelling
// of each 16-byte nonce passes.
var strictBase64 = base64.StdEncoding.Strict()

// validKey reports whether key is the base64 of 16 bytes (RFC 6455 4.1).
func validKey(key []byte) bool {
	if len(key) != 24 {
		return false
	}
	var buf [18]byte
	n, err := strictBase64.Decode(buf[:], key)
	return err == nil && n == 16
}

// QueryValue finds the first parameter name in a query string (without the
// '?') and appends its percent- and plus-decoded value to dst, returning
// the extended slice: pass dst[:0] to get just the value. ok is false when
// the parameter is absent or its value holds a malformed escape. Names are
// compared after decoding too.
func QueryValue(query []byte, name string, dst []byte) (val []byte, ok bool) {
	for len(query) > 0 {
		pair := query
		if a := bytes.IndexByte(query, '&'); a >= 0 {
			pair, query = query[:a], query[a+1:]
		} else {
			query = nil
		}
		key, value := pair, []byte(nil)
		if eq := bytes.IndexByte(pair, '='); eq >= 0 {
			key, value = pair[:eq], pair[eq+1:]
		}
		if !keyEquals(key, name) {
			continue
		}
		return unescapeQuery(dst, value)
	}
	return dst, false
}

// keyEquals compares an encoded query key with name without decoding it
// into a buffer.
func keyEquals(key []byte, name string) bool {
	j := 0
	for i := 0; i < len(key); i++ {
		c := key[i]
		switch c {
		case '+':
			c = ' '
		case '%':
			if i+2 >= len(key) || hexVal(key[i+1]) < 0 || hexVal(key[i+2]) < 0 {
				return false
			}
			c = byte(hexVal(key[i+1])<<4 | hexVal(key[i+2]))
			i += 2
		}
		if j >= len(name) || name[j] != c {
			return false
		}
		j++
	}
	return j == len(name)
}

func unescapeQuery(dst, v []byte) ([]byte, bool) {
	start := len(dst)
	dst = slices.Grow(dst, len(v))
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch c {
		case '+':
			c = ' '
		case '%':
			if i+2 >= len(v) || hexVal(v[i+1]) < 0 || hexVal(v[i+2]) < 0 {
				return dst[:start], false
			}
			c = byte(hexVal(v[i+1])<<4 | hexVal(v[i+2]))
			i += 2
		}
		dst = append(dst, c)
	}
	return dst, true
}

const wsGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

// AppendUpgradeResponse appends the 101 response accepting key.
func AppendUpgradeResponse(dst, key []byte) []byte {
	const pre = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: "
	var sum [sha1.Size]byte
	var buf [64 + len(wsGUID)]byte
	if len(key) <= 64 {
		n := copy(buf[:], key)
		n += copy(buf[n:], wsGUID)
		sum = sha1.Sum(buf[:n])
	} else {
		// Slow path: ParseRequest only lets 24-byte keys through.
		h := sha1.New()
		h.Write(key)
		h.Write([]byte(wsGUID))
		h.Sum(sum[:0])
	}
	const accLen = 28 // base64 of 20 bytes
	dst = slices.Grow(dst, len(pre)+accLen+4)
	dst = append(dst, pre...)
	start := len(dst)
	dst = dst[:start+accLen]
	base64.StdEncoding.Encode(dst[start:], sum[:])
	return append(dst, "\r\n\r\n"...)
}

func statusText(status int) string {
	switch status {
	case 200:
		return "OK"
	case 204:
		return "No Content"
	case 304:
		return "Not Modified"
	case 400:
		return "Bad Request"
	case 401:
		return "Unauthorized"
	case 403:
		return "Forbidden"
	case 404:
		return "Not Found"
	case 405:
		return "Method Not Allowed"
	case 426:
		return "Upgrade Required"
	case 429:
		return "Too Many Requests"
	case 431:
		return "Request Header Fields Too Large"
	case 500:
		return "Internal Server Error"
	case 503:
		return "Service Unavailable"
	case 505:
		return "HTTP Version Not Supported"
	}
	return "Status"
}

// AppendHTTPResponseHeaders appends a complete HTTP/1.1 response that
// closes the connection, with extra header lines, each ending in CRLF. An
// empty contentType leaves the header out; a 304 carries no body and no
// Content-Length.
func AppendHTTPResponseHeaders(dst []byte, status int, contentType, extra string, body []byte) []byte {
	dst = appendHTTPHead(dst, status, contentType, extra, len(body))
	if status == 304 {
		return dst
	}
	return append(dst, body...)
}

// AppendHTTPError appends the response refusing a request with e: a
// text/plain body giving the reason, plus Sec-WebSocket-Version: 13 on 426
// so the client knows the version to retry with (RFC 6455 4.4). Any origin
// may read the reason: a browser hides why its WebSocket failed, and a
// client asks again over fetch to learn it (a refusal reveals nothing).
func AppendHTTPError(dst []byte, e *HTTPError) []byte {
	const cors = "Access-Control-Allow-Origin: *\r\n"
	extra := cors
	if e.Status == 426 {
		extra = cors + "Sec-WebSocket-Version: 13\r\n"
	}
	dst = appendHTTPHead(dst, e.Status, "text/plain; charset=utf-8", extra, len(e.Reason)+1)
	dst = append(dst, e.Reason...)
	return append(dst, '\n')
}

func appendHTTPHead(dst []byte, status int, contentType, extra string, bodyLen int) []byte {
	dst = append(dst, "HTTP/1.1 "...)
	dst = strconv.AppendInt(dst, int64(status), 10)
	dst = append(dst, ' ')
	dst = append(dst, statusText(status)...)
	dst = append(dst, "\r\n"...)
	if contentType != "" {
		dst = append(dst, "Content-Type: "...)
		dst = append(dst, contentType...)
		dst = append(dst, "\r\n"...)
	}
	dst = append(dst, extra...)
	if status != 304 {
		dst = append(dst, "Content-Length: "...)
		dst = strconv.AppendInt(dst, int64(bodyLen), 10)
		dst = append(dst, "\r\n"...)
	}
	return append(dst, "Connection: close\r\n\r\n"...)
}
