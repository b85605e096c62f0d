package pubsub

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/redis/rueidis"

	"github.com/roost-chat/roost/proto"
)

// Sentinel errors of the Redis broker.
var (
	// ErrClosed is returned by Publish and passed to ready after Close.
	ErrClosed = errors.New("pubsub: broker closed")
	// ErrNotSubscribed is returned by Ping while some wanted rooms are not
	// subscribed on Redis (a connection is down or being re-established):
	// this node may be missing their messages until it recovers.
	ErrNotSubscribed = errors.New("pubsub: some rooms are not subscribed")
)

// DefaultPrefix is the channel prefix used when RedisConfig.Prefix is empty.
const DefaultPrefix = "roost"

// Tuning of the subscription worker.
const (
	// opTimeout bounds each network step of the worker (dial, subscribe,
	// topology read) so that a black-holed Redis cannot stall the queue.
	opTimeout = 5 * time.Second
	// Reconnect backoff: short first so a Redis restart or failover (a
	// second or two) is repaired quickly, capped so a long outage costs one
	// dial attempt per second.
	minBackoff = 50 * time.Millisecond
	maxBackoff = time.Second
	// channelsPerCommand bounds one SUBSCRIBE/UNSUBSCRIBE command of a
	// resubscription of thousands of rooms; commandsPerBatch bounds one
	// pipelined DoMulti.
	channelsPerCommand = 256
	commandsPerBatch   = 512
)

// RedisConfig selects the Redis deployment of the broker.
type RedisConfig struct {
	// Addrs are host:port seed addresses. One address may be a single Redis
	// or a cluster node (detected); several addresses are cluster seeds.
	Addrs []string
	// Cluster requires a Redis Cluster: NewRedis fails if the servers are
	// not one. False means detect it.
	Cluster bool
	// Username and Password authenticate with AUTH (ACL user or default).
	Username, Password string
	// Prefix starts every channel name; nodes of one deployment must share
	// it. Empty means DefaultPrefix. It may not contain '{' or '}' because
	// the room key must be the channel's hash tag.
	Prefix string
}

// ParseRedisURL parses redis://[user:pass@]host:port[,host2:port2...][/db]
// [?prefix=P]. Several hosts mean a Redis Cluster given by seed addresses.
// The database number is accepted and ignored: pub/sub channels are not
// scoped by database.
func ParseRedisURL(s string) (RedisConfig, error) {
	var cfg RedisConfig
	// net/url rejects a comma-separated host list holding an IPv6
	// literal, so the hosts are cut out first and parsed here.
	hosts := ""
	if rest, ok := strings.CutPrefix(s, "redis://"); ok {
		auth := rest
		if i := strings.IndexAny(rest, "/?#"); i >= 0 {
			auth = rest[:i]
		}
		at := strings.LastIndexByte(auth, '@') + 1
		hosts = auth[at:]
		s = "redis://" + auth[:at] + "hosts" + rest[len(auth):]
	}
	u, err := url.Parse(s)
	if err != nil {
		return cfg, fmt.Errorf("cannot parse redis url: %w", err)
	}
	if u.Scheme != "redis" {
		return cfg, fmt.Errorf("cannot parse redis url %q: scheme must be redis://", redactURL(u))
	}
	if u.User != nil {
		cfg.Username = u.User.Username()
		cfg.Password, _ = u.User.Password()
	}
	u.Host = hosts
	if hosts == "" {
		return cfg, fmt.Errorf("cannot parse redis url %q: no host", redactURL(u))
	}
	for _, hp := range strings.Split(hosts, ",") {
		host, port, err := net.SplitHostPort(hp)
		if err != nil {
			// A bare host gets the default port, like redis-cli.
			host, port = hp, "6379"
		}
		if host == "" || port == "" {
			return cfg, fmt.Errorf("cannot parse redis url %q: bad address %q", redactURL(u), hp)
		}
		cfg.Addrs = append(cfg.Addrs, net.JoinHostPort(host, port))
	}
	cfg.Cluster = len(cfg.Addrs) > 1
	if p := strings.Trim(u.Path, "/"); p != "" {
		var db uint
		if _, err := fmt.Sscan(p, &db); err != nil {
			return cfg, fmt.Errorf("cannot parse redis url %q: database %q is not a number", redactURL(u), p)
		}
	}
	q := u.Query()
	for k := range q {
		if k != "prefix" {
			return cfg, fmt.Errorf("cannot parse redis url %q: unknown parameter %q", redactURL(u), k)
		}
	}
	cfg.Prefix = q.Get("prefix")
	if err := cfg.validate(); err != nil {
		return cfg, fmt.Errorf("cannot parse redis url %q: %w", redactURL(u), err)
	}
	return cfg, nil
}

// redactURL keeps passwords out of error messages and logs.
func redactURL(u *url.URL) string { return u.Redacted() }

func (c *RedisConfig) validate() error {
	if len(c.Addrs) == 0 {
		return errors.New("no redis address")
	}
	if strings.ContainsAny(c.Prefix, "{}") {
		return fmt.Errorf("prefix %q contains '{' or '}'", c.Prefix)
	}
	return nil
}

// RedisStats are cumulative counters of a Redis broker.
type RedisStats struct {
	Published     uint64 // messages published successfully
	PublishErrors uint64 // Publish calls that returned an error
	Received      uint64 // messages passed to Handler.OnMessage
	Malformed     uint64 // messages on our channels that could not be decoded
	// Resubscribes counts recoveries: every room lost with a connection was
	// subscribed again and Handler.OnReset was called.
	Resubscribes    uint64
	SubscribeErrors uint64 // failed SUBSCRIBE/SSUBSCRIBE attempts
	Subscribed      int64  // rooms subscribed on Redis now
	Pending         int64  // wanted rooms not (yet) subscribed on Redis
}

// Redis is the broker of a multi-node deployment: every node publishes to
// and subscribes on Redis, one channel per room named Prefix.{key} so that
// the room key is the hash tag. A single Redis uses PUBLISH/SUBSCRIBE; a
// Redis Cluster uses sharded pub/sub (SPUBLISH/SSUBSCRIBE), so each room
// lives on the shard owning its slot and shards add capacity.
//
// Payload: the 8-byte big-endian seq followed by the frame bytes.
//
// Subscriptions are kept on dedicated connections (one per shard) whose
// reader goroutine calls Handler.OnMessage directly. Subscribe and
// Unsubscribe only queue; one worker goroutine applies the queue in order,
// owns the wanted set and re-establishes lost subscriptions, then calls
// Handler.OnReset. After Unsubscribe, messages already in flight for the
// room may still be delivered until the worker has applied it.
//
// All methods may be called from any goroutine.
type Redis struct {
	h          Handler
	log        *slog.Logger
	client     rueidis.Client // publishing, topology, standalone subscriptions
	opt        rueidis.ClientOption
	cluster    bool
	chanPrefix string // Prefix + ".{"
	prefix     string // Prefix

	published       atomic.Uint64
	publishErrors   atomic.Uint64
	received        atomic.Uint64
	malformed       atomic.Uint64
	resubscribes    atomic.Uint64
	subscribeErrors atomic.Uint64
	subscribed      atomic.Int64
	pending         atomic.Int64

	// The op queue: appended by any goroutine, taken whole by the worker.
	qmu    sync.Mutex
	queue  []op
	closed bool
	wake   chan struct{} // capacity 1: a wake-up is only sent on empty to non-empty

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	// The fields below are owned by the worker goroutine.
	wanted   map[string]struct{}   // rooms the node asked for
	activeOn map[string]*subConn   // rooms subscribed on Redis, and where
	unsynced map[string]struct{}   // rooms whose Redis state may differ from wanted
	conns    map[string]*subConn   // by shard address ("" for a single Redis)
	slots    []slotRange           // cluster: owner of each slot range
	stale    bool                  // cluster: slots must be re-read
	lostKeys bool                  // rooms were lost with a connection: OnReset is due
	lastErr  error                 // last failure of sync, for ready(err)
	readies  []pendingReady        // scratch of apply
	touched  map[string]struct{}   // scratch of apply
	subsBy   map[*subConn][]string // scratch of sync
}

var _ Broker = (*Redis)(nil)

type opKind uint8

const (
	opSubscribe opKind = iota
	opUnsubscribe
	opBroken      // a subscription connection failed
	opServerUnsub // the server dropped a sharded subscription (slot migration)
)

type op struct {
	kind  opKind
	key   string
	ready func(error)
	conn  *subConn
	err   error
}

type pendingReady struct {
	key   string
	ready func(error)
}

type slotRange struct {
	start, end uint16
	addr       string
}

// subConn is one dedicated subscription connection; worker-owned except
// addr, which the hook goroutines read.
type subConn struct {
	addr      string
	owned     rueidis.Client // the per-shard client in cluster mode, else nil
	dc        rueidis.DedicatedClient
	keys      map[string]struct{}
	selfUnsub map[string]int // our own SUNSUBSCRIBEs whose push is still to come
	dead      bool
}

// NewRedis connects to Redis and starts the subscription worker. log may be
// nil.
func NewRedis(ctx context.Context, cfg RedisConfig, h Handler, log *slog.Logger) (*Redis, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("cannot start redis broker: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	prefix := cfg.Prefix
	if prefix == "" {
		prefix = DefaultPrefix
	}
	opt := rueidis.ClientOption{
		InitAddress: cfg.Addrs,
		Username:    cfg.Username,
		Password:    cfg.Password,
		// Client-side caching is unused; skipping it saves the CLIENT
		// TRACKING handshake on every connection.
		DisableCache: true,
		ClientName:   "roost",
		// rueidis's default of 0.5 MiB each way per connection is 2 MiB
		// of live heap for the publishing and the subscription connection,
		// and the GC's allowance on top, on a node whose whole heap is
		// ~21 MB at 16,700 chat connections; a subscriber that falls behind
		// fills its read buffer to the end at every read. A RESP value of
		// any size still passes: lines and bulk strings longer than the
		// buffer are read past it.
		ReadBufferEachConn:  redisConnBuffer,
		WriteBufferEachConn: redisConnBuffer,
	}
	client, err := newClientCtx(ctx, opt)
	if err != nil {
		return nil, fmt.Errorf("cannot connect to redis %v: %w", cfg.Addrs, err)
	}
	cluster := client.Mode() == rueidis.ClientModeCluster
	if cfg.Cluster && !cluster {
		client.Close()
		return nil, fmt.Errorf("cannot start redis broker: %v is not a Redis Cluster (drop the extra addresses for a single Redis)", cfg.Addrs)
	}
	wctx, cancel := context.WithCancel(context.Background())
	r := &Redis{
		h:          h,
		log:        log,
		client:     client,
		opt:        opt,
		cluster:    cluster,
		chanPrefix: prefix + ".{",
		prefix:     prefix,
		wake:       make(chan struct{}, 1),
		ctx:        wctx,
		cancel:     cancel,
		done:       make(chan struct{}),
		wanted:     make(map[string]struct{}),
		activeOn:   make(map[string]*subConn),
		unsynced:   make(map[string]struct{}),
		conns:      make(map[string]*subConn),
		touched:    make(map[string]struct{}),
		subsBy:     make(map[*subConn][]string),
		stale:      cluster,
	}
	go r.run()
	log.Info("redis broker started", "addrs", cfg.Addrs, "cluster", cluster, "prefix", prefix)
	return r, nil
}

// redisConnBuffer is each Redis connection's read and write buffer: at
// 2,000 msg/s of 2 KB bodies a read or a pipelined write rarely carries
// more than a few KB, and a larger backlog takes a few more syscalls of
// 64 KiB each.
const redisConnBuffer = 64 << 10

// newClientCtx creates a rueidis client, giving up when ctx ends: rueidis
// dials with its own timeout and does not take a context.
func newClientCtx(ctx context.Context, opt rueidis.ClientOption) (rueidis.Client, error) {
	if dl, ok := ctx.Deadline(); ok {
		if d := time.Until(dl); d > 0 && d < rueidis.DefaultDialTimeout {
			opt.Dialer.Timeout = d
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return rueidis.NewClient(opt)
}

// Cluster reports whether the broker runs on a Redis Cluster (sharded
// pub/sub).
func (r *Redis) Cluster() bool { return r.cluster }

// channel returns Prefix.{key}.
func (r *Redis) channel(key string) string { return r.chanPrefix + key + "}" }

// payloadPool recycles Publish buffers (channel name + seq + frame).
// Buffers above maxPooledPayload are left to the GC so a rare huge frame
// does not pin memory.
var payloadPool = sync.Pool{New: func() any { return new([]byte) }}

const maxPooledPayload = 64 << 10

// Publish sends one message to every node subscribed to key. The channel
// name and payload are built in one pooled buffer and handed to rueidis as
// string views of it, so a publish copies the frame once (into the buffer)
// and rueidis pipelines concurrent publishes into one write.
func (r *Redis) Publish(ctx context.Context, key string, seq uint64, frame []byte) error {
	bp := payloadPool.Get().(*[]byte)
	b := append((*bp)[:0], r.chanPrefix...)
	b = append(b, key...)
	b = append(b, '}')
	nch := len(b)
	b = binary.BigEndian.AppendUint64(b, seq)
	b = append(b, frame...)
	*bp = b
	ch := unsafe.String(unsafe.SliceData(b), nch)
	msg := unsafe.String(&b[nch], len(b)-nch)

	var cmd rueidis.Completed
	if r.cluster {
		cmd = r.client.B().Spublish().Channel(ch).Message(msg).Build()
	} else {
		cmd = r.client.B().Publish().Channel(ch).Message(msg).Build()
	}
	err := r.client.Do(ctx, cmd).Error()
	// Recycle only once Redis has replied: on a context error the command
	// may still sit in rueidis' write queue, pointing into b.
	if _, isRedis := rueidis.IsRedisErr(err); (err == nil || isRedis) && cap(b) <= maxPooledPayload {
		payloadPool.Put(bp)
	}
	if err != nil {
		r.publishErrors.Add(1)
		if r.isClosed() {
			err = ErrClosed
		}
		return fmt.Errorf("cannot publish seq %d of %q: %w", seq, key, err)
	}
	r.published.Add(1)
	return nil
}

// batchScratch is one PublishBatch's working memory: the commands, and
// one buffer holding every channel name and payload they point into.
type batchScratch struct {
	cmds []rueidis.Completed
	buf  []byte
	offs []int // per message: start of its channel name in buf, then of its payload, then end
}

// batchPool recycles batchScratch. A scratch whose buffer grew beyond
// maxPooledBatch is left to the GC, as payloadPool does for one message.
var batchPool = sync.Pool{New: func() any { return new(batchScratch) }}

const maxPooledBatch = 1 << 20

// PublishBatch implements Broker with one pipelined DoMulti: every payload
// is copied once into one pooled buffer, and rueidis writes the commands
// back to back and reads the replies in one round trip (per shard on a
// Redis Cluster, the shards in parallel).
func (r *Redis) PublishBatch(ctx context.Context, pubs []Publication, errs []error) int {
	if len(pubs) == 0 {
		return 0
	}
	s := batchPool.Get().(*batchScratch)
	b := s.buf[:0]
	offs := s.offs[:0]
	for i := range pubs {
		p := &pubs[i]
		offs = append(offs, len(b))
		b = append(b, r.chanPrefix...)
		b = append(b, p.Key...)
		b = append(b, '}')
		offs = append(offs, len(b))
		b = binary.BigEndian.AppendUint64(b, p.Seq)
		b = append(b, p.Frame...)
	}
	offs = append(offs, len(b))
	// The views are taken only now: b may have moved while it grew.
	cmds := s.cmds[:0]
	base := unsafe.SliceData(b)
	for i := range pubs {
		c, m, e := offs[2*i], offs[2*i+1], offs[2*i+2]
		ch := unsafe.String((*byte)(unsafe.Add(unsafe.Pointer(base), c)), m-c)
		msg := unsafe.String((*byte)(unsafe.Add(unsafe.Pointer(base), m)), e-m)
		if r.cluster {
			cmds = append(cmds, r.client.B().Spublish().Channel(ch).Message(msg).Build())
		} else {
			cmds = append(cmds, r.client.B().Publish().Channel(ch).Message(msg).Build())
		}
	}
	res := r.client.DoMulti(ctx, cmds...)
	failed, reusable := 0, true
	closed := r.isClosed()
	for i := range pubs {
		err := res[i].Error()
		if err == nil {
			errs[i] = nil
			continue
		}
		// As in Publish: a command that failed other than by a Redis
		// reply may still sit in rueidis' write queue, pointing into b.
		if _, isRedis := rueidis.IsRedisErr(err); !isRedis {
			reusable = false
		}
		if closed {
			err = ErrClosed
		}
		errs[i] = fmt.Errorf("cannot publish seq %d of %q: %w", pubs[i].Seq, pubs[i].Key, err)
		failed++
	}
	if failed > 0 {
		r.publishErrors.Add(uint64(failed))
	}
	if ok := len(pubs) - failed; ok > 0 {
		r.published.Add(uint64(ok))
	}
	if reusable && cap(b) <= maxPooledBatch {
		clear(cmds)
		s.buf, s.offs, s.cmds = b, offs, cmds[:0]
		batchPool.Put(s)
	}
	return failed
}

// onMessage runs on a rueidis reader goroutine for every message of a
// subscribed channel. It decodes in place: frame is a read-only view of the
// message string rueidis allocated, never written by anyone, so the handler
// may share it as the immutable frame the Handler contract describes.
func (r *Redis) onMessage(m rueidis.PubSubMessage) {
	ch, msg := m.Channel, m.Message
	if len(ch) <= len(r.chanPrefix) || ch[len(ch)-1] != '}' || ch[:len(r.chanPrefix)] != r.chanPrefix || len(msg) < 8 {
		r.malformed.Add(1)
		if r.log.Enabled(context.Background(), slog.LevelDebug) {
			r.log.Debug("malformed pubsub message", "channel", ch, "len", len(msg))
		}
		return
	}
	key := ch[len(r.chanPrefix) : len(ch)-1]
	b := unsafe.Slice(unsafe.StringData(msg), len(msg))
	seq := binary.BigEndian.Uint64(b)
	r.received.Add(1)
	r.h.OnMessage(key, seq, b[8:len(b):len(b)])
}

// Subscribe queues a subscription; ready is called by the worker once it
// is active on Redis or has failed. A Subscribe superseded by an
// Unsubscribe of the same key before the worker applied it reports nil:
// nobody wants the room any more. After a failure the room stays wanted
// and is subscribed once Redis is reachable again, followed by OnReset.
// ready and OnReset run on the worker goroutine: they must not block (they
// may call Subscribe and Unsubscribe, which only queue).
func (r *Redis) Subscribe(key string, ready func(error)) {
	if !r.enqueue(op{kind: opSubscribe, key: key, ready: ready}) && ready != nil {
		ready(ErrClosed)
	}
}

// Unsubscribe queues the end of key's subscription.
func (r *Redis) Unsubscribe(key string) {
	r.enqueue(op{kind: opUnsubscribe, key: key})
}

func (r *Redis) enqueue(o op) bool {
	r.qmu.Lock()
	if r.closed {
		r.qmu.Unlock()
		return false
	}
	wasEmpty := len(r.queue) == 0
	r.queue = append(r.queue, o)
	r.qmu.Unlock()
	if wasEmpty {
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
	return true
}

func (r *Redis) isClosed() bool {
	r.qmu.Lock()
	defer r.qmu.Unlock()
	return r.closed
}

// Stats returns the broker's counters.
func (r *Redis) Stats() RedisStats {
	return RedisStats{
		Published:       r.published.Load(),
		PublishErrors:   r.publishErrors.Load(),
		Received:        r.received.Load(),
		Malformed:       r.malformed.Load(),
		Resubscribes:    r.resubscribes.Load(),
		SubscribeErrors: r.subscribeErrors.Load(),
		Subscribed:      r.subscribed.Load(),
		Pending:         r.pending.Load(),
	}
}

// Ping checks that every Redis node answers and that every wanted room is
// subscribed (else ErrNotSubscribed): the health check of the broker.
func (r *Redis) Ping(ctx context.Context) error {
	if r.isClosed() {
		return ErrClosed
	}
	for addr, c := range r.client.Nodes() {
		if err := c.Do(ctx, c.B().Ping().Build()).Error(); err != nil {
			return fmt.Errorf("cannot ping redis %s: %w", addr, err)
		}
	}
	if n := r.pending.Load(); n > 0 {
		return fmt.Errorf("cannot confirm %d rooms: %w", n, ErrNotSubscribed)
	}
	return nil
}

// Close stops the worker, drops the subscriptions and closes the
// connections. Queued subscriptions get ready(ErrClosed).
func (r *Redis) Close() error {
	r.qmu.Lock()
	if r.closed {
		r.qmu.Unlock()
		return nil
	}
	r.closed = true
	q := r.queue
	r.queue = nil
	r.qmu.Unlock()
	r.cancel()
	<-r.done
	for _, o := range q {
		if o.kind == opSubscribe && o.ready != nil {
			o.ready(ErrClosed)
		}
	}
	r.client.Close()
	r.log.Info("redis broker stopped")
	return nil
}

// run is the worker: it applies queued ops in order and retries lost
// subscriptions with backoff.
func (r *Redis) run() {
	defer close(r.done)
	defer r.closeConns()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	armed := false
	backoff := minBackoff
	var batch []op
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-r.wake:
		case <-timer.C:
			armed = false
		}
		r.qmu.Lock()
		batch, r.queue = r.queue, batch[:0]
		r.qmu.Unlock()
		r.apply(batch)
		clear(batch)
		if len(r.unsynced) == 0 {
			backoff = minBackoff
			if armed {
				timer.Stop()
				armed = false
			}
		} else if !armed && r.ctx.Err() == nil {
			timer.Reset(backoff)
			armed = true
			backoff = min(2*backoff, maxBackoff)
		}
	}
}

func (r *Redis) apply(batch []op) {
	clear(r.touched)
	r.readies = r.readies[:0]
	for _, o := range batch {
		switch o.kind {
		case opSubscribe:
			r.wanted[o.key] = struct{}{}
			r.touched[o.key] = struct{}{}
			if o.ready != nil {
				r.readies = append(r.readies, pendingReady{o.key, o.ready})
			}
		case opUnsubscribe:
			delete(r.wanted, o.key)
			r.touched[o.key] = struct{}{}
		case opBroken:
			r.connBroken(o.conn, o.err)
		case opServerUnsub:
			c := o.conn
			if c.dead {
				continue
			}
			if n := c.selfUnsub[o.key]; n > 0 {
				if n == 1 {
					delete(c.selfUnsub, o.key)
				} else {
					c.selfUnsub[o.key] = n - 1
				}
				continue
			}
			if r.activeOn[o.key] == c {
				// The slot moved to another shard: messages published
				// since are on the new owner.
				delete(r.activeOn, o.key)
				delete(c.keys, o.key)
				r.unsynced[o.key] = struct{}{}
				r.lostKeys = true
				r.stale = true
				r.log.Warn("redis dropped a sharded subscription, resubscribing", "addr", c.addr, "key", o.key)
			}
		}
	}
	for k := range r.touched {
		r.unsynced[k] = struct{}{}
	}
	if len(r.unsynced) > 0 {
		r.sync()
	}
	for _, p := range r.readies {
		switch {
		case r.activeOn[p.key] != nil:
			p.ready(nil)
		case !r.has(p.key):
			p.ready(nil) // superseded by an Unsubscribe
		default:
			err := r.lastErr
			if err == nil {
				err = ErrNotSubscribed
			}
			p.ready(fmt.Errorf("cannot subscribe %q: %w", p.key, err))
		}
	}
	clear(r.readies)
	// The gauges count rooms: the node-wide control and presence
	// subscriptions (and read positions') are not rooms.
	sub, pend := len(r.activeOn), len(r.unsynced)
	for _, k := range [...]string{proto.ControlKey, proto.PresenceKey, proto.ReadKey} {
		if _, ok := r.activeOn[k]; ok {
			sub--
		}
		if _, ok := r.unsynced[k]; ok {
			pend--
		}
	}
	r.subscribed.Store(int64(sub))
	r.pending.Store(int64(pend))
	if r.lostKeys && len(r.unsynced) == 0 && r.ctx.Err() == nil {
		r.lostKeys = false
		r.resubscribes.Add(1)
		r.log.Info("redis subscriptions restored, repairing gaps", "rooms", len(r.activeOn))
		r.h.OnReset()
	}
}

func (r *Redis) has(key string) bool {
	_, ok := r.wanted[key]
	return ok
}

// connBroken forgets a failed connection; its rooms become unsynced.
func (r *Redis) connBroken(c *subConn, err error) {
	if c.dead {
		return
	}
	r.log.Warn("redis subscription connection lost", "addr", c.addr, "rooms", len(c.keys), "err", err)
	for k := range c.keys {
		delete(r.activeOn, k)
		r.unsynced[k] = struct{}{}
		r.lostKeys = true
	}
	r.dropConn(c)
	r.stale = r.cluster
	if err != nil {
		r.lastErr = err
	}
}

func (r *Redis) dropConn(c *subConn) {
	c.dead = true
	if r.conns[c.addr] == c {
		delete(r.conns, c.addr)
	}
	// Close, not release: release would run UNSUBSCRIBE on a possibly
	// dead connection with no deadline.
	c.dc.Close()
	if c.owned != nil {
		c.owned.Close()
	}
}

func (r *Redis) closeConns() {
	for _, c := range r.conns {
		r.dropConn(c)
	}
}

// sync brings Redis in line with wanted for every unsynced room. Rooms it
// cannot fix stay unsynced for the retry timer.
func (r *Redis) sync() {
	ctx, cancel := context.WithTimeout(r.ctx, opTimeout)
	defer cancel()
	if r.cluster && r.stale {
		if err := r.refreshSlots(ctx); err != nil {
			r.lastErr = err
			r.log.Warn("cannot read redis cluster slots", "err", err)
		} else {
			r.stale = false
		}
	}
	unsubs := r.subsBy
	clear(unsubs)
	subs := make(map[string][]string)
	for key := range r.unsynced {
		cur := r.activeOn[key]
		addr, want := "", r.has(key)
		if want && r.cluster {
			var ok bool
			if addr, ok = r.owner(key); !ok {
				continue // no known owner yet: retry after a slot refresh
			}
		}
		if cur != nil && want && cur.addr == addr {
			delete(r.unsynced, key)
			continue
		}
		if cur != nil {
			unsubs[cur] = append(unsubs[cur], key)
		}
		if want {
			subs[addr] = append(subs[addr], key)
		} else if cur == nil {
			delete(r.unsynced, key)
		}
	}
	for c, keys := range unsubs {
		r.unsubscribeOn(ctx, c, keys)
	}
	clear(unsubs)
	for addr, keys := range subs {
		c, err := r.conn(ctx, addr)
		if err != nil {
			r.lastErr = err
			// The primary may be gone for good (failover): re-read the
			// slots before the next attempt.
			r.stale = r.cluster
			r.subscribeErrors.Add(uint64(len(keys)))
			r.log.Warn("cannot open redis subscription connection", "addr", addr, "err", err)
			continue
		}
		r.subscribeOn(ctx, c, keys)
	}
}

// unsubscribeOn drops keys from c. A failure leaves them unsubscribed from
// our point of view: a network failure will also break c, and a Redis
// error on UNSUBSCRIBE only happens when the subscription is gone anyway.
func (r *Redis) unsubscribeOn(ctx context.Context, c *subConn, keys []string) {
	cmds := r.buildCmds(c, keys, false)
	res := c.dc.DoMulti(ctx, cmds...)
	for _, k := range keys {
		delete(r.activeOn, k)
		delete(c.keys, k)
		if !r.has(k) {
			delete(r.unsynced, k)
		}
	}
	for i, rr := range res {
		if err := rr.Error(); err != nil {
			r.log.Warn("cannot unsubscribe on redis", "addr", c.addr, "err", err)
			if rr.NonRedisError() != nil {
				r.connBroken(c, err)
				return
			}
			continue
		}
		if r.cluster {
			// One SUNSUBSCRIBE per key: its push is our own doing.
			c.selfUnsub[keys[i]]++
		}
	}
}

func (r *Redis) subscribeOn(ctx context.Context, c *subConn, keys []string) {
	cmds := r.buildCmds(c, keys, true)
	res := c.dc.DoMulti(ctx, cmds...)
	per := channelsPerCommand
	if r.cluster {
		per = 1
	}
	for i, rr := range res {
		lo := i * per
		hi := min(lo+per, len(keys))
		if err := rr.Error(); err != nil {
			r.subscribeErrors.Add(uint64(hi - lo))
			r.lastErr = err
			if re, ok := rueidis.IsRedisErr(err); ok {
				if retryable(re) {
					r.stale = r.cluster
					continue // retried after a slot refresh
				}
				// A refusal (ACL, bad name) does not heal by retrying.
				r.log.Error("redis refused a subscription", "addr", c.addr, "keys", keys[lo:hi], "err", err)
				for _, k := range keys[lo:hi] {
					delete(r.unsynced, k)
				}
				continue
			}
			r.connBroken(c, err)
			return
		}
		for _, k := range keys[lo:hi] {
			r.activeOn[k] = c
			c.keys[k] = struct{}{}
			delete(r.unsynced, k)
		}
	}
}

// retryable reports whether a Redis error answering SSUBSCRIBE heals once
// the slot map is read again: the cluster is resharding or failing over.
// While a slot moves the shards disagree on its owner for a moment, so an
// SSUBSCRIBE sent by a fresh slot map can still be answered MOVED (or ASK);
// taking that for a refusal would leave the room wanted but subscribed
// nowhere, its members hearing nothing more with no gap to reveal it.
// (rueidis' IsRedirect is the client-tracking REDIRECT, not MOVED.)
func retryable(re *rueidis.RedisError) bool {
	_, moved := re.IsMoved()
	_, ask := re.IsAsk()
	return moved || ask || re.IsClusterDown() || re.IsTryAgain() || re.IsLoading()
}

// buildCmds returns the (S)SUBSCRIBE or (S)UNSUBSCRIBE commands for keys:
// many channels per command on a single Redis, one per command on a
// cluster where a command's channels must share a slot.
func (r *Redis) buildCmds(c *subConn, keys []string, subscribe bool) []rueidis.Completed {
	per := channelsPerCommand
	if r.cluster {
		per = 1
	}
	b := c.dc.B()
	cmds := make([]rueidis.Completed, 0, (len(keys)+per-1)/per)
	for lo := 0; lo < len(keys); lo += per {
		chans := make([]string, 0, min(per, len(keys)-lo))
		for _, k := range keys[lo:min(lo+per, len(keys))] {
			chans = append(chans, r.channel(k))
		}
		var cmd rueidis.Completed
		switch {
		case subscribe && r.cluster:
			cmd = b.Ssubscribe().Channel(chans...).Build()
		case subscribe:
			cmd = b.Subscribe().Channel(chans...).Build()
		case r.cluster:
			cmd = b.Sunsubscribe().Channel(chans...).Build()
		default:
			cmd = b.Unsubscribe().Channel(chans...).Build()
		}
		cmds = append(cmds, cmd)
	}
	return cmds
}

// conn returns the live subscription connection to addr, dialing it if
// needed.
func (r *Redis) conn(ctx context.Context, addr string) (*subConn, error) {
	if c := r.conns[addr]; c != nil {
		return c, nil
	}
	c := &subConn{addr: addr, keys: make(map[string]struct{}), selfUnsub: make(map[string]int)}
	client := r.client
	if r.cluster {
		opt := r.opt
		opt.InitAddress = []string{addr}
		opt.ForceSingleClient = true
		owned, err := newClientCtx(ctx, opt)
		if err != nil {
			return nil, fmt.Errorf("cannot connect to redis %s: %w", addr, err)
		}
		c.owned, client = owned, owned
	}
	dc, _ := client.Dedicate()
	c.dc = dc
	closed := dc.SetPubSubHooks(rueidis.PubSubHooks{
		OnMessage: r.onMessage,
		OnSubscription: func(s rueidis.PubSubSubscription) {
			// Only a cluster drops subscriptions on its own (slot
			// migration); our own SUNSUBSCRIBEs are filtered by the worker.
			if s.Kind == "sunsubscribe" {
				if key, ok := strings.CutPrefix(s.Channel, r.chanPrefix); ok && strings.HasSuffix(key, "}") {
					r.enqueue(op{kind: opServerUnsub, conn: c, key: key[:len(key)-1]})
				}
			}
		},
	})
	// Prove the connection before trusting it with subscriptions: a dead
	// server fails here rather than on every SUBSCRIBE.
	if err := dc.Do(ctx, dc.B().Ping().Build()).Error(); err != nil {
		c.dead = true
		dc.Close()
		if c.owned != nil {
			c.owned.Close()
		}
		return nil, fmt.Errorf("cannot ping redis %s: %w", addr, err)
	}
	go func() {
		err, ok := <-closed
		if !ok || err == nil {
			err = errors.New("connection closed")
		}
		// A connection the worker dropped itself arrives here too; the
		// worker ignores dead connections.
		r.enqueue(op{kind: opBroken, conn: c, err: err})
	}()
	r.conns[addr] = c
	return c, nil
}

// owner returns the address of the shard owning key's slot.
func (r *Redis) owner(key string) (string, bool) {
	s := r.slotOf(key)
	for _, sr := range r.slots {
		if s >= sr.start && s <= sr.end {
			return sr.addr, true
		}
	}
	return "", false
}

// slotOf asks rueidis for the channel's slot so that routing agrees with
// how rueidis sends SPUBLISH.
func (r *Redis) slotOf(key string) uint16 {
	cmd := r.client.B().Spublish().Channel(r.channel(key)).Message("").Build()
	return cmd.Slot()
}

// refreshSlots reads the slot → primary map with CLUSTER SLOTS.
func (r *Redis) refreshSlots(ctx context.Context) error {
	var lastErr error
	// A random node answers; retry so one dead node does not block the
	// refresh while rueidis has not noticed it yet.
	for range 3 {
		arr, err := r.client.Do(ctx, r.client.B().ClusterSlots().Build()).ToArray()
		if err != nil {
			lastErr = err
			if ctx.Err() != nil {
				break
			}
			continue
		}
		slots := make([]slotRange, 0, len(arr))
		for _, e := range arr {
			v, err := e.ToArray()
			if err != nil || len(v) < 3 {
				return fmt.Errorf("cannot parse CLUSTER SLOTS entry: %v", err)
			}
			start, err1 := v[0].AsInt64()
			end, err2 := v[1].AsInt64()
			node, err3 := v[2].ToArray()
			if err := errors.Join(err1, err2, err3); err != nil || len(node) < 2 {
				return fmt.Errorf("cannot parse CLUSTER SLOTS entry: %v", err)
			}
			host, err1 := node[0].ToString()
			port, err2 := node[1].AsInt64()
			if err := errors.Join(err1, err2); err != nil {
				return fmt.Errorf("cannot parse CLUSTER SLOTS node: %w", err)
			}
			slots = append(slots, slotRange{uint16(start), uint16(end), net.JoinHostPort(host, strconv.FormatInt(port, 10))})
		}
		r.slots = slots
		return nil
	}
	return fmt.Errorf("cannot read CLUSTER SLOTS: %w", lastErr)
}
