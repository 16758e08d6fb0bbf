// Package api holds the wire types and error kinds shared by sbxd and its clients.
//
// Routes of the sbxd HTTP API (all JSON unless said otherwise; errors are
// ErrorBody with the status of their kind; streams are server-sent events
// "event: NAME\ndata: JSON\n\n").
//
//	GET    /v1/health                                  Health
//	GET    /v1/sandboxes?meta=K=V&parent=ID&state=S    []Sandbox (the filters are optional; meta and state repeat)
//	POST   /v1/sandboxes                   CreateRequest -> 201 Sandbox
//	GET    /v1/sandboxes/{id}                          Sandbox        ({id} is an id or a name, everywhere)
//	DELETE /v1/sandboxes/{id}?withSnapshots=1          DeleteResult (withSnapshots also removes the snapshots taken from it; its freezes go unless keepFreezes=1)
//	POST   /v1/sandboxes/{id}/snapshots    SnapshotRequest -> 201 Snapshot
//	POST   /v1/sandboxes/{id}/fork         ForkRequest -> stream of ForkEvent: "sandbox.forking" (ids) at once,
//	                                                   "sandbox.captured" when the parent's state is taken,
//	                                                   "sandbox.ready" per child, then "done" or "error"; the fork
//	                                                   goes on if the client leaves
//	POST   /v1/sandboxes/{id}/stop?wait=1              202 Sandbox (stopping), or with wait 200 Sandbox (stopped)
//	POST   /v1/sandboxes/{id}/resume       ResumeRequest (optional body) -> 200 Sandbox
//	GET    /v1/sandboxes/{id}/events?follow=1&after=SEQ
//	                                                   stream of Event ("event" events) after sequence number SEQ,
//	                                                   live with follow, then "eof" (or "error" with error and code;
//	                                                   code "unavailable" when sbxd shuts down)
//	POST   /v1/sandboxes/{id}/ttl          TTLRequest -> Sandbox
//	POST   /v1/sandboxes/{id}/persist      PersistRequest -> Sandbox (403 where a lifetime cap is set)
//	GET    /v1/sandboxes/{id}/logs?stream=console|events|runtime|exec/ID&follow=1&tail=N
//	                                                   stream of LogEvent ("log" events), then "eof" (when following:
//	                                                   once the exec or the sandbox is gone), or "error" with error and code
//	GET    /v1/sandboxes/{id}/metrics                  Metrics
//	GET    /v1/sandboxes/{id}/ports                    []Port
//	POST   /v1/sandboxes/{id}/preview      PreviewRequest -> Preview (publishes the port on the proxy, durably;
//	                                                   409 for a private port asked public, or a sandbox without network)
//	GET    /v1/sandboxes/{id}/preview                  []Preview (the published ports)
//	DELETE /v1/sandboxes/{id}/preview/{port}           204 (withdrawn: the proxy answers 404 for it)
//	GET    /v1/sandboxes/{id}/exec/pty?cmd=ARG&cmd=ARG...&env=K=V...&cwd=DIR&cols=N&rows=N
//	                                                   WebSocket: binary frames are bytes both ways; a text frame
//	                                                   {"type":"resize","cols":N,"rows":N} resizes; the server's last
//	                                                   text frame is {"type":"exit","code":N}
//	GET    /v1/sandboxes/{id}/execs/{exec}/attach?from=start|tail
//	                                                   WebSocket re-attached to a running exec's output (execs have
//	                                                   no stdin to re-attach to)
//	GET    /v1/snapshots                               []Snapshot
//	GET    /v1/snapshots/{name}                        Snapshot
//	DELETE /v1/snapshots/{name}                        204
//	POST   /v1/snapshots/{name}/keep                   Snapshot (promoted: outlives its sandbox, in no freeze quota)
//	POST   /v1/snapshots/{name}/push   PushRequest  -> PushResult (to an OCI registry)
//	POST   /v1/snapshots/pull          PullRequest  -> 201 PullResult (from one; recorded kept)
//	GET    /v1/storage                                 Storage (what uses the data dir: sbx df)
//	POST   /v1/storage/prune        PruneRequest  ->   PruneResult (sbx prune)
//	POST   /v1/sandboxes/{id}/exec         ExecRequest -> 201 Exec when Detach,
//	                                                   else a stream of ExecEvent: "started", "stdout"/"stderr"..., "exit"
//	GET    /v1/sandboxes/{id}/execs                    []Exec
//	GET    /v1/sandboxes/{id}/execs/{exec}             Exec
//	POST   /v1/sandboxes/{id}/execs/{exec}/signal  SignalRequest (optional) -> 204 (to the exec's process group)
//	GET    /v1/sandboxes/{id}/execs/{exec}/output?follow=1
//	                                                   stream of ExecEvent: the output kept so far, then (with
//	                                                   follow) live output; ends with "exit" once the exec has ended
//	GET    /v1/sandboxes/{id}/files?path=P             the file's bytes (application/octet-stream)
//	GET    /v1/sandboxes/{id}/files?path=P&tar=1       a tar of P (file or directory), entries named from P's base name
//	PUT    /v1/sandboxes/{id}/files?path=P&mode=0644   body: the file's bytes (Content-Length required); 204.
//	                                                   The file lands whole or not at all.
//	PUT    /v1/sandboxes/{id}/files?path=P&tar=1       body: a tar, extracted under directory P; 204
//	DELETE /v1/sandboxes/{id}/files?path=P&recursive=1 204 (a file or empty directory; recursive: all below P)
//	POST   /v1/sandboxes/{id}/fs/mkdir?path=P&mode=0755 204 (and the missing parents)
//	POST   /v1/sandboxes/{id}/fs/rename    RenameRequest -> 204
//	GET    /v1/sandboxes/{id}/fs/stat?path=P           FileInfo (of the link itself for a symlink)
//	GET    /v1/sandboxes/{id}/fs/ls?path=P             []FileInfo
//	GET    /v1/templates                               []Template
//	GET    /v1/templates/{name}                        Template (the version the name points at)
//	POST   /v1/templates/{name}/build?force=1&packages=a,b  stream of Progress, the last with Done or Error
//	PUT    /v1/templates/{name}?force=1                body: a tar of a root filesystem; stream of Progress
//	POST   /v1/templates/{name}/image                  ImageImport; stream of Progress, the last with Done, Error or Missing
//	PUT    /v1/layers/{diffID}                         body: an image layer (tar, gzip or zstd); stream of Progress
//	DELETE /v1/templates/{name}                        Template (the name's version, which stays until unused)
//	GET    /metrics                                    Prometheus text (sandboxes by state, captures, reaper, API)
//
// The preview proxy listens apart (sbxd --preview-listen): a request to
// http://PORT-ID.DOMAIN:PROXYPORT/ is proxied to PORT inside sandbox ID if
// that port is published; any other is 404.
package api
