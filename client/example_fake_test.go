package client_test

import (
	"archive/tar"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"sbx.dev/sbx/api"
)

// The examples run against fakeSbxd, a model of sbxd that speaks the
// routes they use as sbxd does (JSON answers, server-sent events, the
// preview proxy routing by host name) and plays the sandbox's part: a
// project whose tests pass, a server on 8080, a test that fails on seed 3
// and leaves a helper listening on 9000. TestMain points $SBX_HOST at it.
func TestMain(m *testing.M) {
	f := &fakeSbxd{sbs: map[string]*fakeSandbox{}}
	srv := httptest.NewServer(f)
	f.addr = srv.Listener.Addr().(*net.TCPAddr).String()
	os.Setenv("SBX_HOST", "tcp://"+f.addr)
	os.Setenv("SBX_TOKEN", "")
	code := m.Run()
	srv.Close()
	os.Exit(code)
}

type fakeSbxd struct {
	addr string
	mu   sync.Mutex
	n    int
	sbs  map[string]*fakeSandbox
}

type fakeSandbox struct {
	api.Sandbox
	files   map[string][]byte
	ports   []api.Port
	runs    int
	execs   int
	stopped bool
}

var previewHostRE = regexp.MustCompile(`^([0-9]+)-(sb_[0-9]+)\.localhost:`)

func (f *fakeSbxd) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if m := previewHostRE.FindStringSubmatch(r.Host); m != nil { // the preview proxy
		sb := f.sbs[m[2]]
		for _, p := range sbPorts(sb) {
			if fmt.Sprint(p.Port) == m[1] {
				fmt.Fprintf(w, "served by pid %d\n", p.Pid)
				return
			}
		}
		http.Error(w, "nothing listens", http.StatusBadGateway)
		return
	}
	if r.Method == http.MethodPost && r.URL.Path == "/v1/sandboxes" {
		var req api.CreateRequest
		json.NewDecoder(r.Body).Decode(&req)
		sb := f.add(api.Sandbox{Name: req.Name, Template: req.Template, Meta: req.Meta})
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(sb.Sandbox)
		return
	}
	if r.Method == http.MethodGet && r.URL.Path == "/v1/sandboxes" {
		var out []api.Sandbox
		for i := 1; i <= f.n; i++ {
			sb := f.sbs[fmt.Sprintf("sb_%d", i)]
			if sb == nil || (r.URL.Query().Get("parent") != "" && sb.Parent != r.URL.Query().Get("parent")) {
				continue
			}
			ok := true
			for _, kv := range r.URL.Query()["meta"] {
				k, v, _ := strings.Cut(kv, "=")
				ok = ok && sb.Meta[k] == v
			}
			if ok {
				out = append(out, sb.Sandbox)
			}
		}
		json.NewEncoder(w).Encode(out)
		return
	}
	rest, ok := strings.CutPrefix(r.URL.Path, "/v1/sandboxes/")
	id, route, _ := strings.Cut(rest, "/")
	sb := f.sbs[id]
	if !ok || sb == nil {
		fakeErr(w, api.ErrNotFound, "sandbox "+id+" not found")
		return
	}
	q := r.URL.Query()
	switch r.Method + " " + route {
	case "GET ":
		json.NewEncoder(w).Encode(sb.Sandbox)
	case "DELETE ":
		delete(f.sbs, id)
		json.NewEncoder(w).Encode(api.DeleteResult{ID: id})
	case "PUT files":
		if q.Get("tar") == "" {
			b, _ := io.ReadAll(r.Body)
			sb.files[q.Get("path")] = b
		} else {
			tr := tar.NewReader(r.Body)
			for {
				h, err := tr.Next()
				if err != nil {
					break
				}
				if h.Typeflag == tar.TypeReg {
					b, _ := io.ReadAll(tr)
					sb.files[path.Join(q.Get("path"), h.Name)] = b
				}
			}
		}
		w.WriteHeader(http.StatusNoContent)
	case "GET files":
		b, ok := sb.files[q.Get("path")]
		if !ok {
			fakeErr(w, api.ErrNotFound, q.Get("path")+" does not exist")
			return
		}
		w.Write(b)
	case "GET fs/stat":
		if _, ok := sb.files[q.Get("path")]; !ok {
			fakeErr(w, api.ErrNotFound, q.Get("path")+" does not exist")
			return
		}
		json.NewEncoder(w).Encode(api.FileInfo{Name: path.Base(q.Get("path")), Path: q.Get("path"), Mode: "-rw-r--r--"})
	case "POST exec":
		f.exec(w, r, sb)
	case "GET ports":
		json.NewEncoder(w).Encode(sbPorts(sb))
	case "POST snapshots":
		var req api.SnapshotRequest
		json.NewDecoder(r.Body).Decode(&req)
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(api.Snapshot{Name: req.Name, SandboxID: id, Memory: req.Memory, CreatedAt: time.Now()})
	case "POST fork":
		var req api.ForkRequest
		json.NewDecoder(r.Body).Decode(&req)
		var kids []api.Sandbox
		var ids []string
		for range max(req.Count, 1) {
			meta := map[string]string{}
			for k, v := range sb.Meta {
				meta[k] = v
			}
			for k, v := range req.Meta {
				meta[k] = v
			}
			kid := f.add(api.Sandbox{Template: sb.Template, Parent: id, Meta: meta, MemoryRestored: req.Memory})
			if req.Memory {
				kid.ports = sb.ports
			}
			kids, ids = append(kids, kid.Sandbox), append(ids, kid.ID)
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fakeSSE(w, api.ForkForking, api.ForkEvent{Event: api.ForkForking, IDs: ids})
		for i := range kids {
			fakeSSE(w, api.ForkReady, api.ForkEvent{Event: api.ForkReady, Sandbox: &kids[i]})
		}
		fakeSSE(w, api.ForkDone, api.ForkEvent{Event: api.ForkDone, Sandboxes: kids})
	case "POST preview":
		var req api.PreviewRequest
		json.NewDecoder(r.Body).Decode(&req)
		_, port, _ := net.SplitHostPort(f.addr)
		json.NewEncoder(w).Encode(api.Preview{Port: req.Port, URL: fmt.Sprintf("http://%d-%s.localhost:%s/", req.Port, id, port)})
	case "POST stop":
		sb.stopped, sb.State = true, api.StateStopped
		json.NewEncoder(w).Encode(sb.Sandbox)
	case "POST resume":
		sb.stopped, sb.State, sb.MemoryRestored = false, api.StateReady, true
		json.NewEncoder(w).Encode(sb.Sandbox)
	default:
		fakeErr(w, api.ErrNotFound, "no route "+r.Method+" "+r.URL.Path)
	}
}

func (f *fakeSbxd) add(sb api.Sandbox) *fakeSandbox {
	f.n++
	sb.ID, sb.State, sb.CreatedAt = fmt.Sprintf("sb_%d", f.n), api.StateReady, time.Now()
	s := &fakeSandbox{Sandbox: sb, files: map[string][]byte{}}
	f.sbs[sb.ID] = s
	return s
}

func sbPorts(sb *fakeSandbox) []api.Port {
	if sb == nil || sb.stopped {
		return nil
	}
	return sb.ports
}

// exec plays the sandbox: the project's tests pass and write a report; a
// detached python3 serves 8080; flaky-test fails on seed 3 and leaves a
// helper listening on 9000.
func (f *fakeSbxd) exec(w http.ResponseWriter, r *http.Request, sb *fakeSandbox) {
	var req api.ExecRequest
	json.NewDecoder(r.Body).Decode(&req)
	sb.execs++
	x := api.Exec{ID: fmt.Sprintf("ex_%d", sb.execs), SandboxID: sb.ID, Cmd: req.Cmd, State: api.ExecRunning, Pid: 41 + sb.execs}
	if sb.stopped {
		fakeErr(w, api.ErrConflict, "sandbox "+sb.ID+" is stopped")
		return
	}
	if req.Detach {
		if req.Cmd[0] == "python3" {
			sb.ports = append(sb.ports, api.Port{Proto: "tcp", Address: "0.0.0.0", Port: 8080, Pid: x.Pid, Command: "python3"})
		}
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(x)
		return
	}
	code := 127
	switch {
	case req.Cmd[0] == "./test.sh" && req.Cwd == "/work" && sb.files["/work/test.sh"] != nil:
		sb.files["/work/report.txt"] = []byte("ok  \texample.com/project\t0.012s\n")
		code = 0
	case req.Cmd[0] == "./flaky-test":
		code = 0
		if len(req.Env) == 1 && req.Env[0] == "SEED=3" {
			code = 1
			sb.ports = append(sb.ports, api.Port{Proto: "tcp", Address: "0.0.0.0", Port: 9000, Pid: 77, Command: "flaky-helper"})
		}
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fakeSSE(w, api.ExecStarted, api.ExecEvent{Event: api.ExecStarted, Exec: &x})
	x.State, x.ExitCode = api.ExecExited, &code
	fakeSSE(w, api.ExecExit, api.ExecEvent{Event: api.ExecExit, Exec: &x})
}

func fakeErr(w http.ResponseWriter, kind error, msg string) {
	status, code := api.StatusOf(kind)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(api.ErrorBody{Error: &api.ErrorDetail{Code: code, Message: msg}})
}

func fakeSSE(w io.Writer, name string, v any) {
	b, _ := json.Marshal(v)
	fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, b)
}
