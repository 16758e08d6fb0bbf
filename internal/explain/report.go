package explain

import (
	"errors"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"unicode/utf8"

	"sbx.dev/sbx/internal/explain/analyze"
)

// TimelineRun is one run's events for the report's side-by-side view.
type TimelineRun struct {
	Run    int                    `json:"run"`
	Seed   uint32                 `json:"seed"`
	Failed bool                   `json:"failed"`
	Events []analyze.ExampleEvent `json:"events"`
	Cut    int                    `json:"cut"`
}

// maxTimeline bounds the events a timeline shows.
const maxTimeline = 300

// esc escapes what a sandbox wrote (paths, process names) for HTML and
// SVG; its control characters and invalid UTF-8 become U+FFFD, so that
// the file holds nothing a terminal acts on (cat report.html).
func esc(s string) string {
	return html.EscapeString(strings.Map(func(r rune) rune {
		if r == utf8.RuneError || r < 0x20 || r >= 0x7f && r < 0xa0 {
			return utf8.RuneError
		}
		return r
	}, strings.ToValidUTF8(s, "\uFFFD")))
}

// CheckReportPath says, before anything is run, whether the report can be
// written to path: not a directory, in a directory that exists and takes
// a new file. Found out only after every run, it would lose them all.
func CheckReportPath(path string) error {
	fi, err := os.Stat(path)
	switch {
	case err == nil && fi.IsDir():
		return fmt.Errorf("explain: --report %s is a directory: give a file's path", path)
	case err == nil && !fi.Mode().IsRegular():
		return nil // a device or a pipe (/dev/stdout): written to as it is
	}
	f, err := os.CreateTemp(filepath.Dir(reportTarget(path)), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("explain: --report %s: cannot write there: %w", path, err)
	}
	f.Close()
	return os.Remove(f.Name())
}

// reportTarget is the file a path names, through its symlinks: the file
// is replaced, not the link.
func reportTarget(path string) string {
	if real, err := filepath.EvalSymlinks(path); err == nil {
		return real
	}
	return path
}

// WriteReportFile writes the report to path, whole or not at all: a
// temporary file beside it, renamed into place (and removed if that
// fails). A path that is no regular file (/dev/stdout, /dev/null, a pipe)
// is written to as it is: renamed over, as root, /dev/null was a report.
func WriteReportFile(path string, r *Explained) error {
	if fi, err := os.Stat(path); err == nil && !fi.Mode().IsRegular() {
		if fi.IsDir() {
			return fmt.Errorf("explain: report %s is a directory", path)
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
		if err != nil {
			return fmt.Errorf("explain: report %s: %w", path, err)
		}
		if err := errors.Join(WriteReport(f, r), f.Close()); err != nil {
			return fmt.Errorf("explain: report %s: %w", path, err)
		}
		return nil
	}
	target := reportTarget(path)
	f, err := os.CreateTemp(filepath.Dir(target), "."+filepath.Base(target)+".*.tmp")
	if err != nil {
		return fmt.Errorf("explain: report %s: %w", path, err)
	}
	tmp := f.Name()
	err = WriteReport(f, r)
	err = errors.Join(err, f.Chmod(0o644), f.Close())
	if err == nil {
		err = os.Rename(tmp, target)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("explain: report %s: %w", path, err)
	}
	return nil
}

// WriteReport writes the report: one self-contained HTML page, its plots
// inline SVG, with no script and nothing fetched.
func WriteReport(w io.Writer, r *Explained) error {
	var b strings.Builder
	b.WriteString(`<!DOCTYPE html><html><head><meta charset="utf-8"><title>sbx explain</title>
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<style>body{font:14px sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse}td,th{padding:2px 8px;text-align:left;border-bottom:1px solid #ddd}
.fail{color:#b00}.pass{color:#070}svg text{font:11px sans-serif}code{background:#f4f4f4}</style></head><body>
`)
	fmt.Fprintf(&b, "<h1>sbx explain</h1>\n<p id=\"rate\">%d of %d runs failed: rate %.1f%% (95%% Wilson interval %.1f%%–%.1f%%)</p>\n",
		r.Failed, r.Runs, 100*r.Rate.Rate, 100*r.Rate.Low, 100*r.Rate.High)
	if r.Note != "" {
		fmt.Fprintf(&b, "<p>%s</p>\n", esc(r.Note))
	}
	if r.Dropped > 0 {
		fmt.Fprintf(&b, "<p>The traces lost %d events.</p>\n", r.Dropped)
	}

	b.WriteString("<h2>Divergence</h2>\n")
	if len(r.Divergence) == 0 {
		b.WriteString("<p>No event told failing runs from passing runs.</p>\n")
	} else {
		b.WriteString(`<table id="divergence"><tr><th>#</th><th>finding</th><th>failing</th><th>passing</th><th>Fisher p</th><th>example</th></tr>` + "\n")
		for i, f := range r.Divergence {
			var ex []string
			for _, e := range f.Example.Events {
				ex = append(ex, fmt.Sprintf("%.1f ms %s[%d] %s", e.AtMs, e.Process, e.Pid, e.Event))
			}
			fmt.Fprintf(&b, "<tr><td>%d</td><td><code>%s</code></td><td>%d/%d</td><td>%d/%d</td><td>%.2g</td><td>run %d: %s</td></tr>\n",
				i+1, esc(f.Summary), f.Failing, f.FailingRuns, f.Passing, f.PassingRuns, f.P, f.Example.Run, esc(strings.Join(ex, "; then ")))
		}
		b.WriteString("</table>\n")
	}

	b.WriteString("<h2>A failing run and a passing run</h2>\n")
	if len(r.Timelines) == 0 {
		b.WriteString("<p>No pair of runs to show.</p>\n")
	} else {
		marked := map[string]bool{}
		for _, f := range r.Divergence[:min(3, len(r.Divergence))] { // the top findings' events
			for _, e := range f.Example.Events {
				marked[e.Event] = true
			}
		}
		timelines(&b, r.Timelines, marked)
	}

	b.WriteString("<h2>Knobs</h2>\n")
	if len(r.Knobs) == 0 {
		b.WriteString("<p>No knob was measured.</p>\n")
	} else {
		knobBars(&b, r.Knobs)
		b.WriteString("<ul>")
		for _, v := range r.KnobVerdicts {
			fmt.Fprintf(&b, "<li>%s</li>", esc(v.Summary))
		}
		b.WriteString("</ul>\n")
	}

	for _, k := range r.KnobSkipped {
		fmt.Fprintf(&b, "<p>Knob not measured: %s</p>\n", esc(k))
	}

	b.WriteString("<h2>Point of no return</h2>\n")
	if pn := r.PointOfNoReturn; pn == nil {
		b.WriteString(`<p>Not measured (no run failed, or --pnr-parents 0).</p>` + "\n")
	} else {
		curve(&b, pn)
		fmt.Fprintf(&b, "<p>%s. A capture paused a run %.0f ms at most.</p>\n", esc(pn.Note), pn.PauseMs)
		if len(pn.Before) > 0 {
			b.WriteString("<p>A failing run's last events before it:</p><ul>")
			for _, e := range pn.Before {
				fmt.Fprintf(&b, "<li>%.1f ms %s[%d] <code>%s</code></li>", e.AtMs, esc(e.Process), e.Pid, esc(e.Event))
			}
			b.WriteString("</ul>\n")
		}
	}
	if r.Fix != nil {
		fmt.Fprintf(&b, "<h2>Fix</h2>\n<p id=\"fix\">%s</p>\n", esc(r.Fix.Summary))
	}
	b.WriteString("</body></html>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// curve draws the rate among forks against the offset they were taken
// at, each point with its interval, and the 90% line.
func curve(b *strings.Builder, pn *PointOfNoReturn) {
	const width, h, left, top = 600.0, 200.0, 50.0, 20.0
	end := 1.0
	for _, p := range pn.Curve {
		end = math.Max(end, p.AtMs)
	}
	x := func(ms float64) float64 { return left + (width-left-30)*ms/end }
	y := func(rate float64) float64 { return top + h*(1-rate) }
	fmt.Fprintf(b, `<svg id="curve" width="%.0f" height="%.0f">`, width, h+top+40)
	for _, t := range []float64{0, 0.5, 0.9, 1} {
		fmt.Fprintf(b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#ddd"/><text x="4" y="%.1f">%.0f%%</text>`, left, width, y(t), y(t), y(t)+4, 100*t)
	}
	var pts []string
	for _, p := range pn.Curve {
		fmt.Fprintf(b, `<text x="%.1f" y="%.0f" text-anchor="middle">%.0f ms</text>`, x(p.AtMs), top+h+20, p.AtMs)
		if p.Runs == 0 {
			continue
		}
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(p.AtMs), y(p.Rate)))
		fmt.Fprintf(b, `<line class="interval" x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#000"/>`, x(p.AtMs), x(p.AtMs), y(p.Low), y(p.High))
		fmt.Fprintf(b, `<circle class="point" cx="%.1f" cy="%.1f" r="4" fill="#c00"><title>%.0f ms: %d/%d forks failed</title></circle>`, x(p.AtMs), y(p.Rate), p.AtMs, p.Failed, p.Runs)
	}
	if len(pts) > 1 {
		fmt.Fprintf(b, `<polyline points="%s" fill="none" stroke="#c00"/>`, strings.Join(pts, " "))
	}
	if pn.Certain {
		fmt.Fprintf(b, `<line x1="%.1f" x2="%.1f" y1="%.0f" y2="%.0f" stroke="#c00" stroke-dasharray="4"/>`, x(pn.AtMs), x(pn.AtMs), top, top+h)
	}
	b.WriteString("</svg>\n")
}

// knobBars draws each knob value's rate as a bar with its interval.
func knobBars(b *strings.Builder, knobs []Knob) {
	const h, top, barW, gap = 180.0, 20.0, 40.0, 24.0
	width := 60 + float64(len(knobs))*(barW+gap)
	fmt.Fprintf(b, `<svg id="knobs" width="%.0f" height="%.0f">`, width, h+top+50)
	y := func(rate float64) float64 { return top + h*(1-rate) }
	for _, t := range []float64{0, 0.5, 1} {
		fmt.Fprintf(b, `<line x1="40" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#ddd"/><text x="4" y="%.1f">%.0f%%</text>`, width, y(t), y(t), y(t)+4, 100*t)
	}
	for i, k := range knobs {
		x := 50 + float64(i)*(barW+gap)
		fmt.Fprintf(b, `<rect class="bar" x="%.1f" y="%.1f" width="%.0f" height="%.1f" fill="#c66"/>`, x, y(k.Rate), barW, h*k.Rate)
		cx := x + barW/2
		fmt.Fprintf(b, `<line class="interval" x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#000"/>`, cx, cx, y(k.Low), y(k.High))
		fmt.Fprintf(b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#000"/><line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#000"/>`,
			cx-6, cx+6, y(k.Low), y(k.Low), cx-6, cx+6, y(k.High), y(k.High))
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f">%s</text><text x="%.1f" y="%.1f">%s</text>`, x, top+h+16, esc(k.Knob), x, top+h+30, esc(k.Value))
	}
	b.WriteString("</svg>\n")
}

// timelines draws runs one above the other on one time axis, the events
// that findings name marked.
func timelines(b *strings.Builder, runs []TimelineRun, marked map[string]bool) {
	end := 1.0
	for _, r := range runs {
		for _, e := range r.Events {
			end = math.Max(end, e.AtMs)
		}
	}
	const width, left, lane = 1000.0, 150.0, 90.0
	x := func(ms float64) float64 { return left + (width-left-20)*ms/end }
	height := 40 + lane*float64(len(runs))
	fmt.Fprintf(b, `<svg id="timelines" width="%.0f" height="%.0f">`, width, height)
	for t := 0.0; t <= end; t += niceStep(end) {
		fmt.Fprintf(b, `<line x1="%.1f" x2="%.1f" y1="10" y2="%.0f" stroke="#eee"/><text x="%.1f" y="%.0f">%.0f ms</text>`, x(t), x(t), height-20, x(t), height-6, t)
	}
	for i, r := range runs {
		yl := 30 + lane*float64(i)
		class, word := "pass", "passed"
		if r.Failed {
			class, word = "fail", "failed"
		}
		fmt.Fprintf(b, `<text class="%s" x="4" y="%.0f">run %d (%s)</text><text x="4" y="%.0f">seed %d</text>`, class, yl+4, r.Run, word, yl+18, r.Seed)
		fmt.Fprintf(b, `<line x1="%.0f" x2="%.0f" y1="%.0f" y2="%.0f" stroke="#999"/>`, left, width-20, yl, yl)
		labels := 0
		for _, e := range r.Events {
			if marked[e.Event] {
				fmt.Fprintf(b, `<circle class="marked" cx="%.1f" cy="%.0f" r="5" fill="#d00"><title>%.1f ms %s: %s</title></circle>`, x(e.AtMs), yl, e.AtMs, esc(e.Process), esc(e.Event))
				if labels < 3 {
					tx, anchor := x(e.AtMs)+6, "start"
					if tx > width*0.6 {
						tx, anchor = x(e.AtMs)-6, "end" // keep the label on the page
					}
					fmt.Fprintf(b, `<text x="%.1f" y="%.0f" fill="#d00" text-anchor="%s">%s</text>`, tx, yl-8-12*float64(labels), anchor, esc(e.Event))
					labels++
				}
				continue
			}
			fmt.Fprintf(b, `<line class="event" x1="%.1f" x2="%.1f" y1="%.0f" y2="%.0f" stroke="#36c"><title>%.1f ms %s: %s</title></line>`, x(e.AtMs), x(e.AtMs), yl-6, yl+6, e.AtMs, esc(e.Process), esc(e.Event))
		}
		if r.Cut > 0 {
			fmt.Fprintf(b, `<text x="%.0f" y="%.0f">(%d more events not shown)</text>`, left, yl+24, r.Cut)
		}
	}
	b.WriteString("</svg>\n")
}

// niceStep is a round tick step for an axis of end ms.
func niceStep(end float64) float64 {
	step := math.Pow(10, math.Floor(math.Log10(end)))
	if end/step < 3 {
		step /= 2
	}
	return math.Max(step, 1)
}
