#!/usr/bin/env bash
# fleet.sh: a local sbx fleet on loopback (issue 24).
#
#   scripts/fleet.sh up DIR     start etcd, kube-apiserver and the OCI registry,
#                               each with its state in DIR; write DIR/env
#   scripts/fleet.sh down DIR   stop all of it; DIR keeps only its logs
#
# DIR/env holds KUBECONFIG=... and REGISTRY=...: `. DIR/env; kubectl get ns`.
# The binaries come from `make fleet-tools` (bin/.fleet-dir names them).
# What is not here yet: the controller and the sbxd node agents (the
# issue's NODES argument); this brings up the control plane they run on.
set -euo pipefail

say() { echo "fleet: $*" >&2; }
die() { say "$*"; exit 1; }

here=$(cd "$(dirname "$0")/.." && pwd)

tools() {
	local f="$here/bin/.fleet-dir"
	[ -r "$f" ] || die "no control plane built: run make fleet-tools first"
	local dir
	dir=$(cat "$f")
	for b in etcd kube-apiserver kubectl registry; do
		[ -x "$dir/$b" ] || die "$dir/$b is missing: run make fleet-tools"
	done
	echo "$dir"
}

# freeport prints a TCP port free on 127.0.0.1 now.
freeport() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# waitfor waits up to $2 seconds for command $1 (a string) to succeed.
waitfor() {
	local i
	for i in $(seq 1 $(($2 * 10))); do
		if eval "$1" >/dev/null 2>&1; then return 0; fi
		sleep 0.1
	done
	return 1
}

# start NAME CMD...: starts CMD in its own process group, logs in DIR/NAME.log,
# pid in DIR/NAME.pid.
start() {
	local name=$1
	shift
	setsid "$@" >"$dir/$name.log" 2>&1 </dev/null &
	echo $! >"$dir/$name.pid"
}

up() {
	dir=$1
	local bin
	bin=$(tools)
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	[ -e "$dir/env" ] && die "$dir holds a fleet already: scripts/fleet.sh down $dir first"
	mkdir -p "$dir/etcd" "$dir/pki" "$dir/registry"
	chmod 700 "$dir/pki"

	local etcd_client etcd_peer api reg
	etcd_client=$(freeport)
	etcd_peer=$(freeport)
	api=$(freeport)
	reg=$(freeport)

	say "etcd on 127.0.0.1:$etcd_client"
	start etcd "$bin/etcd" --data-dir "$dir/etcd" --name fleet \
		--listen-client-urls "http://127.0.0.1:$etcd_client" --advertise-client-urls "http://127.0.0.1:$etcd_client" \
		--listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
		--initial-cluster "fleet=http://127.0.0.1:$etcd_peer" --log-level warn
	waitfor "curl -sf http://127.0.0.1:$etcd_client/health" 30 || die "etcd did not come up: $dir/etcd.log"

	# the apiserver's credentials: a token for the fleet's admin, and the
	# service accounts' signing key
	local token
	token=$(head -c 24 /dev/urandom | base64 | tr -d '/+=' | cut -c1-32)
	echo "$token,sbx-admin,sbx-admin,system:masters" >"$dir/pki/tokens.csv"
	openssl genrsa -out "$dir/pki/sa.key" 2048 2>/dev/null
	openssl rsa -in "$dir/pki/sa.key" -pubout -out "$dir/pki/sa.pub" 2>/dev/null

	say "kube-apiserver on 127.0.0.1:$api"
	start kube-apiserver "$bin/kube-apiserver" \
		--etcd-servers "http://127.0.0.1:$etcd_client" \
		--bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api" \
		--cert-dir "$dir/pki" --token-auth-file "$dir/pki/tokens.csv" \
		--authorization-mode RBAC \
		--service-account-key-file "$dir/pki/sa.pub" --service-account-signing-key-file "$dir/pki/sa.key" \
		--service-account-issuer https://kubernetes.default.svc \
		--service-cluster-ip-range 10.96.0.0/16 \
		--endpoint-reconciler-type none --disable-admission-plugins ServiceAccount
	cat >"$dir/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: fleet
  cluster:
    server: https://127.0.0.1:$api
    insecure-skip-tls-verify: true
users:
- name: sbx-admin
  user:
    token: $token
contexts:
- name: fleet
  context:
    cluster: fleet
    user: sbx-admin
current-context: fleet
EOF
	chmod 600 "$dir/kubeconfig"
	waitfor "'$bin/kubectl' --kubeconfig '$dir/kubeconfig' get --raw /readyz" 60 ||
		die "kube-apiserver did not come up: $dir/kube-apiserver.log"

	say "registry on 127.0.0.1:$reg"
	cat >"$dir/registry.yml" <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $dir/registry
  delete:
    enabled: true
http:
  addr: 127.0.0.1:$reg
EOF
	start registry "$bin/registry" serve "$dir/registry.yml"
	waitfor "curl -sf http://127.0.0.1:$reg/v2/" 30 || die "the registry did not come up: $dir/registry.log"

	cat >"$dir/env" <<EOF
KUBECONFIG=$dir/kubeconfig
REGISTRY=127.0.0.1:$reg
export KUBECONFIG REGISTRY
EOF
	say "up: . $dir/env"
}

down() {
	dir=$1
	[ -d "$dir" ] || die "no fleet in $dir"
	local name pid
	for name in registry kube-apiserver etcd; do
		[ -r "$dir/$name.pid" ] || continue
		pid=$(cat "$dir/$name.pid")
		if kill -0 "$pid" 2>/dev/null; then
			kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
			for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
			kill -KILL -- "-$pid" 2>/dev/null || true
		fi
		rm -f "$dir/$name.pid"
	done
	rm -rf "$dir/etcd" "$dir/pki" "$dir/registry" "$dir/env" "$dir/kubeconfig" "$dir/registry.yml"
	say "down: $dir holds only its logs"
}

case "${1:-}" in
up) [ $# -ge 2 ] || die "usage: scripts/fleet.sh up DIR"; up "$2" ;;
down) [ $# -ge 2 ] || die "usage: scripts/fleet.sh down DIR"; down "$2" ;;
*) die "usage: scripts/fleet.sh up DIR | down DIR" ;;
esac
