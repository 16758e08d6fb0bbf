// Package analyze finds what the failing runs of a flaky test did that its
// passing runs did not, from each run's runtime monitoring trace. It is
// pure: traces in, ranked findings out.
//
// Each run's events are those of the test's process tree from the run's
// start. Every event becomes a key that is the same in two runs for the
// same act: pids and times are dropped, and in paths and addresses
// temporary names, numbers and ephemeral ports are replaced. A run's
// features are its keys and, for two keys on one resource (a path, a
// port), which came first. Features are ranked by Fisher's exact test of
// failing against passing runs.
package analyze

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"sbx.dev/sbx/api"
)

// Run is one run of the test with its trace.
type Run struct {
	Run    int
	Seed   uint32
	Failed bool
	// StartNs is when the run started, on the sandbox's clock; Root is the
	// test's pid inside (0: unknown, and then every event from StartNs on
	// counts).
	StartNs int64
	Root    int32
	Events  []api.TraceEvent
	// Dropped counts the events its trace lost (by sbxd or gVisor).
	Dropped int64
}

// Bounds on the work one analysis does: what a sandbox sends is bounded
// already, these keep the pairs of the order features in hand.
const (
	maxKeysPerResource = 24
	// maxOrderKeys bounds the keys, over all resources, whose orders are
	// features: a run's order features are at most their pairs on one
	// resource, so a trace of 20000 connects and binds spread over
	// ports cannot make hundreds of thousands per run (it made 1.7 GB
	// of garbage and 8 s for 24 runs). A real test has a few.
	maxOrderKeys = 256
	maxFindings  = 10
	// TreeDepth bounds the walk from a process up to the test's root.
	treeDepth = 64
)

// Finding is one feature that separates failing from passing runs.
type Finding struct {
	// Summary says it for people: "connect(127.0.0.1:8765) failed
	// ECONNREFUSED", "connect(127.0.0.1:8765) came before
	// bind(127.0.0.1:8765)".
	Summary string `json:"summary"`
	// Resource is the path or address it is about ("" for none).
	Resource string `json:"resource"`
	// Failing and Passing count the runs that showed it, of
	// FailingRuns and PassingRuns.
	Failing     int `json:"failing"`
	Passing     int `json:"passing"`
	FailingRuns int `json:"failingRuns"`
	PassingRuns int `json:"passingRuns"`
	// P is the two-sided p-value of Fisher's exact test; Score is
	// -log10(P), higher separating better.
	P     float64 `json:"p"`
	Score float64 `json:"score"`
	// InFailing says the feature is more common in failing runs (else
	// it is what passing runs do and failing ones do not).
	InFailing bool    `json:"inFailing"`
	Example   Example `json:"example"`
}

// Example is one run that showed a finding, with its events and times.
type Example struct {
	Run    int            `json:"run"`
	Seed   uint32         `json:"seed"`
	Failed bool           `json:"failed"`
	Events []ExampleEvent `json:"events"`
	// Note says what the example lacks ("no bind(:8765) in this run").
	Note string `json:"note,omitempty"`
}

// ExampleEvent is one event of an example, at its time from the run's start.
type ExampleEvent struct {
	AtMs    float64 `json:"atMs"`
	Pid     int32   `json:"pid"`
	Process string  `json:"process"`
	Event   string  `json:"event"`
}

// Result is the divergence of a set of runs.
type Result struct {
	Runs     int       `json:"runs"`
	Failed   int       `json:"failed"`
	Findings []Finding `json:"findings"`
	// Note says why there is nothing to compare, when there is not.
	Note string `json:"note,omitempty"`
	// Dropped is how many events the traces lost in all, and Empty how
	// many runs had no event of their test (their trace said nothing).
	Dropped int64 `json:"dropped"`
	Empty   int   `json:"empty"`
	// Ports are the FixedPorts the keys kept (TimelineWith them).
	Ports map[string]bool `json:"-"`
}

// event is one normalised event of a run.
type event struct {
	key      string // the act, the same across runs
	resource string // what it is on ("" for none)
	atNs     int64  // from the run's start
	raw      api.TraceEvent
}

// feature is what one run shows: a key, or an order of two keys.
type feature struct {
	summary  string
	resource string
	order    bool
	atNs     int64 // when the run showed it (the earlier event)
}

// runFeatures is one run's features and the events that show each.
type runFeatures struct {
	run   Run
	first map[string]event // each key's first event
	keys  []string         // in order of first occurrence
	has   map[string]feature
	show  map[string][]event
	note  map[string]string
}

// candidate is a feature with what ranks it.
type candidate struct {
	Finding
	key    string
	median int64 // when failing runs showed it
	order  bool
	vector string // which runs showed it
}

// Analyze ranks the features that separate the failing runs from the
// passing ones.
func Analyze(runs []Run) Result {
	res := Result{Runs: len(runs), Findings: []Finding{}, Ports: FixedPorts(runs)}
	var all []*runFeatures
	for _, r := range runs {
		if r.Failed {
			res.Failed++
		}
		res.Dropped += r.Dropped
		evs := Select(r)
		if len(evs) == 0 {
			res.Empty++
		}
		all = append(all, keysOf(r, evs, res.Ports))
	}
	pass := res.Runs - res.Failed
	switch {
	case res.Runs == 0:
		res.Note = "no runs: nothing to compare"
		return res
	case res.Failed == 0:
		res.Note = fmt.Sprintf("no run of %d failed: nothing to compare a failure with", res.Runs)
		return res
	case pass == 0:
		res.Note = fmt.Sprintf("every run of %d failed: nothing to compare with a pass", res.Runs)
		return res
	}
	addOrders(all)
	type tally struct {
		f          feature
		fail, pass int
		atFail     []int64
		vector     []byte
		lacked     bool // a run showed it without its second event
	}
	tallies := map[string]*tally{}
	for i, rf := range all {
		for k, f := range rf.has {
			t := tallies[k]
			if t == nil {
				t = &tally{f: f, vector: []byte(strings.Repeat("0", len(all)))}
				tallies[k] = t
			}
			t.vector[i] = '1'
			if rf.note[k] != "" {
				t.lacked = true
			}
			if rf.run.Failed {
				t.fail++
				t.atFail = append(t.atFail, f.atNs)
			} else {
				t.pass++
			}
		}
	}
	var cands []candidate
	for k, t := range tallies {
		if t.fail*pass == t.pass*res.Failed {
			continue // as common in both: says nothing
		}
		p := Fisher(t.fail, res.Failed-t.fail, t.pass, pass-t.pass)
		summary := t.f.summary
		if t.f.order && t.lacked {
			summary += ", or never"
		}
		cands = append(cands, candidate{
			Finding: Finding{Summary: summary, Resource: t.f.resource, Failing: t.fail, Passing: t.pass,
				FailingRuns: res.Failed, PassingRuns: pass, P: p, Score: -math.Log10(p),
				InFailing: float64(t.fail)/float64(res.Failed) > float64(t.pass)/float64(pass)},
			key: k, median: median(t.atFail), order: t.f.order, vector: string(t.vector),
		})
	}
	// Best separation first; among equals, what failing runs did over what
	// they did not do, a resource over none, the earlier in the run (a
	// cause comes before its consequences), an order over one event, then
	// the key, for a stable order.
	sort.Slice(cands, func(x, y int) bool {
		a, b := cands[x], cands[y]
		if math.Abs(a.Score-b.Score) > 1e-9 {
			return a.Score > b.Score
		}
		if a.InFailing != b.InFailing {
			return a.InFailing
		}
		if (a.Resource != "") != (b.Resource != "") {
			return a.Resource != ""
		}
		if a.median != b.median {
			return a.median < b.median
		}
		if a.order != b.order {
			return a.order
		}
		return a.key < b.key
	})
	// One finding per resource and set of runs: the rest say the same.
	seen := map[string]bool{}
	for _, c := range cands {
		group := c.Resource + "\x00" + c.vector
		if c.Resource == "" {
			group = c.key
		}
		if seen[group] {
			continue
		}
		seen[group] = true
		f := c.Finding
		f.Example = example(all, c.key, f.InFailing)
		res.Findings = append(res.Findings, f)
		if len(res.Findings) == maxFindings {
			break
		}
	}
	return res
}

func median(v []int64) int64 {
	if len(v) == 0 {
		return math.MaxInt64
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// example picks the first run of the finding's side that showed it.
func example(all []*runFeatures, key string, inFailing bool) Example {
	for _, rf := range all {
		if rf.run.Failed != inFailing {
			continue
		}
		if _, ok := rf.has[key]; !ok {
			continue
		}
		ex := Example{Run: rf.run.Run, Seed: rf.run.Seed, Failed: rf.run.Failed, Note: rf.note[key]}
		for _, e := range rf.show[key] {
			ex.Events = append(ex.Events, ExampleEvent{AtMs: float64(e.atNs) / 1e6, Pid: e.raw.Pid, Process: e.raw.Process, Event: e.key})
		}
		return ex
	}
	return Example{}
}

// Select returns the events of r's test: those of its process tree (all,
// when its root is unknown or never seen) from its start on, in time order.
func Select(r Run) []api.TraceEvent {
	parent := map[int32]int32{}
	for _, e := range r.Events {
		if e.PPid != 0 {
			if _, ok := parent[e.Pid]; !ok {
				parent[e.Pid] = e.PPid
			}
		}
		if e.Kind == "clone" && e.Child != 0 && e.Child != e.Pid {
			parent[e.Child] = e.Pid
		}
	}
	inTree := func(pid int32) bool { return true }
	if r.Root != 0 && hasPid(r.Events, r.Root) {
		memo := map[int32]bool{}
		inTree = func(pid int32) bool {
			if v, ok := memo[pid]; ok {
				return v
			}
			p, v := pid, false
			for range treeDepth {
				if p == r.Root {
					v = true
					break
				}
				next, ok := parent[p]
				if !ok || next == p {
					break
				}
				p = next
			}
			memo[pid] = v
			return v
		}
	}
	var out []api.TraceEvent
	for _, e := range r.Events {
		if r.StartNs != 0 && e.TimeNs < r.StartNs {
			continue
		}
		if inTree(e.Pid) {
			out = append(out, e)
		}
	}
	slices.SortStableFunc(out, func(a, b api.TraceEvent) int { return cmpInt(a.TimeNs, b.TimeNs) })
	// a listen is on the address bound on its descriptor
	bound := map[[2]int64]string{}
	for i, e := range out {
		switch {
		case e.Kind == "bind" && e.Errno == 0:
			bound[[2]int64{int64(e.Pid), e.Fd}] = e.Addr
		case e.Kind == "listen" && e.Addr == "":
			out[i].Addr = bound[[2]int64{int64(e.Pid), e.Fd}]
		}
	}
	return out
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func hasPid(evs []api.TraceEvent, pid int32) bool {
	for _, e := range evs {
		if e.Pid == pid || e.Child == pid {
			return true
		}
	}
	return false
}

// keysOf turns a run's events into its keys, each with its first event.
func keysOf(r Run, evs []api.TraceEvent, fixed map[string]bool) *runFeatures {
	rf := &runFeatures{run: r, first: map[string]event{}, has: map[string]feature{}, show: map[string][]event{}, note: map[string]string{}}
	start := r.StartNs
	if start == 0 && len(evs) > 0 {
		start = evs[0].TimeNs
	}
	for _, raw := range evs {
		key, res, ok := NormalizeWith(raw, fixed)
		if !ok {
			continue
		}
		if _, dup := rf.first[key]; dup {
			continue
		}
		e := event{key: key, resource: res, atNs: raw.TimeNs - start, raw: raw}
		rf.first[key] = e
		rf.keys = append(rf.keys, key)
		rf.has[key] = feature{summary: key, resource: res, atNs: e.atNs}
		rf.show[key] = []event{e}
	}
	return rf
}

// addOrders gives each run its order features: for two keys a and b of
// different syscalls on one resource (of any run), "b came after a" where
// a happened and b had not happened before it: later, or never.
func addOrders(all []*runFeatures) {
	// only a resource with two syscalls on it has orders
	verbs := map[string]map[string]bool{}
	for _, rf := range all {
		for _, k := range rf.keys {
			if res := rf.first[k].resource; res != "" {
				if verbs[res] == nil {
					verbs[res] = map[string]bool{}
				}
				if len(verbs[res]) < 2 {
					verbs[res][verb(k)] = true
				}
			}
		}
	}
	byRes := map[string][]string{}
	known := map[string]bool{}
	for _, rf := range all {
		for _, k := range rf.keys {
			res := rf.first[k].resource
			if res == "" || len(verbs[res]) < 2 || known[k] || len(byRes[res]) >= maxKeysPerResource || len(known) >= maxOrderKeys {
				continue
			}
			known[k] = true
			byRes[res] = append(byRes[res], k)
		}
	}
	for _, rf := range all {
		for res, ks := range byRes {
			for _, a := range ks {
				ea, ok := rf.first[a]
				if !ok {
					continue
				}
				for _, b := range ks {
					if a == b || verb(a) == verb(b) {
						continue
					}
					eb, has := rf.first[b]
					if has && eb.atNs <= ea.atNs {
						continue
					}
					k := b + " came after " + a
					rf.has[k] = feature{summary: k, resource: res, order: true, atNs: ea.atNs}
					if has {
						rf.show[k] = []event{ea, eb}
					} else {
						rf.show[k] = []event{ea}
						rf.note[k] = "no " + b + " in this run"
					}
				}
			}
		}
	}
}

// verb is the syscall of a key ("connect" of "connect(127.0.0.1:8765) ok").
func verb(key string) string {
	if i := strings.IndexByte(key, '('); i > 0 {
		return key[:i]
	}
	return key
}

var (
	reDigits   = regexp.MustCompile(`[0-9]+`)
	reHexish   = regexp.MustCompile(`^[0-9a-fA-F]{8,}$`)
	reTempName = regexp.MustCompile(`^(tmp|pytest-|sbx|\.?[a-z]*)[._-]?[A-Za-z0-9_]{6,}$`)
)

// Normalize gives an event its key, the same for the same act in two runs,
// and its resource. ok is false for an event that is no feature (a clone).
func Normalize(e api.TraceEvent) (key, resource string, ok bool) { return NormalizeWith(e, nil) }

// NormalizeWith is Normalize keeping the ports of fixed (FixedPorts) as
// they are, high as they are.
func NormalizeWith(e api.TraceEvent, fixed map[string]bool) (key, resource string, ok bool) {
	proc := NormalizeName(e.Process)
	switch e.Kind {
	case "open":
		p := NormalizePath(e.Path)
		return fmt.Sprintf("open(%s) %s", p, outcome(e)), p, true
	case "listen":
		if e.Addr == "" {
			return fmt.Sprintf("listen() by %s %s", proc, outcome(e)), "", true
		}
		a := keepFixed(e.Addr, NormalizeAddr(e.Addr, true), fixed)
		return fmt.Sprintf("listen(%s) %s", a, outcome(e)), resourceOf(a), true
	case "connect", "bind":
		a := keepFixed(e.Addr, NormalizeAddr(e.Addr, e.Kind == "bind"), fixed)
		return fmt.Sprintf("%s(%s) %s", e.Kind, a, outcome(e)), resourceOf(a), true
	case "accept":
		return fmt.Sprintf("accept(%s) %s", NormalizeAddr(e.Addr, false), outcome(e)), "", true
	case "execve":
		return fmt.Sprintf("execve(%s)", NormalizePath(e.Path)), "", true
	case "exit":
		return proc + " " + exitWords(e.Status), "", true
	case "clone":
		return "", "", false
	case "":
		return "", "", false
	}
	// raw syscalls (rename, unlink): the syscall by its process, with its result
	return fmt.Sprintf("%s() by %s %s", e.Kind, proc, outcome(e)), "", true
}

// exitWords says a task's exit status, a wait status (exit code 1 is
// 256): "exited 1", "killed by SIGKILL".
func exitWords(status int32) string {
	ws := unix.WaitStatus(status)
	switch {
	case ws.Exited():
		return fmt.Sprintf("exited %d", ws.ExitStatus())
	case ws.Signaled():
		name := unix.SignalName(ws.Signal())
		if name == "" {
			name = fmt.Sprintf("signal %d", int(ws.Signal()))
		}
		return "killed by " + name
	}
	return fmt.Sprintf("ended with wait status %d", status)
}

// outcome is a syscall's result: "ok", "failed ENOENT", "in progress".
func outcome(e api.TraceEvent) string {
	errno := e.Errno
	if errno == 0 && e.Result < 0 && e.Result > -4096 {
		errno = -e.Result
	}
	switch {
	case errno == 0:
		return "ok"
	case errno == int64(unix.EINPROGRESS):
		return "in progress"
	}
	name := unix.ErrnoName(unix.Errno(errno))
	if name == "" {
		name = "errno " + strconv.FormatInt(errno, 10)
	}
	return "failed " + name
}

// NormalizeName is a process name without its numbers ("python3" stays,
// "worker-12" is "worker-N").
func NormalizeName(s string) string {
	if s == "" {
		return "?"
	}
	// a digit at the end of a name of letters is its version (python3)
	if strings.IndexFunc(s, func(r rune) bool { return r < '0' || r > '9' }) >= 0 && reDigits.FindAllStringIndex(s, -1) != nil {
		if m := reDigits.FindAllStringIndex(s, -1); len(m) == 1 && m[0][1] == len(s) && m[0][1]-m[0][0] == 1 {
			return s
		}
	}
	return reDigits.ReplaceAllString(s, "N")
}

// NormalizePath replaces what differs between runs in a path: pids in
// /proc, random and numbered components of temporary files.
func NormalizePath(p string) string {
	parts := strings.Split(p, "/")
	tmp := strings.HasPrefix(p, "/tmp/") || strings.HasPrefix(p, "/var/tmp/") || strings.HasPrefix(p, "/dev/shm/")
	for i, c := range parts {
		switch {
		case c == "":
		case i == 2 && parts[1] == "proc" && reDigits.MatchString(c) && reDigits.FindString(c) == c:
			parts[i] = "PID"
		case c == "self" || c == "thread-self":
		case reHexish.MatchString(c):
			parts[i] = "*"
		case tmp && i > 1 && isRandom(c):
			parts[i] = "*"
		default:
			parts[i] = reDigitRun(c)
		}
	}
	return strings.Join(parts, "/")
}

// reDigitRun replaces runs of 4 or more digits (seeds, pids, times) by N.
func reDigitRun(c string) string {
	return regexp.MustCompile(`[0-9]{4,}`).ReplaceAllString(c, "N")
}

// isRandom tells a temporary name (mkstemp's tmpa1B2c3, pytest-of-x-123)
// from a chosen one: a run of 6 or more letters and digits that mixes
// cases or letters and digits.
func isRandom(c string) bool {
	base := c
	if i := strings.LastIndexByte(base, '.'); i > 0 {
		base = base[:i]
	}
	for _, tok := range regexp.MustCompile(`[A-Za-z0-9]{6,}`).FindAllString(base, -1) {
		var lower, upper, digit bool
		for _, r := range tok {
			switch {
			case r >= 'a' && r <= 'z':
				lower = true
			case r >= 'A' && r <= 'Z':
				upper = true
			case r >= '0' && r <= '9':
				digit = true
			}
		}
		if digit && (lower || upper) || lower && upper {
			return true
		}
	}
	return false
}

// FixedPorts are the ports from 32768 up that connects, binds and listens
// name in two runs or more: a server's chosen port (gRPC's 50051), not an
// ephemeral one, which differs from run to run. NormalizeAddr alone
// made connect(127.0.0.1:50051) "127.0.0.1:*", on no resource, so a
// race on it had no port and no order.
func FixedPorts(runs []Run) map[string]bool {
	seen := map[string]int{}
	for _, r := range runs {
		in := map[string]bool{}
		for _, e := range r.Events {
			if e.Kind != "connect" && e.Kind != "bind" && e.Kind != "listen" || strings.HasPrefix(e.Addr, "unix:") {
				continue
			}
			i := strings.LastIndexByte(e.Addr, ':')
			if i < 0 {
				continue
			}
			if port, err := strconv.Atoi(e.Addr[i+1:]); err == nil && port >= 32768 && !in[e.Addr[i+1:]] {
				in[e.Addr[i+1:]] = true
				seen[e.Addr[i+1:]]++
			}
		}
	}
	out := map[string]bool{}
	for p, n := range seen {
		if n >= 2 {
			out[p] = true
		}
	}
	return out
}

// keepFixed is raw's normalised address norm, or raw itself when its
// port is one of fixed.
func keepFixed(raw, norm string, fixed map[string]bool) string {
	if len(fixed) == 0 || !strings.HasSuffix(norm, ":*") {
		return norm
	}
	if i := strings.LastIndexByte(raw, ':'); i >= 0 && fixed[raw[i+1:]] {
		return raw
	}
	return norm
}

// NormalizeAddr replaces an ephemeral port (the kernel's choice, 32768 and
// up, or 0 asked of bind) by "*"; a bind's port 0 is "*" too.
func NormalizeAddr(a string, bind bool) string {
	i := strings.LastIndexByte(a, ':')
	if i < 0 || strings.HasPrefix(a, "unix:") {
		if strings.HasPrefix(a, "unix:") {
			return "unix:" + NormalizePath(a[5:])
		}
		return a
	}
	port, err := strconv.Atoi(a[i+1:])
	if err != nil {
		return a
	}
	if port >= 32768 || port == 0 {
		return a[:i] + ":*"
	}
	return a
}

// resourceOf is what two socket calls share: the port (a bind to 0.0.0.0
// and a connect to 127.0.0.1 meet on it), or the unix path.
func resourceOf(a string) string {
	if strings.HasPrefix(a, "unix:") {
		return a
	}
	i := strings.LastIndexByte(a, ':')
	if i < 0 || strings.HasSuffix(a, ":*") {
		return ""
	}
	return "port " + a[i+1:]
}

// Timeline is a run's events as explain shows them: each normalised, at
// its time from the run's start, at most max of them (the first), and
// Cut says how many more there were.
func Timeline(r Run, max int) (evs []ExampleEvent, cut int) { return TimelineWith(r, max, nil) }

// TimelineWith is Timeline normalising as an analysis with its Ports does.
func TimelineWith(r Run, max int, fixed map[string]bool) (evs []ExampleEvent, cut int) {
	sel := Select(r)
	start := r.StartNs
	if start == 0 && len(sel) > 0 {
		start = sel[0].TimeNs
	}
	for _, e := range sel {
		key, _, ok := NormalizeWith(e, fixed)
		if !ok {
			continue
		}
		if len(evs) == max {
			cut++
			continue
		}
		evs = append(evs, ExampleEvent{AtMs: float64(e.TimeNs-start) / 1e6, Pid: e.Pid, Process: e.Process, Event: key})
	}
	return evs, cut
}
