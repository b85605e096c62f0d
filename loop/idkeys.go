package loop

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/MicahParks/jwkset"
	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"
	"golang.org/x/time/rate"

	"github.com/roost-chat/roost/proto"
)

// providerAlgs are the algorithms a public key may verify, one per key
// type; HS256 belongs to the app's secret and is never tried against a
// public key (the classic algorithm confusion), and `none` never parses.
const providerAlgs = "RS256, ES256 or EdDSA"

// algFits binds alg to the key's type.
func algFits(alg string, key any) bool {
	switch k := key.(type) {
	case *rsa.PublicKey:
		return alg == "RS256"
	case *ecdsa.PublicKey:
		return alg == "ES256" && k.Curve == elliptic.P256()
	case ed25519.PublicKey:
		return alg == "EdDSA"
	}
	return false
}

func keyType(key any) string {
	switch key.(type) {
	case *rsa.PublicKey:
		return "RSA"
	case *ecdsa.PublicKey:
		return "ECDSA"
	case ed25519.PublicKey:
		return "Ed25519"
	}
	return fmt.Sprintf("%T", key)
}

// idKeys are an app's public keys: one from the registry, or a JWKS. Built
// once per registry change (static) or shared by URL (jwks); read by the
// loops without a lock.
type idKeys struct {
	static any // parsed PEM key; nil with jwks
	jwks   *jwksSource
	bad    string // the registry's key cannot be read: every token is refused with this
}

// key returns the key that verifies t, or a refusal. Loop: it never
// waits for the network.
func (k *idKeys) key(t *jwt.Token) (any, *proto.HTTPError) {
	alg := t.Method.Alg()
	if alg == "HS256" {
		return nil, errAlgKey
	}
	if k.bad != "" {
		return nil, &proto.HTTPError{Status: 401, Reason: "the app's public key cannot be read: " + k.bad}
	}
	if k.static != nil {
		if !algFits(alg, k.static) {
			return nil, &proto.HTTPError{Status: 401, Reason: "token alg " + alg + " does not fit the app's " + keyType(k.static) + " key"}
		}
		return k.static, nil
	}
	return k.jwks.key(t, alg)
}

// jwksSource is one JWKS URL's keys, shared by the apps naming it. The
// keys live in memory (jwkset's storage): a token's check reads them and
// never fetches. jwkset refreshes them every interval on a goroutine of
// its own; a token naming a kid the set lacks asks for one refresh more,
// on another goroutine, at most once per minGap (a client cannot make the
// node hammer the provider with random kids).
type jwksSource struct {
	url    string
	cancel context.CancelFunc

	st     atomic.Pointer[jwkset.Storage] // nil until the first fetch is over (failed or not)
	kf     atomic.Pointer[keyfunc.Keyfunc]
	client jwkset.Storage // the same storage behind an unknown-kid refresh
	asking atomic.Bool
	log    *slog.Logger
	warned atomic.Int64 // Unix s of the last failed fetch logged
}

var jwksHTTP = &http.Client{Timeout: 10 * time.Second}

// newJWKSSource starts fetching url in the background.
func newJWKSSource(url string, every time.Duration, log *slog.Logger) *jwksSource {
	ctx, cancel := context.WithCancel(context.Background())
	src := &jwksSource{url: url, cancel: cancel, log: log}
	go func() {
		st, err := jwkset.NewStorageFromHTTP(url, jwkset.HTTPClientStorageOptions{
			Client: jwksHTTP, Ctx: ctx, HTTPTimeout: 10 * time.Second,
			NoErrorReturnFirstHTTPReq: true, RefreshInterval: every,
			RefreshErrorHandler: func(_ context.Context, err error) {
				// Once a minute at most: an outage is one line, not one
				// per refresh.
				now, last := time.Now().Unix(), src.warned.Load()
				if ctx.Err() == nil && now-last >= 60 && src.warned.CompareAndSwap(last, now) {
					log.Warn("cannot fetch a JWKS: its last keys stay in force, tokens with keys it lacks are refused", "url", url, "err", err)
				}
			},
		})
		if err != nil { // a bad URL: Validate let nothing else through
			log.Error("cannot use a JWKS URL", "url", url, "err", err)
			cancel()
			return
		}
		kf, err := keyfunc.New(keyfunc.Options{Ctx: ctx, Storage: st})
		if err != nil {
			panic("BUG: keyfunc refused a storage: " + err.Error())
		}
		client, err := jwkset.NewHTTPClient(jwkset.HTTPClientOptions{
			HTTPURLs:          map[string]jwkset.Storage{url: st},
			RefreshUnknownKID: rate.NewLimiter(rate.Every(jwksMinGap), 1),
			RateLimitWaitMax:  time.Millisecond, // past the limit: no refresh, no wait
		})
		if err != nil {
			panic("BUG: jwkset refused its own storage: " + err.Error())
		}
		src.client = client
		src.kf.Store(&kf)
		src.st.Store(&st)
	}()
	return src
}

// jwksMinGap is the least time between two refreshes asked by unknown kids.
const jwksMinGap = 5 * time.Second

func (s *jwksSource) key(t *jwt.Token, alg string) (any, *proto.HTTPError) {
	kfp := s.kf.Load()
	if kfp == nil {
		return nil, &proto.HTTPError{Status: 401, Reason: "the app's JWKS is not fetched yet: try again in a moment"}
	}
	kid, hasKid := t.Header["kid"].(string)
	if !hasKid {
		// No kid: every key of the set whose type fits alg.
		all, err := (*kfp).VerificationKeySet(context.Background())
		if err != nil {
			return nil, &proto.HTTPError{Status: 401, Reason: "cannot read the app's JWKS"}
		}
		var fit jwt.VerificationKeySet
		for _, k := range all.Keys {
			if algFits(alg, k) {
				fit.Keys = append(fit.Keys, k)
			}
		}
		if len(fit.Keys) == 0 {
			return nil, &proto.HTTPError{Status: 401, Reason: "token has no kid and the app's JWKS has no key for alg " + alg}
		}
		return fit, nil
	}
	key, err := (*kfp).Keyfunc(t)
	switch {
	case errors.Is(err, jwkset.ErrKeyNotFound):
		s.refreshSoon(kid)
		return nil, &proto.HTTPError{Status: 401, Reason: fmt.Sprintf("unknown kid %q: the app's JWKS has no such key", trim(kid, 64))}
	case err != nil:
		// keyfunc refuses a JWK whose own alg differs from the token's.
		return nil, &proto.HTTPError{Status: 401, Reason: fmt.Sprintf("token alg %s does not fit the JWKS key %q", alg, trim(kid, 64))}
	case !algFits(alg, key):
		return nil, &proto.HTTPError{Status: 401, Reason: fmt.Sprintf("token alg %s does not fit the JWKS key %q (%s)", alg, trim(kid, 64), keyType(key))}
	}
	return key, nil
}

// refreshSoon fetches the set again on another goroutine, unless one is
// already asking or one was asked within jwksMinGap.
func (s *jwksSource) refreshSoon(kid string) {
	if !s.asking.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer s.asking.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		_, _ = s.client.KeyRead(ctx, kid)
	}()
}

func trim(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// jwksSources are the node's JWKS sources by URL.
type jwksSources struct {
	every time.Duration
	log   *slog.Logger
	mu    sync.Mutex
	byURL map[string]*jwksSource
}

// keysFor returns the keys of an app's identity (nil: the app checks
// tokens with its secret). A source made here is counted as used by the
// caller; release what the previous registry used after installing it.
func (j *jwksSources) keysFor(id *proto.Identity, used map[string]*jwksSource) *idKeys {
	if !id.HasKey() {
		return nil
	}
	if id.PublicKey != "" {
		k, err := proto.ParsePublicKey(id.PublicKey)
		if err != nil {
			return &idKeys{bad: err.Error()}
		}
		return &idKeys{static: k}
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	src := j.byURL[id.JWKSURL]
	if src == nil {
		src = newJWKSSource(id.JWKSURL, j.every, j.log)
		j.byURL[id.JWKSURL] = src
	}
	used[id.JWKSURL] = src
	return &idKeys{jwks: src}
}

// keep stops the sources no app names any more.
func (j *jwksSources) keep(used map[string]*jwksSource) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for u, src := range j.byURL {
		if used[u] == nil {
			src.cancel()
			delete(j.byURL, u)
		}
	}
}

// stop ends every refresh goroutine (the server stops).
func (j *jwksSources) stop() { j.keep(nil) }

// DefaultJWKSRefresh is how often a node fetches an app's JWKS again: a
// provider publishes a new key well before it signs with it, and a kid the
// set lacks asks for a fetch sooner.
const DefaultJWKSRefresh = 5 * time.Minute
