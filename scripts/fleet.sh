#!/usr/bin/env bash
# fleet.sh: a local sbx fleet on loopback (issue 24).
#
#   scripts/fleet.sh up DIR [NODES]  start etcd, kube-apiserver and the OCI
#                               registry, apply deploy/crds, start NODES
#                               sbxd node agents (default 2), each with its
#                               state in DIR, and sbx-controller; write DIR/env
#   scripts/fleet.sh down DIR   delete the nodes' sandboxes, stop all of it and
#                               remove what sbxd made on the host (namespaces,
#                               SBX-TAG-* chains, cgroups); DIR keeps only logs
#   scripts/fleet.sh node DIR NAME
#                               start node NAME's sbxd again (after it was
#                               killed), with the flags it had
#   scripts/fleet.sh controller DIR
#                               start the controller again (after it was
#                               killed), on the same port
#
# DIR/env holds KUBECONFIG (the fleet admin's), REGISTRY, SBX_HOST and
# SBX_TOKEN (the controller's API token), and SBX_NODE1 with its own
# SBX_NODE1_TOKEN (each node has its own; DIR/NODE/token):
# `. DIR/env; kubectl get sandboxnodes; sbx new --template tiny`.
# SBX_HOST is the fleet's one endpoint, the controller (SBX_CONTROLLER too):
# creates are placed on a node, and a sandbox's requests go on to its node;
# templates are a node's (sbx --host tcp://NODE-ADDRESS template build).
# DIR/nodes lists the nodes, one a line: NAME TAG SOCKET TCP-ADDRESS.
# The control plane comes from `make fleet-tools` (bin/.fleet-dir names it);
# sbxd, sbx, runsc and sbx-agent from `make build` (this checkout's bin/).
# SBX_FLEET_TEMPLATES: a template cache the nodes share (default
# DIR/templates, which down removes); SBX_FLEET_SBXD_FLAGS: more flags for
# every sbxd.
set -euo pipefail

say() { echo "fleet: $*" >&2; }
die() {
	say "$*"
	exit 1
}

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

# freeport prints a TCP port free on 127.0.0.1 now, and never one it
# printed before for this fleet (DIR/.ports): the kernel may hand the port
# it just freed out again, and etcd's client and peer ports met so once.
freeport() {
	local p
	while :; do
		p=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()')
		grep -qx "$p" "$dir/.ports" 2>/dev/null && continue
		echo "$p" >>"$dir/.ports"
		echo "$p"
		return
	done
}

# randtag prints 4 random characters of [a-z0-9]: a node's sbxd tag.
randtag() {
	local t=""
	while [ ${#t} -lt 4 ]; do t="$t$(head -c 64 /dev/urandom | tr -dc 'a-z0-9')"; done
	echo "${t:0:4}"
}

# newtoken prints 32 random characters of [A-Za-z0-9].
newtoken() {
	local t=""
	while [ ${#t} -lt 32 ]; do t="$t$(head -c 48 /dev/urandom | base64 -w0 | tr -d '/+=')"; done
	echo "${t:0:32}"
}

# nodetoken prints node $1's TCP token: HMAC-SHA256 of its name under the
# fleet's key (DIR/pki/node-token-key), in hex, as sbx-controller
# --node-token-key derives it.
nodetoken() {
	printf '%s' "$1" | openssl dgst -sha256 -hmac "$(cat "$dir/pki/node-token-key")" -r | cut -d' ' -f1
}

# kubeconfig FILE TOKEN writes a kubeconfig for the fleet's apiserver
# (DIR/apiserver.port) with bearer token TOKEN; its namespace is the
# fleet's, so a bare `kubectl get sandboxes` shows them.
kubeconfig() {
	cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: fleet
  cluster:
    server: https://127.0.0.1:$(cat "$dir/apiserver.port")
    insecure-skip-tls-verify: true
users:
- name: fleet-user
  user:
    token: $2
contexts:
- name: fleet
  context:
    cluster: fleet
    user: fleet-user
    namespace: sbx-system
current-context: fleet
EOF
	chmod 600 "$1"
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

# stoppid ends the process group whose leader's pid is in file $1: TERM,
# then KILL after 10 s.
stoppid() {
	local pidf=$1 pid
	[ -r "$pidf" ] || return 0
	pid=$(cat "$pidf")
	if kill -0 "$pid" 2>/dev/null; then
		kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
		for _ in $(seq 1 100); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL -- "-$pid" 2>/dev/null || true
	fi
	rm -f "$pidf"
}

up() {
	dir=$1
	local nodes=$2
	case "$nodes" in '' | *[!0-9]*) die "NODES: want a number, got '$nodes'" ;; esac
	[ "$nodes" -le 15 ] || die "NODES: at most 15 (node N has the address pool 10.(240+N).0.0/16)"
	local bin b
	bin=$(tools)
	if [ "$nodes" -gt 0 ]; then
		for b in sbxd sbx-shim sbx runsc sbx-agent sbx-reaper; do
			[ -x "$here/bin/$b" ] || die "$here/bin/$b is missing: run make build"
		done
	fi
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	[ -e "$dir/env" ] && die "$dir holds a fleet already: scripts/fleet.sh down $dir first"
	rm -f "$dir/.ports"
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

	# the apiserver's credentials: a token for the fleet's admin, one for
	# the controller (sbx:controller) and one for each node (sbx:node:NAME
	# in sbx:nodes, which deploy/rbac narrows to its own objects), and the
	# service accounts' signing key
	local token ctoken i
	token=$(newtoken)
	ctoken=$(newtoken)
	{
		echo "$token,sbx-admin,sbx-admin,system:masters"
		echo "$ctoken,sbx:controller,sbx-controller,sbx:controllers"
		for i in $(seq 1 "$nodes"); do
			echo "$(newtoken),sbx:node:node-$i,sbx-node-$i,sbx:nodes"
		done
	} >"$dir/pki/tokens.csv"
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
	echo "$api" >"$dir/apiserver.port"
	kubeconfig "$dir/kubeconfig" "$token"
	kubeconfig "$dir/pki/controller.kubeconfig" "$ctoken"
	for i in $(seq 1 "$nodes"); do
		mkdir -p "$dir/node-$i"
		kubeconfig "$dir/node-$i/kubeconfig" "$(grep -F ",sbx:node:node-$i," "$dir/pki/tokens.csv" | cut -d, -f1)"
	done
	local kubectl=("$bin/kubectl" --kubeconfig "$dir/kubeconfig")
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

	say "the sbx.dev CRDs and the sbx-system namespace"
	"${kubectl[@]}" apply -f "$here/deploy/crds/" >/dev/null || die "cannot apply deploy/crds"
	"${kubectl[@]}" create namespace sbx-system >/dev/null || die "cannot create the namespace sbx-system"
	"${kubectl[@]}" wait --for condition=established --timeout 60s crd/sandboxes.sbx.dev \
		crd/sandboxsnapshots.sbx.dev crd/sandboxtemplates.sbx.dev crd/sandboxnodes.sbx.dev >/dev/null ||
		die "the sbx.dev CRDs are not established"
	say "RBAC for the nodes and the controller, and the node restriction (deploy/rbac)"
	"${kubectl[@]}" apply -f "$here/deploy/rbac/" >/dev/null || die "cannot apply deploy/rbac"

	# the fleet's API token (the controller's, for its users), and the key
	# each node's own TCP token derives from: the controller holds the key,
	# a node only its token, so a node, or an address a SandboxNode names,
	# learns no other node's
	newtoken >"$dir/pki/sbx-token"
	newtoken >"$dir/pki/node-token-key"
	chmod 600 "$dir/pki/sbx-token" "$dir/pki/node-token-key"
	local templates=${SBX_FLEET_TEMPLATES:-$dir/templates}
	mkdir -p "$templates"
	: >"$dir/nodes"
	local i name tag nd port first=""
	for i in $(seq 1 "$nodes"); do
		name=node-$i
		tag=$(randtag)
		nd=$dir/$name
		mkdir -p "$nd/data"
		nodetoken "$name" >"$nd/token"
		chmod 600 "$nd/token"
		ln -sfn "$templates" "$nd/data/templates"
		port=$(freeport)
		echo "$name $tag $nd/sbxd.sock 127.0.0.1:$port" >>"$dir/nodes"
		say "sbxd $name (tag $tag) on 127.0.0.1:$port"
		# shellcheck disable=SC2206 # SBX_FLEET_SBXD_FLAGS is words
		local cmd=("$here/bin/sbxd" --data-dir "$nd/data" --socket "$nd/sbxd.sock"
			--listen "127.0.0.1:$port" --token-file "$nd/token" --tag "$tag"
			--pool "10.$((240 + i)).0.0/16" --preview-listen "127.0.0.1:$(freeport)"
			--runsc "$here/bin/runsc" --agent "$here/bin/sbx-agent"
			--fleet-kubeconfig "$nd/kubeconfig" --node-name "$name" --fleet-registry "127.0.0.1:$reg/sbx/stops" ${SBX_FLEET_SBXD_FLAGS:-})
		printf '%q ' "${cmd[@]}" >"$nd/sbxd.cmd" # for fleet.sh node DIR NAME
		start "$name/sbxd" "${cmd[@]}"
		[ -n "$first" ] || first="tcp://127.0.0.1:$port"
	done
	for i in $(seq 1 "$nodes"); do
		waitfor "curl -sf --unix-socket '$dir/node-$i/sbxd.sock' http://sbxd/v1/health" 60 ||
			die "sbxd node-$i did not come up: $dir/node-$i/sbxd.log"
	done

	local cport
	cport=$(freeport)
	echo "$cport" >"$dir/controller.port"
	echo "$reg" >"$dir/registry.port"
	startcontroller

	cat >"$dir/env" <<EOF
KUBECONFIG=$dir/kubeconfig
REGISTRY=127.0.0.1:$reg
SBX_HOST=tcp://127.0.0.1:$cport
SBX_CONTROLLER=tcp://127.0.0.1:$cport
SBX_NODE1=$first
SBX_NODE1_TOKEN=$(cat "$dir/node-1/token" 2>/dev/null || true)
SBX_TOKEN=$(cat "$dir/pki/sbx-token")
export KUBECONFIG REGISTRY SBX_HOST SBX_CONTROLLER SBX_NODE1 SBX_NODE1_TOKEN SBX_TOKEN
EOF
	say "up: . $dir/env"
}

# startcontroller starts sbx-controller on the port of DIR/controller.port
# (a restart after it was killed keeps the fleet's endpoint), appending to
# its log, and waits until it answers.
startcontroller() {
	local cport
	cport=$(cat "$dir/controller.port")
	say "sbx-controller on 127.0.0.1:$cport (stopped sandboxes move through 127.0.0.1:$(cat "$dir/registry.port")/sbx/moves)"
	setsid "$here/bin/sbx-controller" --kubeconfig "$dir/pki/controller.kubeconfig" \
		--listen "127.0.0.1:$cport" --token-file "$dir/pki/sbx-token" --node-token-key "$dir/pki/node-token-key" \
		--move-repository "127.0.0.1:$(cat "$dir/registry.port")/sbx/moves" >>"$dir/controller.log" 2>&1 </dev/null &
	echo $! >"$dir/controller.pid"
	waitfor "curl -sf -H 'Authorization: Bearer $(cat "$dir/pki/sbx-token")' http://127.0.0.1:$cport/v1/health" 30 ||
		die "sbx-controller did not come up: $dir/controller.log"
}

# stopnode deletes a node's sandboxes and stops its sbxd, then removes what
# it made on the host: runsc sandboxes left over, its namespaces and
# SBX-TAG-* chains (sbxd --cleanup), its cgroups, its data dir.
stopnode() {
	local name=$1 tag=$2 sock=$3
	local nd="$dir/$name"
	if [ -r "$nd/sbxd.pid" ] && kill -0 "$(cat "$nd/sbxd.pid")" 2>/dev/null; then
		SBX_HOST="unix://$sock" "$here/bin/sbx" rm --all --yes >/dev/null 2>&1 ||
			say "$name: could not delete every sandbox through sbxd; removing them by hand"
	fi
	stoppid "$nd/sbxd.pid"
	local root="$nd/data/runsc" id
	if [ -d "$root" ]; then
		for id in $("$here/bin/runsc" --root "$root" list -quiet 2>/dev/null); do
			"$here/bin/runsc" --root "$root" delete -force "$id" >/dev/null 2>&1 || true
		done
	fi
	if [ -e "$nd/data/state.db" ]; then
		"$here/bin/sbxd" --cleanup --data-dir "$nd/data" --tag "$tag" --socket "$nd/cleanup.sock" \
			--runsc "$here/bin/runsc" >>"$nd/cleanup.log" 2>&1 ||
			say "$name: sbxd --cleanup refused (see $nd/cleanup.log); removing its namespaces and chains by hand"
	fi
	local ns chain c
	for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^sbx-$tag-" || true); do
		ip netns delete "$ns" 2>/dev/null || true
	done
	local up=${tag^^}
	for chain in $(iptables -w -S 2>/dev/null | awk -v p="SBX-$up-" '$1 == "-N" && index($2, p) == 1 {print $2}'); do
		iptables -w -S 2>/dev/null | grep -F -- "-j $chain" | sed 's/^-A/-D/' | while read -r rule; do
			# shellcheck disable=SC2086 # a rule is words
			iptables -w $rule 2>/dev/null || true
		done
		iptables -w -F "$chain" 2>/dev/null || true
		iptables -w -X "$chain" 2>/dev/null || true
	done
	# its egress NAT rule, which a killed sbxd's --cleanup can leave
	local nat
	nat=$(iptables -w -t nat -S POSTROUTING 2>/dev/null | grep -F -- "--comment sbx-$tag -j" || true)
	[ -z "$nat" ] || sed 's/^-A/-D/' <<<"$nat" | while read -r rule; do
		# shellcheck disable=SC2086 # a rule is words
		iptables -w -t nat $rule 2>/dev/null || true
	done
	for c in /sys/fs/cgroup/*/sbx-"$tag"; do
		[ -d "$c" ] || continue
		find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null || true
	done
	rm -f "$nd/data/templates" # the link, never the shared cache
	rm -rf "$nd/data" "$sock" "$nd/cleanup.sock" "$nd/token" "$nd/kubeconfig"
}

down() {
	dir=$(cd "$1" 2>/dev/null && pwd) || die "no fleet in $1"
	local name tag sock addr
	stoppid "$dir/controller.pid"
	if [ -r "$dir/nodes" ]; then
		while read -r name tag sock addr; do
			[ -n "$name" ] && stopnode "$name" "$tag" "$sock"
		done <"$dir/nodes"
	fi
	for name in registry kube-apiserver etcd; do
		stoppid "$dir/$name.pid"
	done
	[ -n "${SBX_FLEET_TEMPLATES:-}" ] || rm -rf "$dir/templates"
	rm -rf "$dir/etcd" "$dir/pki" "$dir/registry" "$dir/env" "$dir/kubeconfig" "$dir/registry.yml" "$dir/nodes" "$dir/controller.port" "$dir/registry.port" "$dir/apiserver.port" "$dir/.ports"
	say "down: $dir holds only its logs"
}

case "${1:-}" in
up)
	[ $# -ge 2 ] || die "usage: scripts/fleet.sh up DIR [NODES]"
	up "$2" "${3:-2}"
	;;
down)
	[ $# -ge 2 ] || die "usage: scripts/fleet.sh down DIR"
	down "$2"
	;;
controller)
	[ $# -ge 2 ] || die "usage: scripts/fleet.sh controller DIR"
	dir=$(cd "$2" 2>/dev/null && pwd) || die "no fleet in $2"
	[ -r "$dir/controller.port" ] || die "no fleet in $dir (no controller.port): scripts/fleet.sh up $dir first"
	if [ -r "$dir/controller.pid" ] && kill -0 "$(cat "$dir/controller.pid")" 2>/dev/null; then
		die "the controller of $dir runs already (pid $(cat "$dir/controller.pid"))"
	fi
	startcontroller
	;;
node)
	[ $# -ge 3 ] || die "usage: scripts/fleet.sh node DIR NAME"
	dir=$(cd "$2" 2>/dev/null && pwd) || die "no fleet in $2"
	case "$3" in '' | */* | .*) die "NAME: a node of the fleet (node-1, ...), got '$3'" ;; esac
	[ -r "$dir/$3/sbxd.cmd" ] || die "no node $3 in $dir (DIR/nodes lists them)"
	if [ -r "$dir/$3/sbxd.pid" ] && kill -0 "$(cat "$dir/$3/sbxd.pid")" 2>/dev/null; then
		die "sbxd $3 of $dir runs already (pid $(cat "$dir/$3/sbxd.pid"))"
	fi
	say "sbxd $3 again (its log goes on in $dir/$3/sbxd.log)"
	eval "setsid $(cat "$dir/$3/sbxd.cmd") >>\"\$dir/\$3/sbxd.log\" 2>&1 </dev/null &"
	echo $! >"$dir/$3/sbxd.pid"
	waitfor "curl -sf --unix-socket '$dir/$3/sbxd.sock' http://sbxd/v1/health" 60 ||
		die "sbxd $3 did not come up: $dir/$3/sbxd.log"
	;;
*) die "usage: scripts/fleet.sh up DIR [NODES] | down DIR | controller DIR | node DIR NAME (start one again after it died)" ;;
esac
