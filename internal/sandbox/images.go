package sandbox

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// An image is a capture on disk, under DATA_DIR/images/ID: disk.tar (the
// sandbox's disk changes), memory/ (a runsc checkpoint, for captures with
// memory), and COMPLETE, written and synced last. An image without
// COMPLETE is never offered as restorable. COMPLETE holds the time it was
// written and the size of each file of memory/ ("size PATH BYTES" lines):
// a memory file cut short since (a disk that lost its tail, a copy by
// hand) is found before a restore reads it, which runsc would find only
// once the sandbox runs, loading pages in the background.

const (
	diskTar      = "disk.tar"
	memoryDir    = "memory"
	completeFile = "COMPLETE"
)

// imageFiles owns the images' files under DATA_DIR/images: one directory
// an image, complete once its COMPLETE marker is synced. It needs nothing
// of the rest of the manager: which image is whose is the store's, and the
// journal's (journal.go) while one is being written.
type imageFiles struct{ root string }

func (f imageFiles) dir(id string) string  { return filepath.Join(f.root, id) }
func (f imageFiles) disk(id string) string { return filepath.Join(f.dir(id), diskTar) }
func (f imageFiles) mem(id string) string  { return filepath.Join(f.dir(id), memoryDir) }

// make makes an empty image directory.
func (f imageFiles) make(withMemory bool) (string, error) {
	id := newID("im_")
	dir := f.dir(id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	if withMemory {
		if err := os.Mkdir(filepath.Join(dir, memoryDir), 0o700); err != nil {
			return "", err
		}
	}
	return id, nil
}

// complete syncs every file of an image (unless !durable), then
// writes and syncs its COMPLETE marker: the image must be on disk before
// anyone relies on it.
func (f imageFiles) complete(id string, durable bool) (size int64, err error) {
	dir := f.dir(id)
	marker := time.Now().UTC().Format(time.RFC3339Nano) + "\n"
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if rel, _ := filepath.Rel(dir, p); d.Type().IsRegular() && filepath.Dir(rel) == memoryDir {
			if fi, err := d.Info(); err == nil {
				marker += fmt.Sprintf("size %s %d\n", filepath.ToSlash(rel), fi.Size())
			}
		}
		if !durable {
			if fi, err := d.Info(); err == nil && !d.IsDir() {
				size += fi.Size()
			}
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		if !d.IsDir() {
			fi, err := f.Stat()
			if err != nil {
				return err
			}
			size += fi.Size()
		}
		return f.Sync()
	})
	if err != nil {
		return 0, fmt.Errorf("sync image %s: %w", id, err)
	}
	if err := writeSynced(filepath.Join(dir, completeFile), []byte(marker)); err != nil {
		return 0, fmt.Errorf("complete image %s: %w", id, err)
	}
	return size, syncDir(dir)
}

// isComplete reports whether an image was completed.
func (f imageFiles) isComplete(id string) bool {
	_, err := os.Stat(filepath.Join(f.dir(id), completeFile))
	return id != "" && err == nil
}

// checkMemory says whether the files of a complete image's memory are
// the size they were when it was completed; an image completed before
// COMPLETE named them passes.
func (f imageFiles) checkMemory(id string) error {
	b, err := os.ReadFile(filepath.Join(f.dir(id), completeFile))
	if err != nil {
		return fmt.Errorf("image %s is not complete: %w", id, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		var rel string
		var want int64
		if n, _ := fmt.Sscanf(line, "size %s %d", &rel, &want); n != 2 || filepath.Dir(filepath.FromSlash(rel)) != memoryDir {
			continue
		}
		fi, err := os.Stat(filepath.Join(f.dir(id), filepath.FromSlash(rel)))
		if err != nil {
			return fmt.Errorf("image %s is damaged: %s: %w", id, rel, err)
		}
		if fi.Size() != want {
			return fmt.Errorf("image %s is damaged: %s holds %d bytes, %d were written", id, rel, fi.Size(), want)
		}
	}
	return nil
}

// remove removes an image directory; a missing one is fine.
func (f imageFiles) remove(id string) error {
	if id == "" {
		return nil
	}
	return os.RemoveAll(f.dir(id))
}

func writeSynced(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// size is the bytes an image's files hold.
func (f imageFiles) size(id string) (int64, error) {
	var size int64
	err := filepath.WalkDir(f.dir(id), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if fi, err := d.Info(); err == nil && !d.IsDir() {
			size += fi.Size()
		}
		return nil
	})
	return size, err
}

// clone makes a new complete image holding the same files as img (hard
// links: a copy that costs no space and shares nothing that changes, since
// an image is never written once complete).
func (f imageFiles) clone(img string) (string, error) {
	id := newID("im_")
	src, dst := f.dir(img), f.dir(id)
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(to, 0o700)
		}
		return os.Link(p, to)
	})
	if err != nil {
		_ = os.RemoveAll(dst)
		return "", fmt.Errorf("copy image %s: %w", img, err)
	}
	return id, syncDir(f.root)
}
