package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strconv"
	"strings"

	"github.com/roost-chat/roost/persist"
	"github.com/roost-chat/roost/proto"
)

// registryLog logs each change of the app registry as this node applies
// it, once per app: an operator who disabled an app or set its webhook can
// see on every node when (and that) the change arrived. The registry is
// re-read periodically; a read that changes nothing logs nothing.
type registryLog struct {
	log  *slog.Logger
	last map[string]map[string]string // app -> flattened settings; nil before the first read
}

func newRegistryLog(log *slog.Logger) *registryLog { return &registryLog{log: log} }

// applied is called with every registry read this node applies, from the
// registry's watcher (one goroutine at a time).
func (r *registryLog) applied(apps []proto.App) {
	next := make(map[string]map[string]string, len(apps))
	for i := range apps {
		next[apps[i].ID] = flattenApp(&apps[i])
	}
	first := r.last == nil
	prev := r.last
	r.last = next
	if first {
		// The start-up read is summed up by the "app registry" line.
		return
	}
	ids := make([]string, 0, len(next))
	for id := range next {
		ids = append(ids, id)
	}
	for id := range prev {
		if next[id] == nil {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	for _, id := range ids {
		old, cur := prev[id], next[id]
		switch {
		case old == nil:
			r.log.Info("app registry change applied", "app", id, "change", "created")
		case cur == nil:
			r.log.Info("app registry change applied", "app", id, "change", "removed")
		default:
			if ch := diffSettings(old, cur); ch != "" {
				r.log.Info("app registry change applied", "app", id, "change", ch)
			}
		}
	}
}

// flattenApp is an app's settings as dotted JSON keys (limits.max_conns,
// webhook.url ...) to printable values, so that a setting added to
// proto.App later is reported without a change here. Values that may be
// or hold a credential are reduced to a fingerprint that tells a change.
func flattenApp(a *proto.App) map[string]string {
	b, err := json.Marshal(a)
	if err != nil {
		return map[string]string{"": "unprintable: " + err.Error()}
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return map[string]string{"": "unprintable: " + err.Error()}
	}
	out := map[string]string{}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if prefix != "" {
					k = prefix + "." + k
				}
				walk(k, x)
			}
		case string:
			if sensitiveSetting(prefix, v) {
				out[prefix] = "\x00" + v // compared, never printed
			} else {
				out[prefix] = strconv.Quote(v)
			}
		default:
			b, _ := json.Marshal(v)
			out[prefix] = string(b)
		}
	}
	walk("", m)
	delete(out, "id")
	delete(out, "created")
	return out
}

// sensitiveSetting: secrets, keys, and URLs (a webhook or proxy URL often
// carries a token in its query) are not written to logs.
func sensitiveSetting(key, v string) bool {
	for _, w := range []string{"secret", "key", "token", "password"} {
		if strings.Contains(key, w) {
			return true
		}
	}
	return strings.Contains(v, "://")
}

// diffSettings says what changed from old to cur, "" for nothing:
// "disabled", "limits.max_conns 10 -> 20", "webhook.url set" ...
func diffSettings(old, cur map[string]string) string {
	keys := make([]string, 0, len(old)+len(cur))
	for k := range cur {
		keys = append(keys, k)
	}
	for k := range old {
		if _, ok := cur[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var out []string
	for _, k := range keys {
		o, hadOld := old[k]
		c, hasCur := cur[k]
		if hadOld && hasCur && o == c {
			continue
		}
		switch {
		case k == "disabled":
			if c == "true" {
				out = append(out, "disabled")
			} else {
				out = append(out, "enabled")
			}
		case k == "secret":
			out = append(out, "secret rotated")
		case !hasCur:
			out = append(out, k+" removed")
		case strings.HasPrefix(c, "\x00") || strings.HasPrefix(o, "\x00"):
			if hadOld {
				out = append(out, k+" changed")
			} else {
				out = append(out, k+" set")
			}
		case !hadOld:
			out = append(out, k+" set to "+c)
		default:
			out = append(out, k+" "+o+" -> "+c)
		}
	}
	return strings.Join(out, ", ")
}

// printMigration tells the operator what `roost migrate` did.
func printMigration(w io.Writer, rep persist.Migration) {
	if len(rep.Applied) == 0 {
		fmt.Fprintf(w, "roost migrate: nothing to apply: the schema is at version %d, this binary's\n", rep.To)
		return
	}
	for _, name := range rep.Applied {
		fmt.Fprintln(w, "roost migrate: applied", name)
	}
	fmt.Fprintf(w, "roost migrate: the schema went from version %d to %d, this binary's\n", rep.From, rep.To)
}

// appSetFlagLines lists every flag of `roost app set` for `roost app -h`,
// from the flags themselves, so that a new one cannot be left out.
func appSetFlagLines() string {
	fs := flag.NewFlagSet("set", flag.ContinueOnError)
	var lf limitFlags
	lf.bind(fs)
	var b strings.Builder
	line := "       "
	fs.VisitAll(func(f *flag.Flag) {
		item := " --" + f.Name + " " + appFlagValue(f)
		if len(line)+len(item) > 80 {
			b.WriteString(line + "\n")
			line = "       "
		}
		line += item
	})
	b.WriteString(line + "\n")
	return b.String()
}

// appFlagValue is the value a flag takes, as the listing shows it.
func appFlagValue(f *flag.Flag) string {
	switch f.Name {
	case "pub-rate", "app-pub-rate":
		return "R"
	case "pub-burst":
		return "B"
	case "max-msg":
		return "BYTES"
	case "keep-age", "webhook-max-age", "webhook-timeout", "proxy-timeout":
		return "D"
	case "webhook-url", "connect-proxy", "publish-proxy":
		return "URL|none"
	case "webhook-rooms":
		return "'a,b*'"
	case "proxy-fail":
		return "open|closed"
	case "proxy-inflight":
		return "N|default"
	}
	if name, _ := flag.UnquoteUsage(f); name != "" && name != "value" {
		return name
	}
	return "N"
}
