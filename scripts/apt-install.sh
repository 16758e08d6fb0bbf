#!/usr/bin/env bash
# apt-install.sh PKG...: apt-get update and install PKG..., waiting for apt's
# locks (another apt, unattended-upgrades) up to $APT_LOCK_WAIT seconds
# (default 300), and saying so. $APT_GET replaces apt-get (the tests' fake).
set -uo pipefail
apt_get=${APT_GET:-apt-get}
wait=${APT_LOCK_WAIT:-300}
start=$(date +%s)
said=""

# apt_retry CMD...: run CMD, again while it fails only because apt is locked,
# until the wait is spent.
apt_retry() {
	local out code left
	while :; do
		left=$(( wait - ($(date +%s) - start) ))
		(( left < 0 )) && left=0
		# dpkg's own lock is waited for by apt itself (DPkg::Lock::Timeout);
		# the lists and archives locks are not, hence the loop
		out=$("$@" -o DPkg::Lock::Timeout="$left" 2>&1)
		code=$?
		if (( code == 0 )); then
			return 0
		fi
		if ! grep -q 'Could not get lock' <<<"$out"; then
			printf '%s\n' "$out" >&2
			return "$code"
		fi
		if (( left == 0 )); then
			printf '%s\n' "$out" >&2
			echo "==> apt is still locked after ${wait}s; let the other apt finish (or set APT_LOCK_WAIT=SECONDS) and run make again" >&2
			return "$code"
		fi
		if [[ -z $said ]]; then
			holder=$(grep -o 'held by process [0-9]* ([^)]*)' <<<"$out" | head -1)
			echo "==> apt is busy (${holder:-another apt}); waiting for its lock, up to ${wait}s" >&2
			said=1
		fi
		sleep 2
	done
}

apt_retry "$apt_get" update -qq || exit
DEBIAN_FRONTEND=noninteractive apt_retry "$apt_get" install -y -qq "$@" || exit
