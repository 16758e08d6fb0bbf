#!/usr/bin/env bash
# Removes what an interrupted e2e run left: its sbxd daemons (data dirs
# under $TMPDIR/sbx-e2e-*), their sandboxes, namespaces, rules and dirs.
set -u
cd "$(dirname "$0")/.."
for dir in "${TMPDIR:-/tmp}"/sbx-e2e-*; do
	[ -d "$dir" ] || continue
	pids=$(pgrep -f -- "--data-dir $dir ")
	tag=$(ps -o args= $pids 2>/dev/null | sed -n 's/.*--tag \([a-z0-9]*\).*/\1/p' | head -1)
	if [ -n "$pids" ]; then
		for id in $(SBX_HOST=unix://$dir/sbxd.sock ./bin/sbx list --json 2>/dev/null | grep -o '"id":"sb_[a-z0-9]*"' | cut -d'"' -f4); do
			SBX_HOST=unix://$dir/sbxd.sock ./bin/sbx delete --yes "$id" >/dev/null
		done
		kill $pids; sleep 0.5
	fi
	for id in $(./bin/runsc --root "$dir/runsc" list -quiet 2>/dev/null); do ./bin/runsc --root "$dir/runsc" delete -force "$id"; done
	# The records are moot once runsc has no sandbox left; then the rules go.
	rm -f "$dir"/state.db*
	if [ -n "$tag" ]; then ./bin/sbxd --data-dir "$dir" --tag "$tag" --cleanup; fi
	rm -f "$dir/templates"; rm -rf "$dir"
	echo "cleaned $dir"
done
# Raw runsc sandboxes of interrupted benchmarks.
for root in "${TMPDIR:-/tmp}"/Benchmark*/*/root; do
	[ -d "$root" ] || continue
	for id in $(./bin/runsc --root "$root" list -quiet 2>/dev/null); do ./bin/runsc --root "$root" delete -force "$id"; done
done
rm -rf "${TMPDIR:-/tmp}"/Benchmark*
for ns in $(ip netns list | awk '/^e2e-/{print $1}'); do ip netns del "$ns"; done
# The links the hostile tests add to the root namespace for an extra address.
for l in $(ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | grep '^e2ed'); do ip link del "$l"; done
