package e2e

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
)

// sparseSetup makes, as uid 1000 in a sandbox with a 100 MiB disk, the
// issue's sparse file (3,000,000,001 bytes, a byte set near its end), a
// terabyte of nothing, and a file of data and holes; sparseCheck reads them
// back: sizes, data, and the room left on the disk.
const sparseSetup = `cd /tmp && truncate -s 3000000001 sparse && printf X | dd of=sparse bs=1 seek=3000000000 conv=notrunc 2>/dev/null && ` +
	`truncate -s 1099511627776 tera && ` +
	`printf HEAD > holey && printf MID | dd of=holey bs=1 seek=50000000 conv=notrunc 2>/dev/null && printf TAIL | dd of=holey bs=1 seek=90000000 conv=notrunc 2>/dev/null && ` +
	`truncate -s 100000000 holey && sync`

const sparseCheck = `cd /tmp && for f in sparse tera holey; do echo "$f $(stat -c %s $f)"; done; ` +
	`dd if=sparse bs=1 skip=3000000000 count=1 2>/dev/null; echo; ` +
	`head -c 4 holey; dd if=holey bs=1 skip=50000000 count=3 2>/dev/null; dd if=holey bs=1 skip=90000000 count=4 2>/dev/null; echo; ` +
	`dd if=holey bs=1 skip=60000000 count=8 2>/dev/null | od -An -c | tr -d ' \n'; echo; ` +
	// holes cost nothing: 80 of the disk's 100 MiB are still free (gVisor's
	// stat counts a file's size, not its pages, so du cannot tell)
	`dd if=/dev/zero of=fill bs=1M count=80 2>/dev/null && rm fill && echo room`

const sparseWant = "sparse 3000000001\ntera 1099511627776\nholey 100000000\nX\nHEADMIDTAIL\n\\0\\0\\0\\0\\0\\0\\0\\0\nroom\n"

// TestSparseCaptures plays issue 22's first attack: a sparse file of
// 3,000,000,001 bytes (and one of a terabyte) on a 100 MiB disk. Every disk
// capture (a disk snapshot, a disk fork, a stop's disk) holds their data
// only, and restores them: same sizes, same bytes, still holes.
func TestSparseCaptures(t *testing.T) {
	d := shared
	ctx := context.Background()
	sb := newSDKSandbox(t, d, client.WithTemplate("tiny"), client.WithDiskLimit(100<<20))
	var setupErr strings.Builder
	res, err := sb.Exec(ctx, client.Shell(sparseSetup), client.WithUser("1000"), client.WithStderr(&setupErr), client.WithTimeout(time.Minute))
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("make the sparse files: exit %d %v: %s", res.ExitCode, err, setupErr.String())
	}
	check := func(what string, s *client.Sandbox) {
		t.Helper()
		var out, errOut strings.Builder
		res, err := s.Exec(ctx, client.Shell(sparseCheck), client.WithStdout(&out), client.WithStderr(&errOut), client.WithTimeout(2*time.Minute))
		if err != nil || res.ExitCode != 0 || out.String() != sparseWant {
			t.Errorf("%s: the sparse files read %q (exit %d %v: %s), want %q", what, out.String(), res.ExitCode, err, errOut.String(), sparseWant)
		}
	}
	check("the source", sb)
	// the newest image's disk.tar: its data, a few maps and headers
	newestTar := func(t *testing.T) string {
		t.Helper()
		tars, _ := filepath.Glob(filepath.Join(d.dir, "images", "im_*", "disk.tar"))
		var newest string
		var at time.Time
		for _, p := range tars {
			if fi, err := os.Stat(p); err == nil && fi.ModTime().After(at) {
				newest, at = p, fi.ModTime()
			}
		}
		if newest == "" || time.Since(at) > 2*time.Minute {
			t.Fatal("found no fresh disk.tar")
		}
		return newest
	}
	small := func(t *testing.T, tar string) {
		t.Helper()
		fi, err := os.Stat(tar)
		if err != nil {
			t.Fatal(err)
		}
		if n := duBytes(tar); fi.Size() > 1<<20 || n > 2<<20 {
			t.Errorf("%s holds %d bytes (%d on disk), want the files' data: under 1 MiB", tar, fi.Size(), n)
		}
	}

	t.Run("disk snapshot", func(t *testing.T) {
		name := "sparse-" + randHex(3)
		if _, err := sb.Snapshot(ctx, name); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.client.DeleteSnapshot(context.Background(), name) })
		small(t, newestTar(t))
		info, err := d.client.Create(ctx, client.WithFrom(name))
		if err != nil {
			t.Fatalf("a sandbox from the disk snapshot: %v", err)
		}
		t.Cleanup(func() { _ = deleteSandbox(context.Background(), d.client, info.ID) })
		check("from the disk snapshot", d.client.Sandbox(info.ID))
	})

	t.Run("disk fork", func(t *testing.T) {
		kids, err := sb.Fork(ctx)
		if err != nil {
			t.Fatalf("disk fork: %v", err)
		}
		for _, k := range kids {
			t.Cleanup(func() { _ = deleteSandbox(context.Background(), d.client, k.ID) })
			check("the disk fork", d.client.Sandbox(k.ID))
			// a fork of the fork: a capture of a restored sparse file
			grand, err := d.client.Sandbox(k.ID).Fork(ctx)
			if err != nil {
				t.Fatalf("a disk fork of the fork: %v", err)
			}
			for _, g := range grand {
				t.Cleanup(func() { _ = deleteSandbox(context.Background(), d.client, g.ID) })
				check("a disk fork of the fork", d.client.Sandbox(g.ID))
			}
		}
	})

	t.Run("stop and cold-boot resume", func(t *testing.T) {
		if _, err := sb.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		tar := newestTar(t)
		small(t, tar)
		// the resume must boot from the disk: the memory image is made unusable
		if err := os.WriteFile(filepath.Join(filepath.Dir(tar), "memory", "checkpoint.img"), []byte("not an image"), 0o600); err != nil {
			t.Fatal(err)
		}
		back, err := sb.Resume(ctx)
		if err != nil {
			t.Fatalf("resume from the disk: %v", err)
		}
		if back.MemoryRestored {
			t.Fatalf("the damaged image was restored: %+v", back)
		}
		check("after a cold-boot resume", sb)
	})
}

// TestDiskCaptureBounded: a disk capture is bounded by what the sandbox's
// disk limit allows. Files cost a disk nothing when they are empty, but
// each costs the tar a header: 20,000 empty files with 3.8 KB paths on a
// 16 MiB disk make a tar of ~100 MiB, past the 82 MiB such a disk allows
// (its limit, 64 MiB of headers and an eighth). The snapshot and the fork
// fail saying so, nothing is left in the images, and the sandbox runs on.
func TestDiskCaptureBounded(t *testing.T) {
	d := shared
	ctx := context.Background()
	sb := newSDKSandbox(t, d, client.WithTemplate("tiny"), client.WithDiskLimit(16<<20))
	var setupErr strings.Builder
	res, err := sb.Exec(ctx, client.Shell(`n=$(printf 'n%.0s' $(seq 200)); p=/deep; for i in $(seq 18); do p=$p/$n; done; mkdir -p $p && cd $p && `+
		`seq 1 20000 | sed "s/^/$n/" | xargs touch && ls | wc -l`), client.WithStderr(&setupErr), client.WithTimeout(5*time.Minute))
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("make the files: exit %d %v: %s", res.ExitCode, err, setupErr.String())
	}
	images := func() []string {
		m, _ := filepath.Glob(filepath.Join(d.dir, "images", "im_*"))
		return m
	}
	before := map[string]bool{}
	for _, im := range images() {
		before[im] = true
	}
	name := "bounded-" + randHex(3)
	if _, err := sb.Snapshot(ctx, name); !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), "more than a disk limit of 16.0 MiB allows") {
		tars, _ := filepath.Glob(filepath.Join(d.dir, "images", "im_*", "disk.tar"))
		for _, p := range tars {
			fi, _ := os.Stat(p)
			t.Logf("%s: %d", p, fi.Size())
		}
		_ = d.client.DeleteSnapshot(context.Background(), name)
		t.Errorf("a disk snapshot past the bound: %v, want ErrConflict naming the disk limit", err)
	}
	if kids, err := sb.Fork(ctx); err == nil || !strings.Contains(err.Error(), "disk limit") {
		for _, k := range kids {
			_ = deleteSandbox(context.Background(), d.client, k.ID)
		}
		t.Errorf("a disk fork past the bound: %v, want an error naming the disk limit", err)
	}
	// Compare sets, not counts: the shared daemon may still be deleting
	// images of earlier tests' sandboxes, and that is no partial capture.
	for _, im := range images() {
		if !before[im] {
			t.Errorf("image %s appeared during the failed captures: a partial capture was kept", filepath.Base(im))
		}
	}
	if out, err := sb.Exec(ctx, client.Shell("echo alive")); err != nil || out.ExitCode != 0 {
		t.Errorf("the sandbox after the failed captures: %+v %v", out, err)
	}
	// with the files gone, it captures again
	d.must(t, "exec", sb.ID(), "--", "rm", "-rf", "/deep")
	if _, err := sb.Snapshot(ctx, name); err != nil {
		t.Errorf("a disk snapshot once the files are gone: %v", err)
	} else {
		_ = d.client.DeleteSnapshot(context.Background(), name)
	}
}
