package loop

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"

	"github.com/roost-chat/roost/proto"
)

// staticFile is a file the client listener serves from memory: the bytes
// main embedded, with the headers (validator included) made once.
type staticFile struct {
	body        []byte
	contentType string
	etag        []byte // quoted strong validator
	headers     string // ETag, Cache-Control and the rest, CRLF-terminated lines
}

func newStaticFile(body []byte, contentType, cacheControl string) *staticFile {
	if body == nil {
		return nil
	}
	sum := sha256.Sum256(body)
	etag := `"` + hex.EncodeToString(sum[:12]) + `"`
	return &staticFile{
		body:        body,
		contentType: contentType,
		etag:        []byte(etag),
		// Any origin may load the client: a module script from another
		// origin is fetched with CORS.
		headers: "ETag: " + etag + "\r\nCache-Control: " + cacheControl +
			"\r\nAccess-Control-Allow-Origin: *\r\nX-Content-Type-Options: nosniff\r\n",
	}
}

// serveHTTP answers plain HTTP requests on the client listener: /roost.js
// in every mode, the demo page at / in insecure mode. It reports whether it
// answered.
func (s *Server) serveHTTP(c *conn, req *proto.Request) bool {
	var f *staticFile
	switch string(req.Path) {
	case "/roost.js":
		f = s.script
	case "/":
		if s.cfg.Insecure {
			f = s.demo
		}
	}
	if f == nil {
		return false
	}
	status := 200
	if etagMatches(req.IfNoneMatch, f.etag) {
		status = 304
	}
	out := proto.AppendHTTPResponseHeaders(nil, status, f.contentType, f.headers, f.body)
	if req.Head && status == 200 {
		out = out[:len(out)-len(f.body)] // GET's head, Content-Length included
	}
	// The connection is closed right after the write: make room for the
	// whole answer in the kernel first, so that none of it is left in a
	// user-space buffer the close would discard.
	_ = c.gc.SetWriteBuffer(len(out) + 4096)
	_, _ = c.gc.Write(out)
	c.state = stateClosing
	_ = c.gc.Close()
	return true
}

// etagMatches is If-None-Match's weak comparison (RFC 9110 13.1.2): "*", or
// any listed tag equal to etag with or without W/.
func etagMatches(header, etag []byte) bool {
	for len(header) > 0 {
		item := header
		if i := bytes.IndexByte(header, ','); i >= 0 {
			item, header = header[:i], header[i+1:]
		} else {
			header = nil
		}
		item = bytes.TrimSpace(item)
		item = bytes.TrimPrefix(item, []byte("W/"))
		if string(item) == "*" || bytes.Equal(item, etag) {
			return true
		}
	}
	return false
}
