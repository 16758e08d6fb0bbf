package flaky

import (
	"cmp"
	"fmt"
	"path"
	"strings"
)

// HuntDir is where the loop inside the sandbox keeps its state and evidence.
const HuntDir = "/work/.sbx-hunt"

// huntLoop is the path of the loop script inside the sandbox; attach finds
// the loop's exec by it.
const huntLoop = HuntDir + "/loop.sh"

// The loop's exit codes: a failure captured, the setup failed. 0 is "no run
// failed"; anything else is the loop itself breaking.
const (
	loopFailed      = 3
	loopSetupFailed = 4
	// loopCrashWrapper: --on-crash could not run a test (no gdb or
	// python3, or gdb gave no verdict); a line on stdout says why.
	loopCrashWrapper = 5
)

// runLines are the loop's lines that run the test once (run is its shell
// command) and leave its exit code in $code, and timedout=1 when it ran out
// of time. With a timeout (seconds) the test runs in the background (with
// SIGINT and SIGQUIT put back to their defaults, which a shell's & ignores)
// and a watchdog signals the loop when the time is up: if the test still
// runs, the run is a failure with exit 124, and its processes are left
// running for the evidence and the stop with memory. A watchdog that lost
// the race (its run ended first) names its run in $H/hung, so its late
// signal cannot count against a later run; any other USR1 (the test's own)
// only makes the loop wait again.
func runLines(run, timeout string) string {
	if timeout == "" {
		return "\t" + run + ` >"$H/run.out" 2>&1 </dev/null
	code=$?
	timedout=`
	}
	return "\t$SIGDFL " + run + ` >"$H/run.out" 2>&1 </dev/null &
	tp=$!
	hung=
	timedout=
	rm -f "$H/watchdog"
	( sleep ` + timeout + ` & echo $! >"$H/watchdog"; wait $! 2>/dev/null && echo "$i" >"$H/hung" && kill -USR1 $$ ) &
	wd=$!
	while :; do
		sig=
		wait $tp
		code=$?
		if [ -n "$hung" ] && running $tp; then
			code=124
			timedout=1
			break
		fi
		# a signal cut the wait short: wait again (for the test's own status)
		[ -n "$sig" ] && [ $code -gt 128 ] && continue
		break
	done
	if [ -z "$timedout" ]; then
		until [ -s "$H/watchdog" ] || ! kill -0 $wd 2>/dev/null; do sleep 0.01; done
		kill "$(cat "$H/watchdog" 2>/dev/null)" 2>/dev/null
	fi
	wait $wd 2>/dev/null`
}

// maxStacks is how many leaked processes get a gdb stack, two at a time:
// a test that leaks a worker pool must not start a gdb per worker at once
// (each can take hundreds of MiB, and the sandbox has a memory limit).
const maxStacks = 8

// The lines the loop prints on its stdout, one per step; everything the test
// and setup print goes to files instead, so the lines cannot be mixed up.
const (
	lineRun      = "sbx-hunt: run"      // "sbx-hunt: run N seed S exit E"
	lineFailed   = "sbx-hunt: failed"   // "sbx-hunt: failed N seed S exit E time T"
	lineCaptured = "sbx-hunt: captured" // the evidence is in HuntDir
)

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:@%+,") == "" {
		return s // nothing the shell would read differently
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// collectPaths makes the --collect paths absolute (relative ones are in
// /work) and clean, so that each names its place under collected/.
func collectPaths(ps []string) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		if !path.IsAbs(p) {
			p = path.Join("/work", p)
		}
		out[i] = path.Clean(p)
	}
	return out
}

func shellJoin(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = shellQuote(a)
	}
	return strings.Join(q, " ")
}

// crashDir is where --on-crash's wrapper lives inside the sandbox; the
// bundle of a crashed run is its bundle/ folder (see crash.go).
const crashDir = HuntDir + "/crash"

// loopConfig is what the loop script is made from.
type loopConfig struct {
	setup   string
	runs    int
	seedEnv string
	test    []string
	collect []string
	// onCrash runs each run under crashDir/run.sh (gdb), which leaves a
	// bundle when the test's process dies of a fatal signal.
	onCrash bool
	// listenWait, in seconds, replaces the const listenWait (for tests).
	listenWait string
	// timeout, in seconds ("" for none), makes a run that lasts longer a
	// failure, captured while it hangs: its processes are left alone.
	timeout string
	// user, if set, runs the setup and the test (the loop itself, and the
	// evidence, run as root: gdb attaches to any process the test left).
	user string
}

// listenWait is how long after a failure the loop keeps looking for the
// leaked processes' listeners: a leaked server may still be starting (often
// the very reason the test failed), and its listener is the evidence.
const listenWait = "1.5"

// loopScript is the POSIX shell loop run inside the sandbox by a detached
// exec, so it goes on when the client goes away. It runs setup once, then
// the test up to runs times, each with a fresh seed in seedEnv. On the first
// failure it writes the marker HuntDir/failed at once, then records the
// evidence (before anything else runs) and exits loopFailed. Processes a
// passing run leaves behind are killed before the next run, so that runs do
// not see each other (a leaked server would make every later run pass).
//
// The evidence is quick because it is parallel: after the process forest
// (taken first, so that it shows the evidence tools least), the listeners,
// each leaked process's open files and its stack (gdb) are read at once;
// only reads, so they do not disturb one another beyond gdb's brief stop of
// the process it reads. Then, if a leaked process does not listen yet, the
// listeners are read again when it does, or listenWait seconds after the
// failure at the latest.
func loopScript(c loopConfig) string {
	var b strings.Builder
	fmt.Fprintf(&b, `#!/bin/sh
# written by sbx hunt: loops the test until it fails, then records the evidence
H=%s
CR=%s
mkdir -p "$H"
cd /work 2>/dev/null || cd /
# the processes now; a run's new ones are those of pids.after not in
# pids.before (grep -vxF: busybox has no comm)
pids() { for p in /proc/[0-9]*; do echo "${p#/proc/}"; done; }
# newpids: those of pids.after not in pids.before, the loop itself aside; none
# when pids.before could not be written (else every process would be new)
newpids() {
	[ -s "$H/pids.before" ] || return 0
	grep -vxF -f "$H/pids.before" "$H/pids.after" | grep -vx "$$"
}
step() { echo "$(now) $1" >>"$H/steps.log"; }
# busybox's date has no %%N: the agent then reads the clock
now() { t=$(date +%%s.%%N 2>/dev/null); case "$t" in *N*|"") /.sbx/sbx-agent now 2>/dev/null || date +%%s ;; *) echo "$t" ;; esac; }
# before T: whether the clock is still before T (seconds since the epoch)
before() { awk -v t="$1" -v n="$(now)" 'BEGIN { exit !(n < t) }'; }
listeners() {
	echo "# $1: ss -ltnp"
	ss -ltnp 2>&1
	echo "# lsof -iTCP -sTCP:LISTEN -P -n"
	timeout 10 lsof -b -w -iTCP -sTCP:LISTEN -P -n 2>&1
}
# all_listen [TEXT]: whether every leaked process still alive has a
# listening socket in TEXT (an ss -ltnp output; by default one read now)
all_listen() {
	if [ $# -gt 0 ]; then l=$1; else l=$(ss -ltnp 2>/dev/null) || return 0; fi
	for p in $(cat "$H/leaked-pids.txt"); do
		[ -d "/proc/$p" ] || continue
		case $l in *"pid=$p,"*) ;; *) return 1 ;; esac
	done
	return 0
}
# stacks LANE: gdb stacks of the first %d leaked processes, those of one
# lane of two, one at a time
stacks() {
	command -v gdb >/dev/null 2>&1 || return 0
	n=0
	for p in $(head -n %d "$H/leaked-pids.txt"); do
		n=$((n + 1))
		[ $((n %% 2)) -eq "$1" ] && [ -d "/proc/$p" ] || continue
		DEBUGINFOD_URLS= timeout 30 gdb -batch -iex 'set debuginfod enabled off' -p "$p" -ex 'thread apply all bt' >"$H/stack-$p.txt" 2>&1 </dev/null
	done
}
`, shellQuote(HuntDir), shellQuote(crashDir), maxStacks, maxStacks)
	asUser := ""
	if c.user != "" {
		asUser = "/.sbx/sbx-agent exec --user " + shellQuote(c.user) + " -- "
	}
	run := asUser + "env " + c.seedEnv + `="$seed" ` + shellJoin(c.test)
	crashCheck, pre := "", ""
	if c.onCrash {
		// the wrapper failing is not the test failing
		crashCheck = fmt.Sprintf(`
	if read -r kind why <"$CR/status" 2>/dev/null && [ "$kind" = error ]; then
		echo "sbx-hunt: --on-crash could not run the test: $why (see $CR/gdb.log)"
		exit %d
	fi`, loopCrashWrapper)
		fmt.Fprintf(&b, `if ! command -v gdb >/dev/null 2>&1 || ! command -v python3 >/dev/null 2>&1; then
	echo "sbx-hunt: --on-crash needs gdb and python3 in the sandbox (the base template has them)"
	exit %d
fi
`, loopCrashWrapper)
		pre = "\trm -rf \"$CR/bundle\" \"$CR/status\"\n"
		run = asUser + "env " + c.seedEnv + `="$seed" /bin/sh "$CR/run.sh" ` + shellJoin(c.test)
	}
	if c.setup != "" {
		fmt.Fprintf(&b, `echo "sbx-hunt: setup"
%s/bin/sh -c %s >"$H/setup.out" 2>&1
code=$?
if [ $code -ne 0 ]; then echo "sbx-hunt: setup failed exit $code"; exit %d; fi
`, asUser, shellQuote(c.setup), loopSetupFailed)
	}
	if c.timeout != "" {
		b.WriteString(`# a watchdog's USR1: the run it names is the one under way, or a stale one
on_watchdog() {
	sig=1
	read -r hr <"$H/hung" 2>/dev/null
	[ "$hr" != "$i" ] || hung=1
}
trap on_watchdog USR1
# running PID: whether PID is alive and not a zombie (one that ended as the
# watchdog fired has its own exit code)
running() {
	read -r st <"/proc/$1/stat" 2>/dev/null || return 1
	st=${st##*) }
	[ "${st%% *}" != Z ]
}
# the test runs in the background; & leaves SIGINT and SIGQUIT ignored, and
# a test must see them as it would in the foreground
if env --default-signal=INT true 2>/dev/null; then
	SIGDFL="env --default-signal=INT,QUIT"
elif [ -x /.sbx/sbx-agent ]; then
	SIGDFL="/.sbx/sbx-agent sigdfl --"
else
	SIGDFL=
fi
`)
	}
	fmt.Fprintf(&b, `i=0
while [ $i -lt %d ]; do
	i=$((i + 1))
	seed=$(od -An -N4 -tu4 /dev/urandom | tr -d ' \n')
	pids >"$H/pids.before"
	echo "$i" >"$H/current"
%s%s
	if [ $code -ne 0 ]; then
		t=$(now)
		printf 'run=%%s\nseed=%%s\nexit=%%s\ntime=%%s\n' "$i" "$seed" "$code" "$t" >"$H/failed"
		[ -z "$timedout" ] || echo "timedout=1" >>"$H/failed"
		echo "sbx-hunt: failed $i seed $seed exit $code time $t"
		pids >"$H/pids.after"
		cp "$H/run.out" "$H/test-output.txt"
		newpids >"$H/leaked-pids.txt"
		step processes
		ps -eo pid,ppid,etime,args --forest >"$H/processes.txt" 2>&1 || ps >"$H/processes.txt" 2>&1
		step evidence
		# the evidence jobs are waited for by pid: a hung test is a child too
		listeners "at the failure" >"$H/listening.txt" &
		jobs_=$!
		for p in $(cat "$H/leaked-pids.txt"); do
			[ -d "/proc/$p" ] || continue
			echo "$p $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)" >>"$H/leaked.txt"
			{
				echo "# ls -l /proc/$p/fd"
				ls -l "/proc/$p/fd" 2>&1
				echo "# lsof -b -w -n -P -p $p"
				timeout 10 lsof -b -w -n -P -p "$p" 2>&1
			} >"$H/files-$p.txt" &
			jobs_="$jobs_ $!"
		done
		stacks 0 &
		jobs_="$jobs_ $!"
		stacks 1 &
		wait $jobs_ $!
		step "evidence read"
		# a leaked process the first look did not see listening: look again
		# when it does, or at the deadline
		if [ -s "$H/leaked-pids.txt" ] && ! all_listen "$(cat "$H/listening.txt")"; then
			until all_listen || ! before "$(awk -v t="$t" 'BEGIN { printf "%%.3f", t + %s }')"; do sleep 0.1; done
			listeners "again at $(now), waiting for the leaked processes to listen" >>"$H/listening.txt"
			step "listeners again"
		fi
`, c.runs, pre+runLines(run, c.timeout), crashCheck, cmp.Or(c.listenWait, listenWait))
	if len(c.collect) > 0 {
		// each path keeps its place: /work/logs is collected/work/logs, so
		// two paths with one base name do not land on each other
		b.WriteString("\t\tfor c in " + shellJoin(collectPaths(c.collect)) + "; do\n" +
			"\t\t\tmkdir -p \"$H/collected$(dirname \"$c\")\" && cp -a \"$c\" \"$H/collected$c\" >>\"$H/collect.log\" 2>&1 || echo \"collect $c failed\" >>\"$H/collect.log\"\n" +
			"\t\tdone\n")
	}
	fmt.Fprintf(&b, `		step captured
		touch "$H/captured"
		echo "sbx-hunt: captured"
		exit %d
	fi
	echo "sbx-hunt: run $i seed $seed exit 0"
	# each run starts clean: what a passing run left behind is killed
	pids >"$H/pids.after"
	for p in $(newpids); do kill -9 "$p" 2>/dev/null; done
done
touch "$H/nofailure"
echo "sbx-hunt: no failure in $i runs"
exit 0
`, loopFailed)
	return b.String()
}
