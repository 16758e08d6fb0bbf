"""No drift: every route sbxd serves has a Python method, or is listed here as deliberately absent, and why."""

import os
import re

import sbx
from conftest import REPO

# route -> the method that calls it ("Class.method")
COVERED = {
    "GET /v1/health": "Client.health",
    "GET /v1/sandboxes": "Client.list",
    "POST /v1/sandboxes": "Client.create",
    "GET /v1/sandboxes/{id}": "Sandbox.info",
    "DELETE /v1/sandboxes/{id}": "Sandbox.delete",
    "POST /v1/sandboxes/{id}/exec": "Sandbox.exec",
    "GET /v1/sandboxes/{id}/execs": "Sandbox.execs",
    "GET /v1/sandboxes/{id}/execs/{exec}": "Process.info",
    "GET /v1/sandboxes/{id}/execs/{exec}/output": "Process.wait",
    "POST /v1/sandboxes/{id}/execs/{exec}/signal": "Process.signal",
    "GET /v1/sandboxes/{id}/files": "Files.read",
    "PUT /v1/sandboxes/{id}/files": "Files.write",
    "DELETE /v1/sandboxes/{id}/files": "Files.remove",
    "POST /v1/sandboxes/{id}/fs/mkdir": "Files.mkdir",
    "POST /v1/sandboxes/{id}/fs/rename": "Files.rename",
    "GET /v1/sandboxes/{id}/fs/stat": "Files.stat",
    "GET /v1/sandboxes/{id}/fs/ls": "Files.list",
    "POST /v1/sandboxes/{id}/snapshots": "Sandbox.snapshot",
    "POST /v1/sandboxes/{id}/fork": "Sandbox.fork",
    "POST /v1/sandboxes/{id}/stop": "Sandbox.stop",
    "POST /v1/sandboxes/{id}/resume": "Sandbox.resume",
    "GET /v1/sandboxes/{id}/events": "Sandbox.events",
    "POST /v1/sandboxes/{id}/ttl": "Sandbox.set_ttl",
    "POST /v1/sandboxes/{id}/persist": "Sandbox.set_persistent",
    "GET /v1/sandboxes/{id}/logs": "Sandbox.logs",
    "GET /v1/sandboxes/{id}/metrics": "Sandbox.metrics",
    "GET /v1/sandboxes/{id}/trace": "Sandbox.trace",
    "GET /v1/sandboxes/{id}/ports": "Sandbox.ports",
    "POST /v1/sandboxes/{id}/preview": "Sandbox.preview_url",
    "GET /v1/sandboxes/{id}/preview": "Sandbox.previews",
    "DELETE /v1/sandboxes/{id}/preview/{port}": "Sandbox.unpreview",
    "GET /metrics": "Client.prometheus",
    "GET /v1/snapshots": "Client.snapshots",
    "GET /v1/snapshots/{name}": "Client.snapshot",
    "DELETE /v1/snapshots/{name}": "Snapshot.delete",
    "POST /v1/snapshots/{name}/keep": "Snapshot.keep",
    "POST /v1/snapshots/{name}/push": "Snapshot.push",
    "POST /v1/snapshots/pull": "Client.pull_snapshot",
    "GET /v1/storage": "Client.storage",
    "POST /v1/storage/prune": "Client.prune",
    "GET /v1/templates": "Client.templates",
    "GET /v1/templates/{name}": "Client.template",
    "POST /v1/templates/{name}/build": "Client.build_template",
    "PUT /v1/templates/{name}": "Client.import_template",
    "DELETE /v1/templates/{name}": "Client.remove_template",
}

# route -> why Python has no method for it
ABSENT = {
    "GET /v1/sandboxes/{id}/exec/pty": "a WebSocket terminal: optional in the issue; use `sbx shell`",
    "GET /v1/sandboxes/{id}/execs/{exec}/attach": "a WebSocket re-attach of a terminal; Process.wait follows an exec's output",
    "POST /v1/templates/{name}/image": "importing container images (config plus layers) is `sbx template import`'s job",
    "PUT /v1/layers/{digest}": "the layers of an image import, see above",
    "GET /v1/nodes": "a fleet's nodes are its operator's (`sbx node ls`); a sandbox says its node (SandboxInfo.node)",
    "GET /v1/nodes/{name}": "see GET /v1/nodes",
    "POST /v1/nodes/{name}/cordon": "cordoning is the fleet operator's (`sbx node cordon`)",
    "POST /v1/nodes/{name}/uncordon": "see cordon",
    "POST /v1/nodes/{name}/drain": "draining a node is the fleet operator's (`sbx node drain`)",
    "POST /v1/sandboxes/{id}/push": "a stopped sandbox's image pushed for a move between nodes: the fleet's controller asks a node; Sandbox.resume moves one",
    "POST /v1/sandboxes/adopt": "a node adopting a moved sandbox from the registry: the fleet's controller asks; Sandbox.resume moves one",
}

CLASSES = {"Client": sbx.Client, "Sandbox": sbx.Sandbox, "Process": sbx.Process, "Files": sbx.Files, "Snapshot": sbx.Snapshot}


def server_routes():
    with open(os.path.join(REPO, "internal", "server", "server.go")) as f:
        src = f.read()
    routes = re.findall(r'mux\.HandleFunc\("([A-Z]+ /[^"]*)"', src)
    assert len(routes) > 30, "found only %d routes in server.go: has the way they are registered changed?" % len(routes)
    return routes


def openapi_routes():
    with open(os.path.join(REPO, "api", "openapi.yaml")) as f:
        text = f.read()
    out, path = set(), None
    for line in text.splitlines():
        m = re.match(r"^  (/\S*):\s*$", line)
        if m:
            path = m.group(1)
            continue
        m = re.match(r"^    (get|put|post|delete|patch):", line)
        if m and path:
            out.add("%s %s" % (m.group(1).upper(), path))
    return out


def test_every_route_has_a_method_or_a_reason():
    routes = server_routes()
    missing = [r for r in routes if r not in COVERED and r not in ABSENT]
    assert not missing, "routes with no Python method and no reason in ABSENT: %s" % missing
    both = set(COVERED) & set(ABSENT)
    assert not both, "listed as covered and absent: %s" % both
    stale = (set(COVERED) | set(ABSENT)) - set(routes)
    assert not stale, "listed here but not served by sbxd: %s" % stale


def test_every_listed_method_exists():
    for route, name in COVERED.items():
        cls, meth = name.split(".")
        assert callable(getattr(CLASSES[cls], meth, None)), "%s: %s is not a method" % (route, name)


def test_openapi_agrees():
    # the spec and the server list the same /v1 routes (the drift check above reads the server)
    spec = openapi_routes()
    served = {r for r in server_routes() if r.split(" ")[1].startswith("/v1/")}
    assert spec, "no routes parsed from api/openapi.yaml"
    assert served - spec == set(), "served but not in openapi.yaml: %s" % (served - spec)
