#!/bin/bash
# attack30: holes in deploy/rbac/node-restriction.yaml, probed against a
# bare kube-apiserver (the binaries of ~/.cache/sbx-fleet/*/), started as
# scripts/fleet.sh starts it, with this token file:
#
#   admintok,sbx-admin,a,system:masters
#   ctltok,sbx:controller,c,sbx:controllers
#   n1tok,sbx:node:node-1,u1,sbx:nodes
#   n2tok,sbx:node:node-2,u2,sbx:nodes
#   dotstok,sbx:node:node-1.x,u5,sbx:nodes
#
# then: kubectl apply -f deploy/crds/; kubectl create ns sbx-system;
# kubectl apply -f deploy/rbac/. Run: KUBECTL=... SERVER=https://127.0.0.1:PORT
# bash cel-holes.sh. Each step's output, as seen (kube-apiserver of the
# cache 41016f898a8c), is under it; a line "HOLE" marks what should have
# been refused. The fleet test's "node identity" runs these against the
# fixed policy (make test), each refused.
set -u
K=${KUBECTL:-kubectl}
S=${SERVER:-https://127.0.0.1:26443}
k() { local t=$1; shift; "$K" --server "$S" --insecure-skip-tls-verify --token "$t" -n sbx-system "$@" 2>&1; }
st() { # TOKEN NAME JSON: a merge patch of a Sandbox's status (RBAC gives nodes no get on sandboxes/status, so kubectl patch --subresource cannot)
	curl -sk -X PATCH -H "Authorization: Bearer $1" -H 'Content-Type: application/merge-patch+json' \
		"$S/apis/sbx.dev/v1alpha1/namespaces/sbx-system/sandboxes/$2/status" -d "$3" >/dev/null
}

# ---------------------------------------------------------------------------
# H1. A node keeps writing a Sandbox bound to another node.
# The policy admits a write when the object is labelled the node's OR bound
# to it, and lets a node CREATE an unbound Sandbox. So node-1 makes an
# unbound Sandbox labelled node-1; the controller's placement (which binds
# every unbound one, labelled or not) binds it to node-2; node-1 still
# passes "oldLabel == node" and writes its status (an id, so node-2's agent
# never takes it up: boundHere wants no status.id; itself as status.node,
# where the controller routes its requests), its spec (64 GiB, which
# placement.tally counts against node-2's room: node-2 looks full), and
# deletes it. node-2's agent ignores it (labelled node-1, status.id set).
echo "== H1: node-1 creates an unbound Sandbox labelled node-1"
printf 'apiVersion: sbx.dev/v1alpha1\nkind: Sandbox\nmetadata: {name: evil10, labels: {sbx.dev/node: node-1}}\nspec: {template: tiny}\n' | k n1tok create -f -
#   sandbox.sbx.dev/evil10 created                      HOLE (agents always bind their mirrors to themselves)
echo "== H1: the controller places it on node-2"
k ctltok patch sandbox evil10 --type merge -p '{"spec":{"nodeName":"node-2"}}'
#   sandbox.sbx.dev/evil10 patched
echo "== H1: node-1 writes the status of a Sandbox bound to node-2"
st n1tok evil10 '{"status":{"id":"sb_node1fake","node":"node-1","state":"ready"}}'
k admintok get sandbox evil10 -o jsonpath='{.metadata.labels} bound={.spec.nodeName} status.node={.status.node} status.id={.status.id}{"\n"}'
#   {"sbx.dev/node":"node-1"} bound=node-2 status.node=node-1 status.id=sb_node1fake   HOLE
echo "== H1: node-1 rewrites its spec (64 GiB counted against node-2), and deletes it"
k n1tok patch sandbox evil10 --type merge -p '{"spec":{"template":"node-1-chose","memoryBytes":68719476736}}'
#   sandbox.sbx.dev/evil10 patched                      HOLE
k n1tok delete sandbox evil10
#   sandbox.sbx.dev "evil10" deleted from sbx-system namespace   HOLE

# H1'. Label and binding may disagree the other way: node-1 creates a
# Sandbox labelled node-2 bound to itself, and relabels its own bound one
# to node-2 (the new object passes on "newBound == node"). node-2's agent
# then counts it among its own (label), finds no sandbox for it and
# deletes it; markSandboxesLost(node-2) marks it lost.
echo "== H1': labelled node-2, bound node-1"
printf 'apiVersion: sbx.dev/v1alpha1\nkind: Sandbox\nmetadata: {name: evil2, labels: {sbx.dev/node: node-2}}\nspec: {nodeName: node-1}\n' | k n1tok create -f -
#   sandbox.sbx.dev/evil2 created                       HOLE
printf 'apiVersion: sbx.dev/v1alpha1\nkind: Sandbox\nmetadata: {name: own3, labels: {sbx.dev/node: node-1}}\nspec: {nodeName: node-1}\n' | k n1tok create -f -
k n1tok label sandbox own3 sbx.dev/node=node-2 --overwrite
#   sandbox.sbx.dev/own3 labeled                        HOLE
k admintok delete sandbox evil2 own3 >/dev/null

# Proposed rule (sbx-node-own-sandboxes), replacing the three checks: a
# node writes a Sandbox only while it is bound to it, before and after,
# and labels it only its own:
#   - oldObject == null || variables.oldBound == variables.node
#   - object == null || (variables.newBound == variables.node && variables.newLabel == variables.node)
#   - object == null || oldObject == null || variables.newBound == variables.oldBound   (implied by the two)
# (the controller's rebind sets label and binding together, so a moved
# sandbox's old node loses it at once; a node's mirrors are always
# created bound to it, mirror.go sandboxObject). Check the agent's flows
# for an object labelled here and bound elsewhere that it must still
# write: mirror.go's movedAway path only reads it and drops the local copy.

# ---------------------------------------------------------------------------
# H2. View names: a prefix, not a node. sbx-node-own-views admits any
# write to a view whose name starts with "NODE." and checks the label only
# of the new object. SandboxNode names may hold dots (DNS subdomains, as
# hostnames do): node-1 writes node-1.x's views (named node-1.x.*):
# relabels them, deletes them.
echo "== H2: node-1.x's own snapshot view"
printf 'apiVersion: sbx.dev/v1alpha1\nkind: SandboxSnapshot\nmetadata: {name: node-1.x.snap, labels: {sbx.dev/node: node-1.x}}\n' | k dotstok create -f -
#   sandboxsnapshot.sbx.dev/node-1.x.snap created
k n1tok label sandboxsnapshot node-1.x.snap sbx.dev/node=node-1 --overwrite
#   sandboxsnapshot.sbx.dev/node-1.x.snap labeled        HOLE
k n1tok delete sandboxsnapshot node-1.x.snap
#   sandboxsnapshot.sbx.dev "node-1.x.snap" deleted from sbx-system namespace   HOLE
# Proposed rule: also "oldObject == null || oldLabel == variables.node"
# (oldLabel as in sbx-node-own-sandboxes), and refuse node names with a
# dot (matchConditions or a validation: "!variables.node.contains('.')"),
# or make the view name's node part unambiguous.

# ---------------------------------------------------------------------------
# Held (refused as they should be), as seen:
#  - a pending (unlabelled, unbound) Sandbox: node-1 can neither label nor
#    delete it ("pend4 is labelled  and bound to");
#  - node-2's Sandbox: node-1 can neither relabel nor delete it;
#  - node-1 rebinding its own to node-2 ("cannot give own3 to another node");
#  - users sbx:node: (empty) and mallory in sbx:nodes ("must be user sbx:node:NAME");
#  - kubectl delete sandboxes --all (RBAC has no deletecollection; kubectl
#    deletes one by one, each checked);
#  - generateName on a SandboxNode or a Lease: request.name is the generated
#    name ("not node-pldp7"); on a view, "node-1." is no valid generateName;
#  - the leader Lease sbx-controller: node-1 can neither create, patch nor
#    delete it; node-1 cannot create SandboxNode node-2 nor patch node-3's status;
#  - another namespace: RBAC refuses.
