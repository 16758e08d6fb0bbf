package sandbox

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// A disk is the tar a sandbox's root overlay starts from (runsc's
// dev.gvisor.tar.rootfs.upper annotation): a disk snapshot's or a disk
// fork's disk changes. A memory restore must name the very same path its
// checkpoint was taken with, so a sandbox's disk has a path of its own,
// DATA_DIR/disks/ID.tar, shared by every memory fork and memory snapshot of
// it, and removed once no sandbox or snapshot names it.

func (s *storageOwner) disksDir() string { return filepath.Join(s.dataDir, "disks") }

// newDisk makes a disk from a tar (a hard link where it can, else a copy).
func (s *storageOwner) newDisk(from string) (string, error) {
	if err := os.MkdirAll(s.disksDir(), 0o700); err != nil {
		return "", err
	}
	path := filepath.Join(s.disksDir(), newID("dk_")+".tar")
	if err := os.Link(from, path); err == nil {
		return path, nil
	}
	src, err := os.Open(from)
	if err != nil {
		return "", fmt.Errorf("disk: %w", err)
	}
	defer src.Close()
	dst, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("disk: %w", err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		os.Remove(path)
		return "", fmt.Errorf("disk: %w", err)
	}
	return path, dst.Close()
}

// releaseDisk removes a disk nothing names any more.
func (s *storageOwner) releaseDisk(ctx context.Context, disk string) {
	if disk == "" {
		return
	}
	used, err := s.host.DiskInUse(ctx, disk)
	if err != nil || used {
		return
	}
	if err := os.Remove(disk); err != nil && !os.IsNotExist(err) {
		s.log.Warn("remove a disk", "disk", disk, "err", err)
	}
}
