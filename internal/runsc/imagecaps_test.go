package runsc

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// writeStateFile writes a checkpoint.img whose metadata holds spec, as
// runsc writes it, followed by some state bytes.
func writeStateFile(t *testing.T, dir string, spec *specs.Spec) {
	t.Helper()
	all, _ := json.Marshal(map[string]*specs.Spec{"sb_parent": spec})
	meta, _ := json.Marshal(map[string]string{specsMetadataKey: string(all), "compression": "none"})
	b := []byte(stateMagic)
	b = binary.BigEndian.AppendUint64(b, uint64(len(meta)))
	b = append(b, meta...)
	b = append(b, "state follows"...)
	if err := os.WriteFile(filepath.Join(dir, stateFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func bundleCaps(t *testing.T, bundle string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return s.Process.Capabilities.Bounding
}

func TestDefaultCaps(t *testing.T) {
	for _, c := range []string{"CAP_SYS_ADMIN", "CAP_NET_ADMIN", "CAP_DAC_READ_SEARCH", "CAP_SYS_MODULE", "CAP_SYS_RAWIO"} {
		if slices.Contains(defaultCaps, c) {
			t.Errorf("defaultCaps has %s", c)
		}
	}
	// docker's default set, and ptrace for gdb
	for _, c := range []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
		"CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT",
		"CAP_KILL", "CAP_AUDIT_WRITE", "CAP_SYS_PTRACE"} {
		if !slices.Contains(defaultCaps, c) {
			t.Errorf("defaultCaps lacks %s", c)
		}
	}
	s := Spec(SpecOptions{Rootfs: "/r", AgentDir: "/a", EtcDir: "/e"})
	if !slices.Equal(s.Process.Capabilities.Bounding, defaultCaps) || !slices.Equal(Process([]string{"x"}, nil, "").Capabilities.Effective, defaultCaps) {
		t.Errorf("the sandbox's and an exec's capabilities are not defaultCaps")
	}
}

func TestSpecNetwork(t *testing.T) {
	for _, tc := range []struct {
		name, netns, flag string
		network           string
	}{
		{"sandbox", "/run/netns/x", "--network=sandbox", ""},
		{"none", "", "--network=none", NetworkNone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Spec(SpecOptions{Rootfs: "/r", AgentDir: "/a", EtcDir: "/e", NetNS: tc.netns})
			var found bool
			for _, ns := range s.Linux.Namespaces {
				if ns.Type == specs.NetworkNamespace {
					found = true
					if ns.Path != tc.netns {
						t.Errorf("network namespace path %q, want %q", ns.Path, tc.netns)
					}
				}
			}
			if !found {
				t.Errorf("no network namespace in the spec: the sandbox would share the host's")
			}
			if got := sandboxFlags(RunOptions{Network: tc.network}); got[0] != tc.flag {
				t.Errorf("flags %v, want %s first", got, tc.flag)
			}
		})
	}
}

func TestKeepImageCapabilities(t *testing.T) {
	old := &specs.LinuxCapabilities{Bounding: legacyCaps, Effective: legacyCaps, Permitted: legacyCaps}
	tests := []struct {
		name    string
		image   *specs.LinuxCapabilities // nil: no state file
		want    []string
		wantErr string
	}{
		{"no image metadata: the bundle as it is", nil, defaultCaps, ""},
		{"an image of today", &specs.LinuxCapabilities{Bounding: defaultCaps, Effective: defaultCaps, Permitted: defaultCaps}, defaultCaps, ""},
		{"an image from before: its own set", old, legacyCaps, ""},
		{"an image asking for more than sbx ever gave", &specs.LinuxCapabilities{Bounding: append(slices.Clone(legacyCaps), "CAP_SYS_MODULE")}, nil, "CAP_SYS_MODULE"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bundle, image := t.TempDir(), t.TempDir()
			if err := WriteBundle(bundle, SpecOptions{Rootfs: "/r", AgentDir: "/a", EtcDir: "/e", NetNS: "/n"}); err != nil {
				t.Fatal(err)
			}
			if tc.image != nil {
				writeStateFile(t, image, &specs.Spec{Process: &specs.Process{Capabilities: tc.image}})
			}
			err := keepImageCapabilities(bundle, image)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want an error naming %s", err, tc.wantErr)
				}
				if got := bundleCaps(t, bundle); !slices.Equal(got, defaultCaps) {
					t.Errorf("the bundle changed after a refusal: %v", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := bundleCaps(t, bundle); !slices.Equal(got, tc.want) {
				t.Errorf("bundle capabilities %v, want %v", got, tc.want)
			}
		})
	}
	// garbage where the state file is: not ours to judge
	bundle, image := t.TempDir(), t.TempDir()
	WriteBundle(bundle, SpecOptions{Rootfs: "/r", AgentDir: "/a", EtcDir: "/e"})
	os.WriteFile(filepath.Join(image, stateFile), []byte("not a state file at all"), 0o600)
	if err := keepImageCapabilities(bundle, image); err != nil {
		t.Errorf("garbage state file: %v", err)
	}
	// a huge metadata length is not read
	b := binary.BigEndian.AppendUint64([]byte(stateMagic), 1<<40)
	os.WriteFile(filepath.Join(image, stateFile), b, 0o600)
	if _, err := imageCapabilities(image); err == nil || !strings.Contains(err.Error(), "over") {
		t.Errorf("huge metadata: got %v, want a refusal", err)
	}
}

// startBusybox runs sandbox id on a busybox rootfs with spec (edited by
// edit) and network none, and returns its bundle, console and overlay.
func startBusybox(t *testing.T, d *Driver, id string, edit func(*specs.Spec)) RunOptions {
	t.Helper()
	dir := t.TempDir()
	etc := filepath.Join(dir, "etc")
	os.MkdirAll(etc, 0o755)
	for _, f := range []string{"resolv.conf", "hosts", "hostname"} {
		os.WriteFile(filepath.Join(etc, f), nil, 0o644)
	}
	agent := filepath.Join(dir, "agent")
	os.MkdirAll(agent, 0o755)
	spec := Spec(SpecOptions{Hostname: "t", Rootfs: busyboxRootfs(t), AgentDir: agent, EtcDir: etc})
	spec.Process.Args = []string{"/bin/sh", "-c", "exec sleep 1000"}
	if edit != nil {
		edit(spec)
	}
	bundle := filepath.Join(dir, "bundle")
	os.MkdirAll(bundle, 0o700)
	writeSpec(t, bundle, spec)
	console := filepath.Join(dir, "console.log")
	overlay := filepath.Join(dir, "upper")
	os.MkdirAll(overlay, 0o700)
	o := RunOptions{Bundle: bundle, Console: console, Overlay: overlay, Network: NetworkNone}
	t.Cleanup(func() { d.Delete(context.Background(), id) })
	if err := d.Run(context.Background(), id, o); err != nil {
		t.Fatal(err)
	}
	return o
}

// TestCapabilitiesInside: root in a sandbox of today's spec cannot mount;
// with the old set it could (the control).
func TestCapabilitiesInside(t *testing.T) {
	d := testDriver(t)
	ctx := context.Background()
	legacy := func(s *specs.Spec) {
		s.Process.Capabilities = &specs.LinuxCapabilities{Bounding: legacyCaps, Effective: legacyCaps, Permitted: legacyCaps}
	}
	for _, tc := range []struct {
		name      string
		edit      func(*specs.Spec)
		caps      []string
		wantMount bool
	}{
		{"today", nil, defaultCaps, false},
		{"the old set", legacy, legacyCaps, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "sbxtest-caps-" + strings.ReplaceAll(tc.name, " ", "-")
			startBusybox(t, d, id, tc.edit)
			var out bytes.Buffer
			p := Process([]string{"/bin/busybox", "mount", "-t", "tmpfs", "x", "/tmp"}, nil, "/")
			p.Capabilities = &specs.LinuxCapabilities{Bounding: tc.caps, Effective: tc.caps, Permitted: tc.caps}
			pf := filepath.Join(t.TempDir(), "process.json")
			if err := WriteProcess(pf, p); err != nil {
				t.Fatal(err)
			}
			code, err := d.Exec(ctx, id, ExecOptions{Process: pf}, nil, &out, &out)
			if err != nil {
				t.Fatal(err)
			}
			if (code == 0) != tc.wantMount {
				t.Errorf("mount as root: exit %d (%s), want success %v", code, strings.TrimSpace(out.String()), tc.wantMount)
			}
		})
	}
}

// TestRestoreOldImage: an image taken with the old capability set restores
// into today's bundle (runsc would refuse the difference), and a sandbox
// without a network checkpoints and restores as one.
func TestRestoreOldImage(t *testing.T) {
	d := testDriver(t)
	ctx := context.Background()
	const src, dst = "sbxtest-oldcaps", "sbxtest-oldcaps-restored"
	o := startBusybox(t, d, src, func(s *specs.Spec) {
		s.Process.Capabilities = &specs.LinuxCapabilities{Bounding: legacyCaps, Effective: legacyCaps, Permitted: legacyCaps}
		s.Process.Args = []string{"/bin/sh", "-c", "echo 41 > /tmp/n; exec sleep 1000"}
	})
	image := t.TempDir()
	if err := d.Checkpoint(ctx, src, image, false); err != nil {
		t.Fatal(err)
	}
	if caps, err := imageCapabilities(image); err != nil || !slices.Equal(caps.Bounding, legacyCaps) {
		t.Fatalf("a real image's capabilities: %v %v, want the old set", caps, err)
	}
	d.Delete(ctx, src)
	// today's bundle, as sbx writes it for a restore
	spec := Spec(SpecOptions{Hostname: "t", Rootfs: "/", AgentDir: "/", EtcDir: "/"})
	var old specs.Spec
	b, _ := os.ReadFile(filepath.Join(o.Bundle, "config.json"))
	json.Unmarshal(b, &old)
	old.Process.Capabilities = spec.Process.Capabilities
	writeSpec(t, o.Bundle, &old)
	t.Cleanup(func() { d.Delete(context.Background(), dst) })
	if err := d.Restore(ctx, dst, RestoreOptions{RunOptions: o, ImageDir: image}); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if code, err := d.Exec(ctx, dst, ExecOptions{Args: []string{"/bin/cat", "/tmp/n"}}, nil, &out, nil); err != nil || code != 0 || out.String() != "41\n" {
		t.Errorf("after the restore: exit %d %v %q, want 41", code, err, out.String())
	}
}

// TestKeepImageRlimits: an image taken with other limits (sbx's soft limit
// on open files was 1<<20) restores with the image's, which runsc compares;
// an image of today leaves the bundle as it is.
func TestKeepImageRlimits(t *testing.T) {
	old := []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1 << 20, Soft: 1 << 20}, {Type: "RLIMIT_NPROC", Hard: 512, Soft: 512}}
	for _, tc := range []struct {
		name  string
		image []specs.POSIXRlimit
	}{
		{"an image from before", old},
		{"an image of today", rlimits(512)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bundle, image := t.TempDir(), t.TempDir()
			if err := WriteBundle(bundle, SpecOptions{Rootfs: "/r", AgentDir: "/a", EtcDir: "/e", Pids: 512}); err != nil {
				t.Fatal(err)
			}
			before, _ := os.ReadFile(filepath.Join(bundle, "config.json"))
			var cur specs.Spec
			if err := json.Unmarshal(before, &cur); err != nil {
				t.Fatal(err)
			}
			writeStateFile(t, image, &specs.Spec{Process: &specs.Process{Capabilities: cur.Process.Capabilities, Rlimits: tc.image}, Mounts: cur.Mounts})
			if err := keepImageCapabilities(bundle, image); err != nil {
				t.Fatal(err)
			}
			b, _ := os.ReadFile(filepath.Join(bundle, "config.json"))
			var s specs.Spec
			if err := json.Unmarshal(b, &s); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(s.Process.Rlimits, tc.image) {
				t.Errorf("bundle rlimits %+v, want the image's %+v", s.Process.Rlimits, tc.image)
			}
			if tc.name == "an image of today" && !bytes.Equal(b, before) {
				t.Errorf("an image of today rewrote the bundle")
			}
		})
	}
	if r := rlimits(0); len(r) != 1 || r[0].Soft != 1024 || r[0].Hard < 1<<16 {
		t.Errorf("rlimits(0) = %+v: want open files 1024 soft, a high hard limit", r)
	}
}
