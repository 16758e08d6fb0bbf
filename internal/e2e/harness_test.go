// Package e2e drives a real sbxd, real runsc and real namespaces through the
// sbx CLI and the client package.
package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
	"sbx.dev/sbx/client/image"
	"sbx.dev/sbx/internal/flaky"
	"sbx.dev/sbx/internal/netns"
	"sbx.dev/sbx/internal/procfs"
	"sbx.dev/sbx/internal/runsc"
)

// daemon is one sbxd started by a test, with its own data dir, socket,
// runsc root, tag and TCP listener.
type daemon struct {
	dir     string
	socket  string
	tcp     string
	token   string
	tag     string
	cmd     *exec.Cmd
	logPath string
	client  *client.Client
	// preview is the preview proxy's address, when the test gave one.
	preview string
	// bin is the sbxd to run (default bin/sbxd); env is added to its environment.
	bin string
	env []string

	stopOnce sync.Once
	exited   chan struct{}
}

// logAbout logs sbxd's log lines that name any of ids (the last 60), for
// a failure that only its daemon can explain.
func (d *daemon) logAbout(t testing.TB, ids ...string) {
	t.Helper()
	b, err := os.ReadFile(d.logPath)
	if err != nil {
		t.Logf("sbxd's log: %v", err)
		return
	}
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		for _, id := range ids {
			if id != "" && strings.Contains(l, id) {
				lines = append(lines, l)
				break
			}
		}
	}
	if len(lines) > 60 {
		lines = lines[len(lines)-60:]
	}
	t.Logf("sbxd's log about %v:\n%s", ids, strings.Join(lines, "\n"))
}

// waitExit waits for sbxd to end by itself (a crash hook) and forgets it.
func (d *daemon) waitExit(t *testing.T, limit time.Duration) {
	t.Helper()
	select {
	case <-d.exited:
		d.cmd = nil
	case <-time.After(limit):
		t.Fatalf("sbxd did not exit within %s", limit)
	}
}

var (
	testBuildOnce sync.Once
	testBuildPath string
	testBuildErr  error
)

// sbxdTestBuild returns an sbxd built with the sbxtest tag, which has the
// crash hook (SBX_TEST_CRASH_AT) normal builds lack.
func sbxdTestBuild(t *testing.T) string {
	t.Helper()
	testBuildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "sbxd-sbxtest-")
		if err != nil {
			testBuildErr = err
			return
		}
		testBuildPath = filepath.Join(dir, "sbxd")
		cmd := exec.Command("go", "build", "-tags", "sbxtest", "-o", testBuildPath, "sbx.dev/sbx/cmd/sbxd")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			testBuildErr = fmt.Errorf("build sbxd with the sbxtest tag: %v\n%s", err, out)
		}
	})
	if testBuildErr != nil {
		t.Fatal(testBuildErr)
	}
	return testBuildPath
}

var (
	binDir string
	// shared is the daemon most tests use; started in TestMain.
	shared *daemon
)

func TestMain(m *testing.M) {
	_, file, _, _ := runtime.Caller(0)
	binDir = filepath.Join(filepath.Dir(file), "..", "..", "bin")
	// A non-root run fails: passing without running would read "ok".
	if os.Geteuid() != 0 {
		fmt.Println("e2e: run as root: these tests drive runsc, network namespaces and cgroups (sudo make test)")
		os.Exit(1)
	}
	for _, b := range []string{"sbx", "sbxd", "sbx-shim", "sbx-agent", "runsc"} {
		if _, err := os.Stat(filepath.Join(binDir, b)); err != nil {
			fmt.Printf("e2e: bin/%s missing: run `make build` first\n", b)
			os.Exit(1)
		}
	}
	if sharded, code := shardMain(); sharded {
		os.Exit(code) // the whole suite, run as shards (shard_test.go)
	}
	if f := flag.Lookup("test.list"); f != nil && f.Value.String() != "" {
		os.Exit(m.Run()) // names only: no daemon
	}
	// Raw runsc sandboxes of the benchmarks are reaped as sbxd reaps its
	// own, so that neither side waits for a slow init.
	if err := runsc.ReapSandboxes(context.Background()); err != nil {
		fmt.Println("e2e: cannot reap raw sandboxes:", err)
	}
	go reapOrphanShims()
	// An interrupted run (^C, a CI timeout) still removes what it made.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		sig := <-sigs
		fmt.Printf("e2e: %v: removing the daemons, sandboxes and rules of this run\n", sig)
		stopAll()
		os.Exit(1)
	}()
	d, err := startDaemon(nil)
	if err != nil {
		fmt.Println("e2e:", err)
		os.Exit(1)
	}
	shared = d
	code := func() int {
		defer d.stop(true)
		defer func() {
			shimMu.Lock()
			defer shimMu.Unlock()
			if shim != nil {
				shim.stop(true)
			}
		}()
		if err := d.ensureTemplates(); err != nil {
			fmt.Println("e2e:", err)
			return 1
		}
		defer func() {
			if testBuildPath != "" {
				os.RemoveAll(filepath.Dir(testBuildPath))
			}
		}()
		return m.Run()
	}()
	os.Exit(code)
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func freePort() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// templateCache is shared by every daemon of a run (and across runs on one
// machine), so base is built once.
func templateCache() string {
	if d := os.Getenv("SBX_TEST_TEMPLATES"); d != "" {
		return d
	}
	return "/var/tmp/sbx-test-templates-v2"
}

var (
	daemonsMu sync.Mutex
	daemons   []*daemon
)

var (
	shimMu sync.Mutex
	shim   *daemon
)

// shimShared is a daemon shared by the tests written against the path
// without the exec channel (a shim and a copier process per exec), started
// at the first's call; stopAll and TestMain's end remove it.
func shimShared(t testing.TB) *daemon {
	t.Helper()
	shimMu.Lock()
	defer shimMu.Unlock()
	if shim == nil {
		d, err := startDaemon([]string{"--exec-channel=false"})
		if err != nil {
			if d != nil {
				d.stop(true)
			}
			t.Fatalf("start an sbxd with --exec-channel=false: %v", err)
		}
		shim = d
	}
	return shim
}

// stopAll stops and cleans up every daemon this run started.
func stopAll() {
	daemonsMu.Lock()
	ds := append([]*daemon(nil), daemons...)
	daemonsMu.Unlock()
	for _, d := range ds {
		d.stop(true)
	}
}

const syscallSIGTERM = syscall.SIGTERM

// startDaemonWith starts sbxd as d says (bin, env) on a fresh data dir.
func startDaemonWith(d *daemon) (*daemon, error) {
	fresh, err := newDaemon()
	if err != nil {
		return nil, err
	}
	fresh.bin, fresh.env = d.bin, d.env
	return fresh, fresh.start(nil)
}

// startDaemon starts sbxd on a fresh data dir; extra flags are appended.
// A port freePort gave (the daemon's own, or --preview-listen's) may be
// taken by someone else before sbxd binds it: then it starts again on new
// ones (extra is changed in place, so the caller sees the port used).
func startDaemon(extra []string) (*daemon, error) {
	for try := 1; ; try++ {
		d, err := newDaemon()
		if err != nil {
			return nil, err
		}
		err = d.start(extra)
		if err == nil || try == 3 || !strings.Contains(err.Error(), "address already in use") {
			return d, err
		}
		d.stop(true)
		for i := 0; i+1 < len(extra); i++ {
			if extra[i] == "--preview-listen" && extra[i+1] != "" {
				extra[i+1] = freePort()
			}
		}
	}
}

// newDaemon prepares (does not start) a daemon on a fresh data dir.
func newDaemon() (*daemon, error) {
	dir, err := os.MkdirTemp("", "sbx-e2e-")
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(templateCache(), 0o700); err != nil {
		return nil, err
	}
	if err := os.Symlink(templateCache(), filepath.Join(dir, "templates")); err != nil {
		return nil, err
	}
	d := &daemon{
		dir:    dir,
		socket: filepath.Join(dir, "sbxd.sock"),
		tcp:    freePort(),
		token:  randHex(16),
		tag:    randHex(2),
	}
	daemonsMu.Lock()
	daemons = append(daemons, d)
	daemonsMu.Unlock()
	return d, nil
}

func (d *daemon) start(extra []string) error {
	d.logPath = filepath.Join(d.dir, "sbxd.log")
	logf, err := os.OpenFile(d.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	args := append([]string{"--data-dir", d.dir, "--socket", d.socket, "--listen", d.tcp, "--tag", d.tag, "--log-level", "debug", "--default-template", "tiny",
		"--runsc", filepath.Join(binDir, "runsc"), "--agent", filepath.Join(binDir, "sbx-agent")}, extra...)
	bin := d.bin
	if bin == "" {
		bin = filepath.Join(binDir, "sbxd")
	}
	d.cmd = exec.Command(bin, args...)
	d.cmd.Env = append(append(os.Environ(), "SBX_TOKEN="+d.token), d.env...)
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.cmd.Start(); err != nil {
		return err
	}
	logf.Close()
	d.exited = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		cmd.Wait()
		close(done)
	}(d.cmd, d.exited)
	d.client, err = client.New("unix://" + d.socket)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err = d.client.Health(ctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-d.exited:
			log, _ := os.ReadFile(d.logPath)
			return fmt.Errorf("sbxd exited at start:\n%s", log)
		default:
		}
		time.Sleep(50 * time.Millisecond)
	}
	log, _ := os.ReadFile(d.logPath)
	return fmt.Errorf("sbxd did not come up: %v\n%s", err, log)
}

// startNoWait starts sbxd without waiting for it to serve.
func (d *daemon) startNoWait(t *testing.T) {
	t.Helper()
	bin := d.bin
	if bin == "" {
		bin = filepath.Join(binDir, "sbxd")
	}
	logf, err := os.OpenFile(d.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	d.cmd = exec.Command(bin, "--data-dir", d.dir, "--socket", d.socket, "--tag", d.tag, "--log-level", "debug",
		"--runsc", filepath.Join(binDir, "runsc"), "--agent", filepath.Join(binDir, "sbx-agent"))
	d.cmd.Env = append(os.Environ(), d.env...)
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d.exited = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		cmd.Wait()
		close(done)
	}(d.cmd, d.exited)
}

// kill ends sbxd abruptly (SIGKILL) or cleanly (SIGTERM), leaving sandboxes.
func (d *daemon) kill(sig syscall.Signal) {
	if d.cmd == nil || d.cmd.Process == nil {
		return
	}
	_ = d.cmd.Process.Signal(sig)
	<-d.exited
	d.cmd = nil
}

// stop ends sbxd and, with cleanup, removes every sandbox, namespace and rule
// it made and its data dir.
func (d *daemon) stop(cleanup bool) {
	if cleanup {
		d.stopOnce.Do(func() { d.stopAndClean() })
		return
	}
	d.kill(syscall.SIGTERM)
}

func (d *daemon) stopAndClean() {
	if d.cmd != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		if sbs, err := d.client.List(ctx); err == nil {
			for _, sb := range sbs {
				_ = deleteSandbox(ctx, d.client, sb.ID)
			}
		}
		cancel()
	}
	d.kill(syscall.SIGTERM)
	// Whatever is left (a test that failed half-way): runsc, namespaces, rules.
	runscRoot := filepath.Join(d.dir, "runsc")
	out, _ := exec.Command(filepath.Join(binDir, "runsc"), "--root", runscRoot, "list", "-quiet").Output()
	for _, id := range strings.Fields(string(out)) {
		exec.Command(filepath.Join(binDir, "runsc"), "--root", runscRoot, "delete", "-force", id).Run()
	}
	if nm, err := netns.New(netns.Config{Tag: d.tag}); err == nil {
		ids, _ := nm.List()
		for _, id := range ids {
			_ = nm.Delete(id)
		}
		_ = nm.Cleanup()
	}
	// A runsc restore a killed sbxd left in flight boots after the list
	// above (a sandbox of a removed data dir ran on for the rest of a CI
	// run): whatever still names the data dir, or lives in its cgroups,
	// is killed.
	killNaming(d.dir, "/sbx-"+d.tag+"/")
	ctrls, _ := os.ReadDir("/sys/fs/cgroup")
	for _, c := range ctrls {
		root := filepath.Join("/sys/fs/cgroup", c.Name(), "sbx-"+d.tag)
		kids, _ := os.ReadDir(root)
		for _, k := range kids {
			if k.IsDir() {
				os.Remove(filepath.Join(root, k.Name()))
			}
		}
		os.Remove(root)
	}
	os.Remove(filepath.Join(d.dir, "templates"))
	os.RemoveAll(d.dir)
}

// killNaming kills every process (this one's ancestors aside) whose
// command line holds dir or whose cgroup path holds cgroup, until none is
// left or 10 s have passed.
func killNaming(dir, cgroup string) {
	self := os.Getpid()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		found := false
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == self || pid == 1 {
				continue
			}
			if st, err := procfs.ReadStat(pid); err != nil || st.State == 'Z' {
				continue // gone, or gone but for its parent's wait
			}
			cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			cg, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
			if bytes.Contains(cmdline, []byte(dir+"/")) || bytes.Contains(cg, []byte(cgroup)) {
				found = true
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if !found {
			return
		}
	}
}

func (d *daemon) ensureTemplates() error {
	ctx := context.Background()
	for _, name := range []string{"tiny", "base"} {
		fmt.Printf("e2e: template %s (cached after the first build)\n", name)
		start := time.Now()
		if _, err := d.client.BuildTemplate(ctx, name); err != nil {
			return fmt.Errorf("build template %s: %w", name, err)
		}
		fmt.Printf("e2e: template %s ready in %s\n", name, time.Since(start).Round(time.Millisecond))
	}
	return nil
}

// result is what one sbx invocation did.
type result struct {
	stdout, stderr string
	code           int
}

// sbx runs the CLI against d with args.
func (d *daemon) sbx(t *testing.T, args ...string) result {
	t.Helper()
	return d.sbxIn(t, nil, args...)
}

func (d *daemon) sbxIn(t *testing.T, stdin []byte, args ...string) result {
	t.Helper()
	return d.run(t, stdin, []string{"SBX_HOST=unix://" + d.socket}, args...)
}

// sbxEnv runs the CLI with extra environment (which wins).
func (d *daemon) sbxEnv(t *testing.T, env []string, args ...string) result {
	t.Helper()
	return d.run(t, nil, env, args...)
}

func (d *daemon) run(t *testing.T, stdin []byte, env []string, args ...string) result {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "sbx"), args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("sbx %v: %v", args, err)
	}
	return result{stdout: out.String(), stderr: errb.String(), code: code}
}

// must runs sbx and fails the test unless it exits 0.
func (d *daemon) must(t *testing.T, args ...string) string {
	t.Helper()
	r := d.sbx(t, args...)
	if r.code != 0 {
		t.Fatalf("sbx %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// newSandbox creates a sandbox that the test deletes when it ends.
func (d *daemon) newSandbox(t *testing.T, args ...string) string {
	t.Helper()
	out := d.must(t, append([]string{"new"}, args...)...)
	id := strings.TrimSpace(out)
	if !idRE.MatchString(id) {
		t.Fatalf("sbx new printed %q, want an id", out)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = deleteSandbox(ctx, d.client, id)
	})
	return id
}

// jsonOut runs sbx --json and decodes its stdout into v.
func (d *daemon) jsonOut(t *testing.T, v any, args ...string) {
	t.Helper()
	out := d.must(t, append([]string{"--json"}, args...)...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("sbx --json %v: %v\n%s", args, err, out)
	}
}

// info is `sbx --json info ID`: {"sandbox": {...}}.
func (d *daemon) info(t *testing.T, id string) api.Sandbox {
	t.Helper()
	var out struct{ Sandbox *api.Sandbox }
	d.jsonOut(t, &out, "info", id)
	if out.Sandbox == nil {
		t.Fatalf("sbx --json info %s: no sandbox object", id)
	}
	return *out.Sandbox
}

// list is `sbx --json list`: {"sandboxes": [...]}.
func (d *daemon) list(t *testing.T) []api.Sandbox {
	t.Helper()
	var out struct{ Sandboxes []api.Sandbox }
	d.jsonOut(t, &out, "list")
	return out.Sandboxes
}

// newestImageFile is the newest file memory/NAME of the daemon's images
// and its age: the one a stop or snapshot just wrote, when the tests run
// one at a time ("" if there is none).
func (d *daemon) newestImageFile(name string) (string, time.Duration) {
	files, _ := filepath.Glob(filepath.Join(d.dir, "images", "im_*", "memory", name))
	var newest string
	var at time.Time
	for _, p := range files {
		if fi, err := os.Stat(p); err == nil && fi.ModTime().After(at) {
			newest, at = p, fi.ModTime()
		}
	}
	return newest, time.Since(at)
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	// Looks back off from 50 ms to 250: many conditions are an exec in a
	// sandbox (a CLI process and a process inside), and 20 of them a
	// second through a long wait took the CPU the awaited work needed.
	pause := 50 * time.Millisecond
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(pause)
		pause = min(2*pause, 250*time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s", limit, what)
}

// deleteSandbox deletes sandbox id, as the tests' cleanups do.
func deleteSandbox(ctx context.Context, c *client.Client, id string) error {
	_, err := c.Sandbox(id).Delete(ctx)
	return err
}

// flatClient is the client in the (ctx, id, ...) shape of flaky.SDK, for
// tests that build api requests themselves.
type flatClient struct{ flaky.SDK }

func sdk(c *client.Client) flatClient { return flatClient{flaky.Adapt(c)} }

// GetExec describes exec execID of sandbox id.
func (f flatClient) GetExec(ctx context.Context, id, execID string) (*api.Exec, error) {
	r, err := f.C.Sandbox(id).Process(execID).Info(ctx)
	if err != nil {
		return nil, err
	}
	return r.API(), nil
}

// rawAPI sends one request to sbxd's unix socket as it is (for what the
// Go client's types cannot say: a bad duration, a size as a string) and
// returns the status and the body.
func (d *daemon) rawAPI(t testing.TB, method, path string, body any) (int, []byte) {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, "http://sbxd"+path, r)
	if err != nil {
		t.Fatal(err)
	}
	// no keep-alive: a poll of /metrics every 100 ms would otherwise
	// leave sbxd a connection (and a goroutine) idle for 30 s per call,
	// and goroutinesBack would count its own polls
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dl net.Dialer
		return dl.DialContext(ctx, "unix", d.socket)
	}}}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, b
}

// memOpt is WithMemory when memory is set.
func memOpt(memory bool) []client.SnapshotOption {
	if memory {
		return []client.SnapshotOption{client.WithMemory()}
	}
	return nil
}

// Resume resumes sandbox id, with its memory required or not.
func (f flatClient) Resume(ctx context.Context, id string, requireMemory bool) (*api.Sandbox, error) {
	var opts []client.ResumeOption
	if requireMemory {
		opts = append(opts, client.RequireMemory())
	}
	return f.C.Sandbox(id).Resume(ctx, opts...)
}

// Stat describes path in sandbox id.
func (f flatClient) Stat(ctx context.Context, id, path string) (*api.FileInfo, error) {
	return f.C.Sandbox(id).Files().Stat(ctx, path)
}

// ReadDir lists path in sandbox id.
func (f flatClient) ReadDir(ctx context.Context, id, path string) ([]api.FileInfo, error) {
	return f.C.Sandbox(id).Files().ReadDir(ctx, path)
}

// Ports lists the ports listening in sandbox id.
func (f flatClient) Ports(ctx context.Context, id string) ([]api.Port, error) {
	return f.C.Sandbox(id).Ports(ctx)
}

// Templates lists the templates.
func (f flatClient) Templates(ctx context.Context) ([]api.Template, error) { return f.C.Templates(ctx) }

// BuildTemplate builds template name (base or tiny), again when force.
func (f flatClient) BuildTemplate(ctx context.Context, name string, force bool, progress func(api.Progress)) (*api.Template, error) {
	var opts []client.TemplateOption
	if force {
		opts = append(opts, client.WithForce())
	}
	if progress != nil {
		opts = append(opts, client.WithProgress(progress))
	}
	return f.C.BuildTemplate(ctx, name, opts...)
}

// ImportTemplateFrom imports source as template name.
func (f flatClient) ImportTemplateFrom(ctx context.Context, name, source string, progress func(api.Progress)) (*api.Template, error) {
	var opts []image.Option
	if progress != nil {
		opts = append(opts, image.WithProgress(progress))
	}
	return image.Import(ctx, f.C, name, source, opts...)
}

// RemoveTemplate removes template name.
func (f flatClient) RemoveTemplate(ctx context.Context, name string) (*api.Template, error) {
	return f.C.RemoveTemplate(ctx, name)
}

// Events sends sandbox id's events to fn, following them when follow.
func (f flatClient) Events(ctx context.Context, id string, follow bool, fn func(api.Event) error) error {
	var opts []client.EventsOption
	if follow {
		opts = append(opts, client.Follow())
	}
	return f.C.Sandbox(id).Events(ctx, fn, opts...)
}

// reapOrphanShims reaps the exec shims (`sbxd __shim`) of the daemons a
// test killed: as this process is a subreaper (ReapSandboxes) they come to
// it when their daemon dies, and stayed zombies for the rest of the run (a
// hundred of them in one). A zombie is reaped only once it has been one
// for half a minute: a child an exec.Cmd waits for (a daemon, an sbxd run
// for its exit code) is reaped by its Wait long before.
func reapOrphanShims() {
	self := os.Getpid()
	type seen struct {
		start string
		since time.Time
	}
	zombies := map[int]seen{}
	for range time.Tick(5 * time.Second) {
		now := time.Now()
		ents, _ := os.ReadDir("/proc")
		next := map[int]seen{}
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			st, err := procfs.ReadStat(pid)
			if err != nil || st.State != 'Z' || st.PPid != self || (st.Comm != "sbxd" && st.Comm != "sbx-shim") {
				continue
			}
			z, ok := zombies[pid]
			if !ok || z.start != st.Start {
				z = seen{st.Start, now}
			}
			if now.Sub(z.since) < 30*time.Second {
				next[pid] = z
				continue
			}
			var ws syscall.WaitStatus
			_, _ = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		}
		zombies = next
	}
}
