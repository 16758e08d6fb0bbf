package flaky

import (
	"context"
	"io"
	"io/fs"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
)

// SDK gives the workflows the calls they declare (Client, HuntClient,
// CrashClient), each addressed by a sandbox id, on top of the client
// package, whose calls go through a sandbox handle. The workflows' tests
// fake these narrow interfaces; SDK is the real one.
type SDK struct{ C *client.Client }

// Adapt returns the workflows' view of c.
func Adapt(c *client.Client) SDK { return SDK{C: c} }

var (
	_ Client      = SDK{}
	_ HuntClient  = SDK{}
	_ CrashClient = SDK{}
)

// Create creates a sandbox.
func (a SDK) Create(ctx context.Context, opts ...client.CreateOption) (*api.Sandbox, error) {
	return a.C.Create(ctx, opts...)
}

// Get describes sandbox id.
func (a SDK) Get(ctx context.Context, id string) (*api.Sandbox, error) {
	return a.C.Sandbox(id).Info(ctx)
}

// Delete deletes sandbox id.
func (a SDK) Delete(ctx context.Context, id string) error {
	_, err := a.C.Sandbox(id).Delete(ctx)
	return err
}

// KeepSnapshot promotes snapshot name: a freeze so marked outlives its
// sandbox.
func (a SDK) KeepSnapshot(ctx context.Context, name string) error {
	_, err := a.C.KeepSnapshot(ctx, name)
	return err
}

// SetTTL sets the idle ttl of sandbox id.
func (a SDK) SetTTL(ctx context.Context, id string, ttl time.Duration) (*api.Sandbox, error) {
	return a.C.Sandbox(id).SetTTL(ctx, ttl)
}

// Fork forks sandbox id as req says and returns the children.
func (a SDK) Fork(ctx context.Context, id string, req api.ForkRequest) ([]api.Sandbox, error) {
	return a.C.Sandbox(id).Fork(ctx, forkOptions(req, nil)...)
}

// ForkEvents forks sandbox id as req says, handing each event to fn.
func (a SDK) ForkEvents(ctx context.Context, id string, req api.ForkRequest, fn func(api.ForkEvent) error) error {
	_, err := a.C.Sandbox(id).Fork(ctx, forkOptions(req, fn)...)
	return err
}

func forkOptions(req api.ForkRequest, fn func(api.ForkEvent) error) []client.ForkOption {
	var opts []client.ForkOption
	if req.Name != "" {
		opts = append(opts, client.WithName(req.Name))
	}
	if req.Memory {
		opts = append(opts, client.WithMemory())
	}
	if req.Count > 0 {
		opts = append(opts, client.WithCount(req.Count))
	}
	if req.Monitor {
		opts = append(opts, client.WithMonitoring())
	}
	if req.CPUs > 0 {
		opts = append(opts, client.WithForkCPUs(req.CPUs))
	}
	if sh := req.Shape; sh != nil {
		opts = append(opts, client.WithNetShape(sh.Delay.D(), sh.Loss))
	}
	if req.TTL != nil {
		opts = append(opts, client.WithTTL(req.TTL.D()))
	}
	for k, v := range req.Meta {
		opts = append(opts, client.WithMeta(k, v))
	}
	if fn != nil {
		opts = append(opts, client.WithForkEvents(fn))
	}
	return opts
}

// Exec runs req in sandbox id and waits for it.
func (a SDK) Exec(ctx context.Context, id string, req api.ExecRequest, stdout, stderr io.Writer) (*api.Exec, error) {
	opts := append(execOptions(req), client.WithStdout(stdout), client.WithStderr(stderr))
	return wireExec(a.C.Sandbox(id).Exec(ctx, req.Cmd, opts...))
}

// ExecEvents runs req in sandbox id, handing each event to fn.
func (a SDK) ExecEvents(ctx context.Context, id string, req api.ExecRequest, fn func(api.ExecEvent) error) (*api.Exec, error) {
	opts := append(execOptions(req), client.WithExecEvents(fn))
	return wireExec(a.C.Sandbox(id).Exec(ctx, req.Cmd, opts...))
}

// ExecDetached starts req in sandbox id and returns at once.
func (a SDK) ExecDetached(ctx context.Context, id string, req api.ExecRequest) (*api.Exec, error) {
	p, err := a.C.Sandbox(id).Start(ctx, req.Cmd, execOptions(req)...)
	if err != nil {
		return nil, err
	}
	return &api.Exec{ID: p.ID, SandboxID: p.SandboxID, Cmd: req.Cmd, State: api.ExecRunning, Pid: p.Pid, Detached: true}, nil
}

// Execs lists the execs of sandbox id.
func (a SDK) Execs(ctx context.Context, id string) ([]api.Exec, error) {
	return a.C.Sandbox(id).Execs(ctx)
}

// ExecOutput writes an exec's output, following it with follow; it returns
// the ended exec, or nil while it runs (without follow).
func (a SDK) ExecOutput(ctx context.Context, id, execID string, follow bool, stdout, stderr io.Writer) (*api.Exec, error) {
	p := a.C.Sandbox(id).Process(execID)
	out := []client.OutputOption{client.WithStdout(stdout), client.WithStderr(stderr)}
	var res *client.Result
	var err error
	if follow {
		res, err = p.Wait(ctx, out...)
	} else {
		res, err = p.Output(ctx, out...)
	}
	if err != nil {
		return nil, err
	}
	if res.State == api.ExecRunning {
		return nil, nil
	}
	return wireExec(res, nil)
}

// WriteFile writes size bytes of r to path in sandbox id.
func (a SDK) WriteFile(ctx context.Context, id, path string, r io.Reader, size int64, mode fs.FileMode) error {
	return a.C.Sandbox(id).Files().Write(ctx, path, r, size, client.WithMode(mode))
}

// WriteTar extracts the tar r under dir in sandbox id.
func (a SDK) WriteTar(ctx context.Context, id, dir string, r io.Reader) error {
	return a.C.Sandbox(id).Files().WriteTar(ctx, dir, r)
}

// ReadTar streams a tar of path in sandbox id.
func (a SDK) ReadTar(ctx context.Context, id, path string) (io.ReadCloser, error) {
	return a.C.Sandbox(id).Files().ReadTar(ctx, path)
}

// ReadFile streams the file path of sandbox id.
func (a SDK) ReadFile(ctx context.Context, id, path string) (io.ReadCloser, error) {
	return a.C.Sandbox(id).Files().Open(ctx, path)
}

// Snapshot snapshots sandbox id as name.
func (a SDK) Snapshot(ctx context.Context, id, name string, memory bool) (*api.Snapshot, error) {
	var opts []client.SnapshotOption
	if memory {
		opts = append(opts, client.WithMemory())
	}
	return a.C.Sandbox(id).Snapshot(ctx, name, opts...)
}

// GetSnapshot describes the snapshot name.
func (a SDK) GetSnapshot(ctx context.Context, name string) (*api.Snapshot, error) {
	return a.C.GetSnapshot(ctx, name)
}

// Stop stops sandbox id, waiting for it with wait.
func (a SDK) Stop(ctx context.Context, id string, wait bool) (*api.Sandbox, error) {
	if !wait {
		return a.C.Sandbox(id).Stop(ctx, client.NoWait())
	}
	return a.C.Sandbox(id).Stop(ctx)
}

// execOptions are the options that say what req says.
func execOptions(req api.ExecRequest) []client.ExecOption {
	var opts []client.ExecOption
	if len(req.Env) > 0 {
		opts = append(opts, client.WithEnv(req.Env...))
	}
	if req.Cwd != "" {
		opts = append(opts, client.WithCwd(req.Cwd))
	}
	if req.User != "" {
		opts = append(opts, client.WithUser(req.User))
	}
	if req.Timeout > 0 {
		opts = append(opts, client.WithTimeout(req.Timeout.D()))
	}
	return opts
}

// wireExec is a Result as the API describes an exec; nil with an error.
func wireExec(r *client.Result, err error) (*api.Exec, error) {
	if err != nil {
		return nil, err
	}
	return r.API(), nil
}

// Trace returns what runtime monitoring kept of sandbox id.
func (a SDK) Trace(ctx context.Context, id string) (*api.Trace, error) {
	return a.C.Sandbox(id).Trace(ctx)
}

// Crashes lists the crashes caught in sandbox id (client.Sandbox.Crashes).
func (a SDK) Crashes(ctx context.Context, id string) ([]client.Crash, error) {
	return a.C.Sandbox(id).Crashes(ctx)
}
