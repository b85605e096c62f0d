package proto

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
)

// App is one tenant's entry in the app registry, as the registry stores it
// (a PostgreSQL row or an element of the --apps JSON file) and as the node
// reads it. A node serves every app from the same loops; what keeps one
// app's flood from slowing another is Limits.
type App struct {
	ID string `json:"id"`
	// Secret signs the app's tokens (HS256). During a rotation the
	// previous secret stays valid until PreviousUntil.
	Secret         string    `json:"secret"`
	PreviousSecret string    `json:"previous_secret,omitempty"`
	PreviousUntil  time.Time `json:"previous_until,omitzero"`
	// Disabled apps are refused at the upgrade, and their live connections
	// are closed with 1008 "app disabled" when the change arrives.
	Disabled bool      `json:"disabled,omitempty"`
	Limits   AppLimits `json:"limits,omitzero"`
	// Retention: messages older than KeepAge or beyond the newest
	// KeepCount per room are deleted (0: no bound). PostgreSQL only; the
	// memory store keeps --keep per room.
	KeepAge   Duration  `json:"keep_age,omitzero"`
	KeepCount int       `json:"keep_count,omitempty"`
	Created   time.Time `json:"created,omitzero"`
	// Webhook, when set, receives the app's messages (docs/protocol.md,
	// Webhooks).
	Webhook *Webhook `json:"webhook,omitempty"`
	// Proxy, when set, asks the app's backend before a connection or a
	// publish is accepted (docs/protocol.md, Proxy hooks).
	Proxy *Proxy `json:"proxy,omitempty"`
	// Identity, when set, says how tokens are checked beyond the secret:
	// a provider's public keys, the expected iss and aud, the user claim.
	Identity *Identity `json:"identity,omitempty"`
}

// Proxy is where the node asks an app's backend whether to accept a
// connection (Connect) or a publish (Publish); an empty URL asks nothing.
type Proxy struct {
	Connect string `json:"connect,omitempty"`
	Publish string `json:"publish,omitempty"`
	// Timeout bounds one call (0: DefaultProxyTimeout).
	Timeout Duration `json:"timeout,omitzero"`
	// FailOpen accepts when the backend does not answer in time or
	// answers badly; by default (closed) the node refuses.
	FailOpen bool `json:"fail_open,omitempty"`
	// InFlight is the most calls of the app in flight from one node at
	// once, the connections its backend sees from each node (0: the
	// node's --proxy-inflight).
	InFlight int `json:"inflight,omitempty"`
}

// MaxProxyInFlight bounds a node's and an app's calls in flight: each is
// a goroutine and a connection of the node.
const MaxProxyInFlight = 4096

// DefaultProxyTimeout bounds a proxy call without its own timeout.
const DefaultProxyTimeout = time.Second

// MaxProxyTimeout bounds what an operator may set: a connection waits for
// its answer, and a publish holds the connection's later ones behind it.
const MaxProxyTimeout = 10 * time.Second

func (p *Proxy) validate() error {
	for _, u := range []string{p.Connect, p.Publish} {
		if u == "" {
			continue
		}
		pu, err := url.Parse(u)
		if err != nil || pu.Scheme != "http" && pu.Scheme != "https" || pu.Host == "" {
			return fmt.Errorf("proxy url %q: want an http:// or https:// URL", u)
		}
		if err := checkHookHost("proxy", pu); err != nil {
			return err
		}
	}
	if p.Timeout < 0 || time.Duration(p.Timeout) > MaxProxyTimeout {
		return fmt.Errorf("proxy timeout %s: want 0 (the default, 1s) to %s", time.Duration(p.Timeout), MaxProxyTimeout)
	}
	if p.InFlight < 0 || p.InFlight > MaxProxyInFlight {
		return fmt.Errorf("proxy inflight %d: want 0 (the node's) to %d", p.InFlight, MaxProxyInFlight)
	}
	return nil
}

// Webhook is where an app's messages are POSTed.
type Webhook struct {
	URL string `json:"url"`
	// Rooms are room names or `prefix*` patterns; empty: every room.
	Rooms []string `json:"rooms,omitempty"`
	// Timeout bounds one POST (0: DefaultWebhookTimeout).
	Timeout Duration `json:"timeout,omitzero"`
	// MaxAge is how long a message is retried before it becomes a dead
	// letter (0: DefaultWebhookMaxAge).
	MaxAge Duration `json:"max_age,omitzero"`
	// Events are the kinds of events POSTed: WebhookEventMsg,
	// WebhookEventPresence, WebhookEventConnection (empty: msg only).
	Events []string `json:"events,omitempty"`
}

// DefaultWebhookMaxAge is how long a webhook event is retried unless the
// app says otherwise.
const DefaultWebhookMaxAge = 24 * time.Hour

// DefaultWebhookTimeout bounds a webhook POST without its own timeout.
const DefaultWebhookTimeout = 5 * time.Second

// Matches reports whether the webhook wants the messages of room.
func (w *Webhook) Matches(room string) bool {
	if len(w.Rooms) == 0 {
		return true
	}
	for _, p := range w.Rooms {
		if pre, ok := strings.CutSuffix(p, "*"); ok && strings.HasPrefix(room, pre) || p == room {
			return true
		}
	}
	return false
}

func (w *Webhook) validate() error {
	u, err := url.Parse(w.URL)
	if err != nil || u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return fmt.Errorf("webhook url %q: want an http:// or https:// URL", w.URL)
	}
	if err := checkHookHost("webhook", u); err != nil {
		return err
	}
	if w.Timeout < 0 || time.Duration(w.Timeout) > time.Minute {
		return fmt.Errorf("webhook timeout %s: want 0 (the default, 5s) to 1m", time.Duration(w.Timeout))
	}
	if w.MaxAge < 0 {
		return fmt.Errorf("webhook max age %s: want 0 (the default, 24h) or more", time.Duration(w.MaxAge))
	}
	if err := w.validateEvents(); err != nil {
		return err
	}
	for _, p := range w.Rooms {
		name, _ := strings.CutSuffix(p, "*")
		if name != "" && !ValidRoom([]byte(name)) || name == "" && p != "*" {
			return fmt.Errorf("webhook room pattern %q: want a room name or prefix*", p)
		}
	}
	return nil
}

// Secrets returns the app's valid secrets at now: the current one, and the
// previous one until it expires.
func (a *App) Secrets(now time.Time) []string {
	s := []string{a.Secret}
	if a.PreviousSecret != "" && now.Before(a.PreviousUntil) {
		s = append(s, a.PreviousSecret)
	}
	return s
}

// AppLimits are an app's overrides of the node-wide defaults. A nil field
// takes the node's default; 0 turns that limit off.
type AppLimits struct {
	MaxConns     *int64    `json:"max_conns,omitempty"`      // connections of the app, whole cluster
	MaxUserConns *int64    `json:"max_user_conns,omitempty"` // connections of one user of the app
	PubRate      *float64  `json:"pub_rate,omitempty"`       // publishes per second of one user
	PubBurst     *int64    `json:"pub_burst,omitempty"`      // publishes one user may send at once
	AppPubRate   *float64  `json:"app_pub_rate,omitempty"`   // publishes per second of the whole app, per node
	MaxMsg       *int64    `json:"max_msg,omitempty"`        // bytes of one message body
	MaxRooms     *int64    `json:"max_rooms,omitempty"`      // rooms one connection may join
	MaxPresence  *int64    `json:"max_presence,omitempty"`   // presence subscribers of one room, per node
	MaxTokenTTL  *Duration `json:"max_token_ttl,omitempty"`  // how far ahead a token's exp may lie (0: no bound)
	SignalRate   *float64  `json:"signal_rate,omitempty"`    // signals per second of one connection
	SignalBurst  *int64    `json:"signal_burst,omitempty"`   // signals one connection may send at once
	ReadRate     *float64  `json:"read_rate,omitempty"`      // read, unread and receipts requests per second of one connection
	ReadBurst    *int64    `json:"read_burst,omitempty"`     // such requests one connection may send at once
}

// Duration is a time.Duration that reads and writes as "1h30m" in JSON.
type Duration time.Duration

func (d Duration) MarshalJSON() ([]byte, error) {
	return []byte(`"` + time.Duration(d).String() + `"`), nil
}

func (d *Duration) UnmarshalJSON(b []byte) error {
	if len(b) < 2 || b[0] != '"' || b[len(b)-1] != '"' {
		return errors.New("want a duration string such as \"24h\"")
	}
	v, err := time.ParseDuration(string(b[1 : len(b)-1]))
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// Validate checks what a registry must never hold.
func (a *App) Validate() error {
	switch {
	case !ValidAppID([]byte(a.ID)):
		return fmt.Errorf("app id %q: want [A-Za-z0-9_.-]{1,64}", a.ID)
	case len(a.Secret) < 16:
		return fmt.Errorf("app %s: secret shorter than 16 bytes", a.ID)
	case a.KeepAge < 0 || a.KeepCount < 0:
		return fmt.Errorf("app %s: negative retention", a.ID)
	}
	if a.Webhook != nil {
		if err := a.Webhook.validate(); err != nil {
			return fmt.Errorf("app %s: %w", a.ID, err)
		}
	}
	if a.Proxy != nil {
		if err := a.Proxy.validate(); err != nil {
			return fmt.Errorf("app %s: %w", a.ID, err)
		}
	}
	if a.Identity != nil {
		if err := a.Identity.validate(); err != nil {
			return fmt.Errorf("app %s: %w", a.ID, err)
		}
	}
	l := &a.Limits
	if l.MaxTokenTTL != nil && *l.MaxTokenTTL < 0 {
		return fmt.Errorf("app %s: negative max token ttl", a.ID)
	}
	for _, p := range []*int64{l.MaxConns, l.MaxUserConns, l.PubBurst, l.MaxMsg, l.MaxRooms, l.MaxPresence} {
		if p != nil && *p < 0 {
			return fmt.Errorf("app %s: negative limit", a.ID)
		}
	}
	for _, p := range []*float64{l.PubRate, l.AppPubRate} {
		if p != nil && !(*p >= 0) {
			return fmt.Errorf("app %s: negative or NaN rate", a.ID)
		}
	}
	return nil
}
