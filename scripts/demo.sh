#!/usr/bin/env bash
# The sbx demo: chase a flaky test. Start sbxd on the default data dir and
# socket, build the base template, then hunt the failure of a bundled flaky
# test, look at the evidence, resume the frozen machine with the leaked
# service alive, measure the flake rate with forks, replay the failing seed,
# and show the fixed test passing every time. It cleans up after itself.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BIN=$ROOT/bin
SOCK=${SBX_DEMO_SOCKET:-/run/sbx/sbxd.sock}
DATA=${SBX_DEMO_DATA:-/var/lib/sbx}
export SBX_HOST=unix://$SOCK
sbx() { "$BIN/sbx" "$@"; }

bold=$(tput bold 2>/dev/null || true); dim=$(tput dim 2>/dev/null || true); off=$(tput sgr0 2>/dev/null || true)
say() { printf '\n%s==> %s%s\n' "$bold" "$*" "$off"; }
run() { printf '%s$ %s%s\n' "$dim" "$*" "$off"; "$@"; }

started=""
name="demo-hunt-$$"
work=$(mktemp -d)
cleanup() {
	set +e
	say "Cleaning up: the hunt's sandbox, its fork and snapshot, and the local evidence"
	sbx delete --yes --with-snapshots "$name" >/dev/null 2>&1
	sbx delete --yes "$name-fork" >/dev/null 2>&1
	if [ -n "$started" ]; then
		say "Stopping the sbxd this demo started, and removing its firewall rules"
		kill -TERM "$started"; wait "$started" 2>/dev/null
		"$BIN/sbxd" --data-dir "$DATA" --cleanup
	fi
	rm -rf "$work"
}
trap cleanup EXIT

if sbx list >/dev/null 2>&1; then
	say "Using the sbxd already serving $SOCK"
else
	say "Starting sbxd (data in $DATA, API on $SOCK; log in $work/sbxd.log)"
	"$BIN/sbxd" --data-dir "$DATA" --socket "$SOCK" >"$work/sbxd.log" 2>&1 &
	started=$!
	for _ in $(seq 100); do sbx list >/dev/null 2>&1 && break; sleep 0.1; done
	sbx list >/dev/null || { cat "$work/sbxd.log"; exit 1; }
fi

say "Building the base template (Debian bookworm with python3, curl, gdb, lsof; cached after the first time)"
run sbx template build base

say "The flaky test: it starts a service, sleeps a fixed 0.6 s instead of waiting until it listens, and never stops it"
cp -r "$ROOT/examples/flaky" "$work/project"
sed -n '6,$p' "$work/project/test.sh"

say "Hunt: copy the project into a sandbox and loop the test inside until it fails, then keep the evidence"
cd "$work/project"
run sbx hunt --template base --runs 20 --name "$name" --out "$work/evidence" -- ./test.sh
cd "$ROOT"

failed=$(find "$work/evidence" -name failed -type f | head -1)
seed=$(sed -n 's/^seed=//p' "$failed")
say "The evidence, taken inside the sandbox the moment the run failed (seed $seed)"
out=$(find "$work/evidence" -name test-output.txt | head -1)
run grep -m1 -i "refused" "$out"
listen=$(find "$work/evidence" -name listening.txt | head -1)
printf '%s$ grep 8765 %s%s\n' "$dim" "$(basename "$listen")" "$off"
grep -m2 8765 "$listen" || true

say "The machine was stopped with its memory: resume it, and the leaked service is still there, counting"
run sbx resume "$name"
run sbx exec "$name" -- curl -s http://127.0.0.1:8765/
run sbx exec "$name" -- curl -s http://127.0.0.1:8765/

say "The true flake rate: 20 memory forks of the captured state, one run each, each with its own seed"
run sbx flake-rate --from "$name" -n 20 --parallel 4 -- 'cd /work && ./test.sh'

say "Replay the failing seed, each run in a fresh sandbox from the snapshot"
run sbx replay "$name" --seed "$seed" -n 5 -- 'cd /work && ./test.sh'

say "The fixed test waits until the service listens, and stops it: it passes every time"
sed -n '/until\|while\|for /,/done/p' "$work/project/test_fixed.sh" | head -6
run sbx flake-rate --from "$name" -n 10 --parallel 4 -- 'cd /work && ./test_fixed.sh'

say "Done: a failure caught, frozen with its processes, measured, replayed and fixed."
