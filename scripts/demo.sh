#!/usr/bin/env bash
# The sbx demo: start sbxd on the default data dir and socket, build the
# base template, and walk one sandbox through its life, saying what it does.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$PWD/bin
SOCK=${SBX_DEMO_SOCKET:-/run/sbx/sbxd.sock}
DATA=${SBX_DEMO_DATA:-/var/lib/sbx}
export SBX_HOST=unix://$SOCK

bold=$(tput bold 2>/dev/null || true); dim=$(tput dim 2>/dev/null || true); off=$(tput sgr0 2>/dev/null || true)
say()  { printf '\n%s==> %s%s\n' "$bold" "$*" "$off"; }
run()  { printf '%s$ %s%s\n' "$dim" "$*" "$off"; "$@"; }

started=""
sandbox=""
work=$(mktemp -d)
cleanup() {
	set +e
	if [ -n "$sandbox" ]; then say "Cleaning up: deleting $sandbox"; "$BIN/sbx" delete --yes "$sandbox" >/dev/null; fi
	if [ -n "$started" ]; then
		say "Stopping the sbxd this demo started, and removing its firewall rules"
		kill -TERM "$started"; wait "$started" 2>/dev/null
		"$BIN/sbxd" --data-dir "$DATA" --cleanup
	fi
	rm -rf "$work"
}
trap cleanup EXIT

if "$BIN/sbx" list >/dev/null 2>&1; then
	say "Using the sbxd already serving $SOCK"
else
	say "Starting sbxd (data in $DATA, API on $SOCK; log in $work/sbxd.log)"
	"$BIN/sbxd" --data-dir "$DATA" --socket "$SOCK" >"$work/sbxd.log" 2>&1 &
	started=$!
	for _ in $(seq 100); do "$BIN/sbx" list >/dev/null 2>&1 && break; sleep 0.1; done
	"$BIN/sbx" list >/dev/null || { cat "$work/sbxd.log"; exit 1; }
fi

say "Building the base template (Debian bookworm; cached after the first time)"
run "$BIN/sbx" template build base
run "$BIN/sbx" template ls

say "Creating a sandbox from base: a gVisor sandbox with its own network namespace"
printf '%s$ sbx new --template base --name demo-%s%s\n' "$dim" "$$" "$off"
sandbox=$("$BIN/sbx" new --template base --name "demo-$$")
echo "$sandbox"
run "$BIN/sbx" info "$sandbox"

say "Running commands inside it: the kernel is gVisor's, the tools are Debian's"
run "$BIN/sbx" exec "$sandbox" -- uname -a
run "$BIN/sbx" exec "$sandbox" -- python3 -c 'import os, platform; print("python", platform.python_version(), "as uid", os.getuid())'
run "$BIN/sbx" exec "$sandbox" -- 'echo "made inside at $(date -u +%T)" > /tmp/note.txt; ls -l /tmp/note.txt'

say "A timeout the platform enforces: the command and its children are killed, exit 124"
set +e
run "$BIN/sbx" exec "$sandbox" --timeout 1s -- sleep 60
echo "exit code: $?"
set -e

say "A detached command whose output is kept, read back later"
exec_id=$("$BIN/sbx" exec "$sandbox" --detach -- sh -c 'for i in 1 2 3; do echo tick $i; sleep 0.3; done' | cut -d' ' -f1)
run "$BIN/sbx" logs "$sandbox" --exec "$exec_id" --follow
run "$BIN/sbx" ps "$sandbox"

say "Copying a file out of the sandbox and back in"
run "$BIN/sbx" scp "$sandbox:/tmp/note.txt" "$work/note.txt"
run cat "$work/note.txt"
echo "edited on the host" >> "$work/note.txt"
run "$BIN/sbx" scp "$work/note.txt" "$sandbox:/root/note.txt"
run "$BIN/sbx" exec "$sandbox" -- cat /root/note.txt
run "$BIN/sbx" fs ls "$sandbox" /root

say "A process with state in memory: a tiny server holding a random token and a hit counter"
"$BIN/sbx" exec "$sandbox" -- sh -c 'cat > /root/server.py <<EOF
import http.server, json, os, secrets
TOKEN, HITS = secrets.token_hex(4), 0
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global HITS
        HITS += 1
        body = json.dumps({"token": TOKEN, "hits": HITS, "pid": os.getpid()}).encode()
        self.send_response(200); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", 8080), H).serve_forever()
EOF'
run "$BIN/sbx" exec "$sandbox" --detach -- python3 /root/server.py
hit() { "$BIN/sbx" exec "$1" -- curl -s --retry 20 --retry-connrefused --retry-delay 0 http://127.0.0.1:8080/; echo; }
run hit "$sandbox"
run hit "$sandbox"

say "Stop with memory: the sandbox is gone from the host, its processes kept in an image"
run "$BIN/sbx" stop "$sandbox" --wait
say "Resume: the same pid answers with the same token, and the counter carries on"
run "$BIN/sbx" resume "$sandbox"
run hit "$sandbox"

say "Fork it three ways with its memory: each child carries on the same process"
kids=$("$BIN/sbx" fork "$sandbox" --memory --count 3 --wait | grep -o 'sb_[a-z2-7]\{10\}' | sort -u)
for k in $kids; do run hit "$k"; done
for k in $kids; do "$BIN/sbx" delete --yes "$k" >/dev/null; done

say "Done. The sandbox is deleted next; templates stay cached in $DATA/templates."
