//go:build linux

package bench

import (
	"bytes"
	"fmt"
	"math"
	"time"
)

// plotSVG draws p50, p99 and p999 latency (log scale) against offered rate
// for each level of a run. Hand-written SVG: no plotting dependency for
// one chart.
func plotSVG(rep *Report) []byte {
	const (
		w, h                     = 800, 480
		left, right, top, bottom = 80, 30, 50, 60
	)
	pw, ph := float64(w-left-right), float64(h-top-bottom)
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	title := fmt.Sprintf("roost bench %s: latency against offered rate", rep.Scenario)
	if rep.HighestSustained > 0 {
		title += fmt.Sprintf(" (highest sustained %.0f/s)", rep.HighestSustained)
	}
	fmt.Fprintf(&b, `<text x="%d" y="25" font-size="15">%s</text>`+"\n", left, xmlEscape(title))

	levels := rep.Levels
	if len(levels) == 0 {
		fmt.Fprintf(&b, `<text x="%d" y="%d">no levels measured</text></svg>`+"\n", left, top+20)
		return b.Bytes()
	}
	xmax := 0.0
	lo, hi := math.Inf(1), 0.0
	for _, r := range levels {
		xmax = math.Max(xmax, r.Offered)
		for _, v := range []time.Duration{r.Latency.P50, r.Latency.P99, r.Latency.P999} {
			if v > 0 {
				ms := float64(v) / 1e6
				lo = math.Min(lo, ms)
				hi = math.Max(hi, ms)
			}
		}
	}
	if xmax <= 0 {
		xmax = 1
	}
	if math.IsInf(lo, 1) {
		lo, hi = 0.01, 1
	}
	ylo := math.Pow(10, math.Floor(math.Log10(lo)))
	yhi := math.Pow(10, math.Ceil(math.Log10(hi)))
	if yhi <= ylo {
		yhi = ylo * 10
	}
	x := func(v float64) float64 { return float64(left) + v/xmax*pw }
	y := func(ms float64) float64 {
		if ms <= 0 {
			ms = ylo
		}
		return float64(top) + ph - (math.Log10(ms)-math.Log10(ylo))/(math.Log10(yhi)-math.Log10(ylo))*ph
	}

	// axes and grid
	fmt.Fprintf(&b, `<g stroke="#ccc">`+"\n")
	for d := ylo; d <= yhi*1.0001; d *= 10 {
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f"/>`+"\n", left, w-right, y(d), y(d))
	}
	for i := 0; i <= 5; i++ {
		xv := x(xmax * float64(i) / 5)
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d"/>`+"\n", xv, xv, top, h-bottom)
	}
	fmt.Fprintf(&b, "</g>\n")
	for d := ylo; d <= yhi*1.0001; d *= 10 {
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y(d)+4, fmtDur(time.Duration(d*1e6)))
	}
	for i := 0; i <= 5; i++ {
		xv := xmax * float64(i) / 5
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%.0f</text>`+"\n", x(xv), h-bottom+18, xv)
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">offered publishes/s</text>`+"\n", float64(left)+pw/2, h-15)
	fmt.Fprintf(&b, `<text x="18" y="%.1f" text-anchor="middle" transform="rotate(-90 18 %.1f)">latency, publish to receipt (log)</text>`+"\n",
		float64(top)+ph/2, float64(top)+ph/2)

	series := []struct {
		name  string
		color string
		get   func(LevelResult) time.Duration
	}{
		{"p50", "#1f77b4", func(r LevelResult) time.Duration { return r.Latency.P50 }},
		{"p99", "#ff7f0e", func(r LevelResult) time.Duration { return r.Latency.P99 }},
		{"p999", "#d62728", func(r LevelResult) time.Duration { return r.Latency.P999 }},
	}
	for i, s := range series {
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="`, s.color)
		for _, r := range levels {
			fmt.Fprintf(&b, "%.1f,%.1f ", x(r.Offered), y(float64(s.get(r))/1e6))
		}
		fmt.Fprintf(&b, "\"/>\n")
		for _, r := range levels {
			fill := s.color
			if !r.Sustained {
				fill = "white"
			}
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="4" stroke="%s" fill="%s"/>`+"\n", x(r.Offered), y(float64(s.get(r))/1e6), s.color, fill)
		}
		ly := top + 10 + 18*i
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="2"/><text x="%d" y="%d">%s</text>`+"\n",
			left+12, left+36, ly, ly, s.color, left+42, ly+4, s.name)
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#555">hollow points: level not sustained</text>`+"\n", left+12, top+10+18*3+4)
	b.WriteString("</svg>\n")
	return b.Bytes()
}

func xmlEscape(s string) string {
	var b bytes.Buffer
	for _, r := range s {
		switch r {
		case '<':
			b.WriteString("&lt;")
		case '>':
			b.WriteString("&gt;")
		case '&':
			b.WriteString("&amp;")
		case '"':
			b.WriteString("&quot;")
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// plotSeries draws a --series run over time: publish and receive rates,
// latencies (log scale) and each watched process's RSS, with the --events
// marked across all three panels.
func plotSeries(rep *Report) []byte {
	const (
		w, panelH                = 900, 220
		left, right, top, bottom = 80, 160, 50, 50
		gap                      = 40
	)
	h := top + 3*panelH + 2*gap + bottom
	pw := float64(w - left - right)
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	title := fmt.Sprintf("roost bench %s over time (%d connections)", rep.Scenario, rep.Connections)
	if v := rep.Verdict; v != nil {
		if v.OK {
			title += ": integrity ok"
		} else {
			title += ": INTEGRITY ERRORS"
		}
	}
	fmt.Fprintf(&b, `<text x="%d" y="25" font-size="15">%s</text>`+"\n", left, xmlEscape(title))
	pts := rep.Series
	if len(pts) == 0 {
		fmt.Fprintf(&b, `<text x="%d" y="%d">no series</text></svg>`+"\n", left, top+20)
		return b.Bytes()
	}
	tmax := pts[len(pts)-1].T + rep.SeriesStep
	x := func(t float64) float64 { return float64(left) + t/tmax*pw }
	colors := []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

	type series struct {
		name string
		v    []float64
	}
	panel := func(k int, label string, logY bool, ss []series) {
		y0 := float64(top + k*(panelH+gap))
		lo, hi := math.Inf(1), 0.0
		for _, s := range ss {
			for _, v := range s.v {
				if v > 0 && !math.IsNaN(v) {
					lo, hi = math.Min(lo, v), math.Max(hi, v)
				}
			}
		}
		if math.IsInf(lo, 1) {
			lo, hi = 1, 10
		}
		var y func(v float64) float64
		if logY {
			lo = math.Pow(10, math.Floor(math.Log10(lo)))
			hi = math.Pow(10, math.Ceil(math.Log10(hi)))
			if hi <= lo {
				hi = lo * 10
			}
			y = func(v float64) float64 {
				v = math.Max(v, lo)
				return y0 + panelH - (math.Log10(v)-math.Log10(lo))/(math.Log10(hi)-math.Log10(lo))*panelH
			}
		} else {
			lo, hi = 0, hi*1.1
			y = func(v float64) float64 { return y0 + panelH - v/hi*panelH }
		}
		fmt.Fprintf(&b, `<rect x="%d" y="%.0f" width="%.0f" height="%d" fill="none" stroke="#999"/>`+"\n", left, y0, pw, panelH)
		if logY {
			for d := lo; d <= hi*1.0001; d *= 10 {
				fmt.Fprintf(&b, `<line x1="%d" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n",
					left, float64(left)+pw, y(d), y(d), left-6, y(d)+4, fmtDur(time.Duration(d*1e6)))
			}
		} else {
			for i := 0; i <= 4; i++ {
				v := hi * float64(i) / 4
				fmt.Fprintf(&b, `<line x1="%d" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%.4g</text>`+"\n",
					left, float64(left)+pw, y(v), y(v), left-6, y(v)+4, v)
			}
		}
		fmt.Fprintf(&b, `<text x="18" y="%.1f" text-anchor="middle" transform="rotate(-90 18 %.1f)">%s</text>`+"\n", y0+panelH/2, y0+panelH/2, xmlEscape(label))
		for i, s := range ss {
			c := colors[i%len(colors)]
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="`, c)
			for j, v := range s.v {
				if j < len(pts) && !math.IsNaN(v) && (v > 0 || !logY) {
					fmt.Fprintf(&b, "%.1f,%.1f ", x(pts[j].T+rep.SeriesStep/2), y(v))
				}
			}
			fmt.Fprintf(&b, "\"/>\n")
			ly := int(y0) + 12 + 16*i
			fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%d" y2="%d" stroke="%s" stroke-width="2"/><text x="%.0f" y="%d">%s</text>`+"\n",
				float64(left)+pw+10, float64(left)+pw+30, ly, ly, c, float64(left)+pw+35, ly+4, xmlEscape(s.name))
		}
	}
	get := func(f func(SeriesPoint) float64) []float64 {
		out := make([]float64, len(pts))
		for i, p := range pts {
			out[i] = f(p)
		}
		return out
	}
	panel(0, "per second", false, []series{
		{"sent/s", get(func(p SeriesPoint) float64 { return p.SentPerS })},
		{"acked/s", get(func(p SeriesPoint) float64 { return p.AckedPerS })},
		{"frames/s ÷ 10", get(func(p SeriesPoint) float64 { return p.FramesPerS / 10 })},
		{"rejoined/s", get(func(p SeriesPoint) float64 { return float64(p.Rejoined) / rep.SeriesStep })},
	})
	panel(1, "latency (log)", true, []series{
		{"p50 live", get(func(p SeriesPoint) float64 { return ms(p.P50) })},
		{"p99 live", get(func(p SeriesPoint) float64 { return ms(p.P99) })},
		{"ack p99", get(func(p SeriesPoint) float64 { return ms(p.AckP99) })},
	})
	var rss []series
	for i, name := range rep.SeriesNames {
		rss = append(rss, series{name + " MiB", get(func(p SeriesPoint) float64 {
			if i < len(p.RSS) && p.RSS[i] > 0 {
				return float64(p.RSS[i]) / (1 << 20)
			}
			return math.NaN() // not sampled (the drain), or the process was down
		})})
	}
	panel(2, "RSS (MiB)", false, rss)
	for _, ev := range rep.Windows {
		if ev.T < 0 || ev.T > tmax {
			continue
		}
		xv := x(ev.T)
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#d62728" stroke-dasharray="4 3"/>`+"\n", xv, xv, top, top+3*panelH+2*gap)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" fill="#d62728" font-size="10" transform="rotate(-90 %.1f %d)">%s</text>`+"\n",
			xv-3, top+panelH-4, xv-3, top+panelH-4, xmlEscape(ev.Name))
	}
	for i := 0; i <= 6; i++ {
		t := tmax * float64(i) / 6
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%.0fs</text>`+"\n", x(t), top+3*panelH+2*gap+18, t)
	}
	b.WriteString("</svg>\n")
	return b.Bytes()
}
