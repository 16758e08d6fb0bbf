// Copyright 2025 The gVisor Authors.
//
// sbx: a patched copy of pkg/sentry/fsimpl/tmpfs/tar.go of
// gvisor.dev/gvisor@v0.0.0-20260701204157-69c2d17aea96, built into runsc by
// `go build -overlay` (see ../../Makefile and README.md here). It changes how
// a rootfs-upper tar (the dev.gvisor.tar.rootfs.upper annotation, and
// `runsc tar rootfs-upper`) moves a regular file's content: in chunks of
// tarChunk bytes, instead of the whole file in one buffer and one write;
// and a file with holes as a sparse entry (sparseRecord), whose holes the
// restore leaves holes. Look for "sbx:" below.
//
// Licensed under the Apache License, Version 2.0 (the "License");
// you may not use this file except in compliance with the License.
// You may obtain a copy of the License at
//
//     http://www.apache.org/licenses/LICENSE-2.0
//
// Unless required by applicable law or agreed to in writing, software
// distributed under the License is distributed on an "AS IS" BASIS,
// WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
// See the License for the specific language governing permissions and
// limitations under the License.

package tmpfs

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"gvisor.dev/gvisor/pkg/abi/linux"
	"gvisor.dev/gvisor/pkg/context"
	"gvisor.dev/gvisor/pkg/log"
	"gvisor.dev/gvisor/pkg/sentry/kernel/auth"
	"gvisor.dev/gvisor/pkg/sentry/vfs"
	"gvisor.dev/gvisor/pkg/usermem"
)

// tarRead creates the corresponding dentry and its children from the given
// snapshot tar file.
func (fs *filesystem) tarRead(ctx context.Context, src io.Reader, cb tarReaderCallbacks) error {
	tr := tar.NewReader(src)

	fs.mu.Lock()
	defer fs.mu.Unlock()

	return fs.readFromTar(ctx, tr, cb)
}

// readFromTar creates the corresponding dentry and its children from the given
// tar reader.
//
// Preconditions:
//   - filesystem.mu must be locked.
func (fs *filesystem) readFromTar(ctx context.Context, tr *tar.Reader, cb tarReaderCallbacks) error {
	pathToInode := map[string]*inode{}
	directoryToHeader := map[string]*tar.Header{}
	fileToHeader := map[string]*tar.Header{}
	symlinkToHeader := map[string]*tar.Header{}
	linkToHeader := map[string]*tar.Header{}
	for {
		header, err := tr.Next()
		if err != nil {
			if err == io.EOF {
				break
			}
			return fmt.Errorf("failed to read tar header: %w", err)
		}

		switch header.Typeflag {
		case tar.TypeDir:
			directoryToHeader[header.Name] = header
		case tar.TypeReg:
			// sbx: a file whose directory is known by now (runsc's own tars
			// list a directory before what it holds) is made at once and
			// its content streamed in; the others are buffered as before.
			if _, ok := cb.(*tarDefaultReaderCallbacks); ok {
				made, err := fs.streamRegularFileFromTar(ctx, header, tr, pathToInode, directoryToHeader)
				if err != nil {
					return err
				}
				if made {
					continue
				}
			}
			if err := cb.regularFileRead(ctx, header, tr); err != nil {
				return err
			}
			fileToHeader[header.Name] = header
		case tar.TypeFifo, tar.TypeBlock, tar.TypeChar:
			fileToHeader[header.Name] = header
		case tar.TypeSymlink:
			symlinkToHeader[header.Name] = header
		case tar.TypeLink:
			linkToHeader[header.Name] = header
		default:
			return fmt.Errorf("readfrom unsupported file type %v for %v", header.Typeflag, header.Name)
		}
	}
	// Re-create all directories.
	for path, hdr := range directoryToHeader {
		if _, err := fs.mkdirFromTar(hdr, pathToInode, directoryToHeader); err != nil {
			return fmt.Errorf("failed to make directory %v: %w", path, err)
		}
	}
	// Re-create all regular files, FIFOs, block devices, and character devices.
	for path, hdr := range fileToHeader {
		if err := fs.mknodFromTar(ctx, hdr, pathToInode, cb); err != nil {
			return fmt.Errorf("failed to make file %v: %w", path, err)
		}
	}
	// Re-create all symlinks.
	for path, hdr := range symlinkToHeader {
		if err := fs.symlinkFromTar(hdr, pathToInode); err != nil {
			return fmt.Errorf("failed to make symlink %v: %w", path, err)
		}
	}
	// Re-create all hard links.
	// Note that hard links are created after the rest of the supported file types
	// since they need to link to existing inodes.
	for path, hdr := range linkToHeader {
		if err := fs.linkFromTar(hdr, pathToInode); err != nil {
			return fmt.Errorf("failed to make hard link %v: %w", path, err)
		}
	}
	return nil
}

// Tar archives store xattrs with the "SCHILY.xattr." prefix in PAXRecords.
const paxXattrPrefix = "SCHILY.xattr."

// setXattrsFromPAXRecords extracts xattrs from hdr.PAXRecords and sets them
// on the inode.
func (i *inode) setXattrsFromPAXRecords(hdr *tar.Header) {
	var xattrs map[string]string
	for k, v := range hdr.PAXRecords {
		if strings.HasPrefix(k, paxXattrPrefix) {
			if xattrs == nil {
				xattrs = make(map[string]string)
			}
			xattrs[strings.TrimPrefix(k, paxXattrPrefix)] = v
		}
	}
	if len(xattrs) > 0 {
		i.xattrs.SetRawXattrs(xattrs)
	}
}

// mkdirFromTar recursively creates a directory and its parent directories
// using the provided headers.
func (fs *filesystem) mkdirFromTar(hdr *tar.Header, pathToInode map[string]*inode, pathToHeader map[string]*tar.Header) (*inode, error) {
	path := hdr.Name
	if ino, ok := pathToInode[hdr.Name]; ok {
		return ino, nil
	}
	if hdr.Name == "./" {
		ino := fs.root.inode
		ino.uid.Store(uint32(hdr.Uid))
		ino.gid.Store(uint32(hdr.Gid))
		ino.mode.Store(uint32(hdr.Mode) | linux.S_IFDIR)
		ino.mtime.Store(hdr.ModTime.UnixNano())
		ino.setXattrsFromPAXRecords(hdr)
		pathToInode[hdr.Name] = ino
		return ino, nil
	}
	dir, name := filepath.Split(strings.TrimSuffix(path, "/"))
	parentInode, ok := pathToInode[dir]
	if !ok {
		parentHdr, ok := pathToHeader[dir]
		if !ok {
			return nil, fmt.Errorf("failed to find header for %v", dir)
		}
		var err error
		// Recursively create the parent directories.
		if parentInode, err = fs.mkdirFromTar(parentHdr, pathToInode, pathToHeader); err != nil {
			return nil, err
		}
	}
	if parentInode.nlink.Load() == maxLinks {
		return nil, fmt.Errorf("maximum number of links reached for %v", dir)
	}
	parentDir, ok := parentInode.impl.(*directory)
	if !ok {
		return nil, fmt.Errorf("parent inode at %v is not a directory", dir)
	}
	childDir, err := fs.newDirectory(auth.KUID(hdr.Uid), auth.KGID(hdr.Gid), linux.FileMode(hdr.Mode), parentDir)
	if err != nil {
		return nil, fmt.Errorf("failed to create new directory inode: %v", err)
	}
	parentDir.inode.incLinksLocked() // from child's ".."
	parentDir.inode.incRef()         // child directory holds a reference to parent
	childDir.inode.mtime.Store(hdr.ModTime.UnixNano())
	childDir.inode.setXattrsFromPAXRecords(hdr)
	parentDir.insertChildLocked(&childDir.dentry, name)
	pathToInode[path] = childDir.dentry.inode
	return childDir.dentry.inode, nil
}

// mknodFromTar creates a regular file,FIFO, block device, or character device file using
// the provided header. It also writes the file content to the corresponding regular file if it
// exists.
func (fs *filesystem) mknodFromTar(ctx context.Context, hdr *tar.Header, pathToInode map[string]*inode, cb tarReaderCallbacks) error {
	dir, name := filepath.Split(hdr.Name)
	parentInode, ok := pathToInode[dir]
	if !ok {
		return fmt.Errorf("parent directory %v does not exist", dir)
	}
	parentDir, ok := parentInode.impl.(*directory)
	if !ok {
		return fmt.Errorf("%v is not a directory", dir)
	}
	var childInode *inode
	var err error
	switch hdr.Typeflag {
	case tar.TypeReg:
		childInode, err = fs.newRegularFile(auth.KUID(hdr.Uid), auth.KGID(hdr.Gid), linux.FileMode(hdr.Mode), parentDir)
	case tar.TypeFifo:
		childInode, err = fs.newNamedPipe(auth.KUID(hdr.Uid), auth.KGID(hdr.Gid), linux.FileMode(hdr.Mode), parentDir)
	case tar.TypeBlock:
		childInode, err = fs.newDeviceFileLocked(auth.KUID(hdr.Uid), auth.KGID(hdr.Gid), linux.FileMode(hdr.Mode|linux.S_IFBLK), uint32(hdr.Devmajor), uint32(hdr.Devminor), parentDir)
	case tar.TypeChar:
		childInode, err = fs.newDeviceFileLocked(auth.KUID(hdr.Uid), auth.KGID(hdr.Gid), linux.FileMode(hdr.Mode|linux.S_IFCHR), uint32(hdr.Devmajor), uint32(hdr.Devminor), parentDir)
	default:
		return fmt.Errorf("mknod unsupported file type %v for %v", hdr.Typeflag, hdr.Name)
	}
	if err != nil {
		return err
	}
	childInode.mtime.Store(hdr.ModTime.UnixNano())
	childInode.setXattrsFromPAXRecords(hdr)
	child := fs.newDentry(childInode)
	parentDir.insertChildLocked(child, name)
	pathToInode[hdr.Name] = childInode

	// Write file contents to the corresponding regular files.
	if rf, _ := childInode.impl.(*regularFile); rf != nil {
		if err := cb.regularFileSetContents(ctx, hdr, rf); err != nil {
			return err
		}
	}

	return nil
}

// linkFromTar creates a hard link from the given tar header.
func (fs *filesystem) linkFromTar(hdr *tar.Header, pathToInode map[string]*inode) error {
	dir, name := filepath.Split(hdr.Name)
	parentInode, ok := pathToInode[dir]
	if !ok {
		return fmt.Errorf("parent directory %v does not exist", dir)
	}
	parentDir, ok := parentInode.impl.(*directory)
	if !ok {
		return fmt.Errorf("%v is not a directory", dir)
	}
	childInode, ok := pathToInode[hdr.Linkname]
	if !ok {
		return fmt.Errorf("child inode %v does not exist", hdr.Linkname)
	}
	if childInode.nlink.Load() == maxLinks {
		return fmt.Errorf("maximum number of links reached for %s", hdr.Linkname)
	}
	childInode.incLinksLocked()
	child := fs.newDentry(childInode)
	parentDir.insertChildLocked(child, name)
	pathToInode[hdr.Name] = child.inode
	return nil
}

// symlinkFromTar creates a symlink from the given tar header.
func (fs *filesystem) symlinkFromTar(hdr *tar.Header, pathToInode map[string]*inode) error {
	dir, name := filepath.Split(hdr.Name)
	parentInode, ok := pathToInode[dir]
	if !ok {
		return fmt.Errorf("parent directory %v does not exist", dir)
	}
	parentDir, ok := parentInode.impl.(*directory)
	if !ok {
		return fmt.Errorf("%v is not a directory", dir)
	}
	// Linux allocates a page to store symlink targets that have length larger
	// than shortSymlinkLen. Mirror SymlinkAt's accounting so creation and
	// teardown stay balanced; otherwise (*inode).decRef's matching
	// unaccountPages(1) underflows fs.pagesUsed and panics on teardown.
	// See mm/shmem.c:shmem_symlink().
	if len(hdr.Linkname) >= shortSymlinkLen {
		if !fs.accountPages(1) {
			return fmt.Errorf("tmpfs: insufficient space to account for symlink target %q", hdr.Name)
		}
	}
	childInode, err := fs.newSymlink(auth.KUID(hdr.Uid), auth.KGID(hdr.Gid), 0777, hdr.Linkname, parentDir)
	if err != nil {
		return fmt.Errorf("failed to create inode from tar: %v", err)
	}
	child := fs.newDentry(childInode)
	child.inode.mtime.Store(hdr.ModTime.UnixNano())
	child.inode.setXattrsFromPAXRecords(hdr)
	parentDir.insertChildLocked(child, name)
	pathToInode[hdr.Name] = child.inode
	return nil
}

type tarReaderCallbacks interface {
	// regularFileRead reads information about the regular file with header hdr
	// from tr.
	regularFileRead(ctx context.Context, hdr *tar.Header, tr *tar.Reader) error

	// regularFileSetContents sets the contents and size of rf, using what was
	// previously read for hdr.
	regularFileSetContents(ctx context.Context, hdr *tar.Header, rf *regularFile) error
}

// tarDefaultReaderCallbacks implements tarReaderCallbacks by reading regular
// file contents from the tar archive.
type tarDefaultReaderCallbacks struct {
	headerToContent map[*tar.Header]*bytes.Buffer
}

func (cb *tarDefaultReaderCallbacks) regularFileRead(ctx context.Context, hdr *tar.Header, tr *tar.Reader) error {
	var buf bytes.Buffer
	n, err := io.Copy(&buf, tr)
	if err != nil {
		return fmt.Errorf("failed to read file content: %w", err)
	}
	if n != hdr.Size {
		return fmt.Errorf("failed to read all file content, got %d bytes, want %d", n, hdr.Size)
	}
	if hdr.Size > 0 {
		cb.headerToContent[hdr] = &buf
	}
	return nil
}

func (cb *tarDefaultReaderCallbacks) regularFileSetContents(ctx context.Context, hdr *tar.Header, rf *regularFile) error {
	buf, ok := cb.headerToContent[hdr]
	if !ok {
		return nil
	}
	// sbx: in chunks (see writeRegularFileFrom), holes kept
	return setContentsFromTar(ctx, rf, bytes.NewReader(buf.Bytes()), hdr)
}

// sbx: tarChunk is how much of a regular file's content moves at once
// between a tar and the file. The unpatched code moved a whole file at
// once: one buffer of its size in the sentry's memory (which counts against
// the sandbox's memory limit), and one write of it to the filesystem's
// memory file, which on a disk-backed filesystem (runsc
// --overlay2=root:dir=...) is one pwritev(2). Linux caps a single write at
// 2 GiB - 4 KiB (MAX_RW_COUNT), and regularFileReadWriter.WriteFromBlocks
// moves on to the next segment after a short write, so a file of 2 GiB or
// more came back short: "got 2147479552 bytes, want 2147483648".
const tarChunk = 4 << 20

// sbx: streamRegularFileFromTar makes the regular file of hdr now, if its
// parent directory is made or can be made from the headers read so far,
// and copies its size bytes from tr into it in chunks; made is false when
// the directory is not known yet (the caller then buffers the content as
// the unpatched code does).
func (fs *filesystem) streamRegularFileFromTar(ctx context.Context, hdr *tar.Header, tr *tar.Reader, pathToInode map[string]*inode, directoryToHeader map[string]*tar.Header) (made bool, err error) {
	if _, ok := pathToInode[hdr.Name]; ok {
		return false, nil // a name seen twice: left to the unpatched path
	}
	dir, _ := filepath.Split(hdr.Name)
	if _, ok := pathToInode[dir]; !ok {
		dh, ok := directoryToHeader[dir]
		if !ok {
			return false, nil
		}
		if _, err := fs.mkdirFromTar(dh, pathToInode, directoryToHeader); err != nil {
			return false, nil // said again, and returned, when the directories are made
		}
	}
	if err := fs.mknodFromTar(ctx, hdr, pathToInode, &tarStreamCallbacks{tr: tr}); err != nil {
		return true, fmt.Errorf("failed to make file %v: %w", hdr.Name, err)
	}
	return true, nil
}

// sbx: tarStreamCallbacks sets a regular file's contents from the tar
// being read, as it is read.
type tarStreamCallbacks struct {
	tr *tar.Reader
}

func (cb *tarStreamCallbacks) regularFileRead(ctx context.Context, hdr *tar.Header, tr *tar.Reader) error {
	return nil // the content is read by regularFileSetContents
}

func (cb *tarStreamCallbacks) regularFileSetContents(ctx context.Context, hdr *tar.Header, rf *regularFile) error {
	return setContentsFromTar(ctx, rf, cb.tr, hdr)
}

// sbx: setContentsFromTar sets rf's content from the content of its tar
// entry, r: a sparse entry (see sparseRecord) is read as its map, then
// each extent of data written at its offset, and the file grown to its
// size, so that its holes stay holes (and cost no pages of the disk
// limit); any other entry is written whole.
func setContentsFromTar(ctx context.Context, rf *regularFile, r io.Reader, hdr *tar.Header) error {
	rf.inode.mu.Lock()
	defer rf.inode.mu.Unlock()
	rs, ok := hdr.PAXRecords[sparseRecord]
	if !ok {
		return writeRegularFileFrom(ctx, rf, r, 0, hdr.Size, hdr.Name)
	}
	realSize, err := strconv.ParseInt(rs, 10, 64)
	if err != nil || realSize < 0 {
		return fmt.Errorf("bad %s record %q of %v", sparseRecord, rs, hdr.Name)
	}
	extents, err := readSparseMap(r, hdr.Size, realSize)
	if err != nil {
		return fmt.Errorf("bad sparse map of %v: %w", hdr.Name, err)
	}
	for _, e := range extents {
		if err := writeRegularFileFrom(ctx, rf, r, e.off, e.len, hdr.Name); err != nil {
			return err
		}
	}
	if err := rf.truncateNoTimeUpdateLocked(uint64(realSize)); err != nil {
		return fmt.Errorf("failed to set the size of %v: %w", hdr.Name, err)
	}
	return nil
}

// sbx: writeRegularFileFrom writes size bytes of r into rf at off, tarChunk
// bytes at a time.
//
// Preconditions: rf.inode.mu must be locked.
func writeRegularFileFrom(ctx context.Context, rf *regularFile, r io.Reader, off, size int64, name string) error {
	rw := getRegularFileReadWriter(rf, off, 0)
	defer putRegularFileReadWriter(rw)
	buf := make([]byte, min(size, tarChunk))
	var done int64
	for done < size {
		n, rerr := io.ReadFull(r, buf[:min(int64(len(buf)), size-done)])
		if n > 0 {
			w, err := usermem.BytesIOSequence(buf[:n]).CopyInTo(ctx, rw)
			done += w
			if err != nil {
				return fmt.Errorf("failed to write file content to %v: %w", name, err)
			}
			if w != int64(n) {
				return fmt.Errorf("failed to write all file content to %v, got %d bytes, want %d", name, done, size)
			}
		}
		if rerr != nil {
			return fmt.Errorf("failed to read all file content of %v, got %d bytes, want %d: %w", name, done, size, rerr)
		}
	}
	return nil
}

// TarUpperLayer implements vfs.TarSerializer.TarUpperLayer.
func (fs *filesystem) TarUpperLayer(ctx context.Context, outFD *os.File) error {
	return fs.tarWrite(ctx, outFD, &tarDefaultWriterCallbacks{}) // sbx: a pointer: it keeps the extents of the file at hand
}

func (fs *filesystem) tarWrite(ctx context.Context, dst io.Writer, cb tarWriterCallbacks) error {
	tw := tar.NewWriter(dst)

	fs.mu.RLock()
	defer fs.mu.RUnlock()

	err := fs.root.writeToTar(ctx, tw, ".", make(map[uint64]string), cb)
	if err != nil {
		return fmt.Errorf("failed to write dentry to tar: %w", err)
	}

	if err := tw.Close(); err != nil {
		return fmt.Errorf("failed to close tar writer: %w", err)
	}

	return nil
}

// writeToTar recursively writes a dentry and its children to the tar archive.
func (d *dentry) writeToTar(ctx context.Context, tw *tar.Writer, baseDir string, inoToPath map[uint64]string, cb tarWriterCallbacks) error {
	path := baseDir
	if d.name != "" {
		path = path + "/" + d.name
	}
	header, err := d.createTarHeader(path, inoToPath, cb)
	if err != nil {
		return fmt.Errorf("failed to create tar header for %q: %w", path, err)
	}
	if header == nil {
		return nil
	}

	if err := tw.WriteHeader(header); err != nil {
		return fmt.Errorf("failed to write tar header for %q: %w", path, err)
	}

	// If the file is a hard link, we don't need to write its content.
	if header.Typeflag == tar.TypeLink {
		return nil
	}

	switch impl := d.inode.impl.(type) {
	case *directory:
		for _, child := range impl.childMap {
			if err := child.writeToTar(ctx, tw, path, inoToPath, cb); err != nil {
				return err
			}
		}
	case *regularFile:
		if err := cb.regularFileWrite(ctx, impl, tw); err != nil {
			return fmt.Errorf("failed to write file content for %q: %w", path, err)
		}
	}

	return nil
}

// createTarHeader creates a tar header for the given dentry.
func (d *dentry) createTarHeader(path string, inoToPath map[uint64]string, cb tarWriterCallbacks) (*tar.Header, error) {
	if d.isSelfFilestoreWhiteout() {
		// Skip the self filestore whiteout.
		return nil, nil
	}

	header := &tar.Header{
		Name:    path,
		Mode:    int64(d.inode.mode.Load() & ^uint32(linux.S_IFMT)),
		Uid:     int(d.inode.uid.Load()),
		Gid:     int(d.inode.gid.Load()),
		ModTime: time.Unix(0, d.inode.mtime.Load()),
	}
	// Hard link: Check if the inode has already been written to the tar archive.
	if existingPath, ok := inoToPath[d.inode.ino]; ok {
		header.Typeflag = tar.TypeLink
		header.Linkname = existingPath
		return header, nil
	}

	switch impl := d.inode.impl.(type) {
	case *directory:
		header.Typeflag = tar.TypeDir
		header.Name += "/"
	case *regularFile:
		header.Typeflag = tar.TypeReg
		header.Size = cb.regularFileSize(impl)
	case *symlink:
		header.Typeflag = tar.TypeSymlink
		header.Linkname = impl.target
	case *namedPipe:
		header.Typeflag = tar.TypeFifo
	case *deviceFile:
		if impl.kind == vfs.BlockDevice {
			header.Typeflag = tar.TypeBlock
		} else {
			header.Typeflag = tar.TypeChar
		}
		header.Devmajor = int64(impl.major)
		header.Devminor = int64(impl.minor)
	case *socketFile:
		// This is consistent with the behavior of tar(1).
		log.Warningf("Skipping socket file %q while generating tar archive", path)
		return nil, nil
	default:
		return nil, fmt.Errorf("unsupported file type for %q", path)
	}

	// Serialize xattrs to PAXRecords.
	if xattrs := d.inode.xattrs.RawXattrs(); len(xattrs) > 0 {
		header.PAXRecords = make(map[string]string, len(xattrs))
		for k, v := range xattrs {
			// PaxRecords require that key and value are non-empty UTF-8 strings and
			// that the key does not contain '='.
			if strings.Contains(k, "=") {
				log.Warningf("Skipping xattr (k=%q, v=%q) for file %q while generating tar archive because key contains '='", k, v, path)
				continue
			}
			if k == "" || v == "" {
				log.Warningf("Skipping xattr (k=%q, v=%q) for file %q while generating tar archive because key or value is empty", k, v, path)
				continue
			}
			if !utf8.ValidString(k) || !utf8.ValidString(v) {
				log.Warningf("Skipping xattr (k=%q, v=%q) for file %q while generating tar archive because value is not a valid UTF-8 string", k, v, path)
				continue
			}
			header.PAXRecords[paxXattrPrefix+k] = v
		}
	}

	// sbx: a file written as a sparse entry says so (after the xattrs,
	// which make PAXRecords anew)
	if scb, ok := cb.(*tarDefaultWriterCallbacks); ok {
		if rf, ok := d.inode.impl.(*regularFile); ok {
			scb.sparseHeader(rf, header)
		}
	}

	inoToPath[d.inode.ino] = path
	return header, nil
}

type tarWriterCallbacks interface {
	// regularFileSize returns the size of the given regular file as written to
	// the tar archive.
	regularFileSize(rf *regularFile) int64

	// regularFileWrite writes the contents of the given regular file to tw.
	regularFileWrite(ctx context.Context, rf *regularFile, tw *tar.Writer) error
}

// tarDefaultWriterCallbacks implements tarWriterCallbacks by writing regular
// file contents to the tar archive.
//
// sbx: a file with holes is written as a sparse entry (see sparseRecord):
// only its data, so that a file truncated to a terabyte on a disk limit of
// 100 MiB costs its pages, not a terabyte of zeroes in the tar (and the
// restore, which wrote every zero, ran out of the limit). The extents are
// taken when the header is made (regularFileSize) and kept for the content
// (regularFileWrite), which follows at once for the same file.
type tarDefaultWriterCallbacks struct {
	rf       *regularFile
	extents  []sparseExtent
	sparse   bool
	realSize int64
}

func (cb *tarDefaultWriterCallbacks) regularFileSize(rf *regularFile) int64 {
	cb.rf = rf
	cb.extents, cb.realSize = dataExtents(rf)
	var data int64
	for _, e := range cb.extents {
		data += e.len
	}
	cb.sparse = data < cb.realSize
	if !cb.sparse {
		return cb.realSize
	}
	return int64(len(sparseMap(cb.extents))) + data
}

// sbx: sparseHeader adds the sparse record to a regular file's header when
// its content is written as a sparse entry.
func (cb *tarDefaultWriterCallbacks) sparseHeader(rf *regularFile, header *tar.Header) {
	if cb.rf != rf || !cb.sparse {
		return
	}
	if header.PAXRecords == nil {
		header.PAXRecords = map[string]string{}
	}
	header.PAXRecords[sparseRecord] = strconv.FormatInt(cb.realSize, 10)
}

func (cb *tarDefaultWriterCallbacks) regularFileWrite(ctx context.Context, rf *regularFile, tw *tar.Writer) error {
	// Note that regularFileReadWriter.ReadToBlocks() does not lock inode.mu. So
	// it is safe to lock here to ensure no concurrent writes occur.
	rf.inode.mu.Lock()
	defer rf.inode.mu.Unlock()
	if cb.rf != rf {
		return fmt.Errorf("sbx: the content of a file whose header was not the last made")
	}
	// sbx: what the header promised: the extents taken for it, or the whole
	// file; in chunks of tarChunk bytes, not the whole file in one buffer
	extents := []sparseExtent{{0, cb.realSize}}
	if cb.sparse {
		extents = cb.extents
		if _, err := tw.Write(sparseMap(extents)); err != nil {
			return fmt.Errorf("failed to write sparse map to tar: %w", err)
		}
	}
	cb.rf, cb.extents = nil, nil
	var longest int64
	for _, e := range extents {
		longest = max(longest, e.len)
	}
	buf := make([]byte, min(longest, tarChunk))
	for _, e := range extents {
		if err := copyExtentToTar(ctx, rf, e, buf, tw); err != nil {
			return err
		}
	}
	return nil
}

// sbx: copyExtentToTar copies one extent of rf's content to tw. A file
// that shrank since its header was written (the sandbox runs on during a
// disk capture) is padded with zeroes to the size the header promised.
func copyExtentToTar(ctx context.Context, rf *regularFile, e sparseExtent, buf []byte, tw *tar.Writer) error {
	rw := getRegularFileReadWriter(rf, e.off, 0)
	defer putRegularFileReadWriter(rw)
	var done int64
	for done < e.len {
		want := min(int64(len(buf)), e.len-done)
		n, err := usermem.BytesIOSequence(buf[:want]).CopyOutFrom(ctx, rw)
		if err != nil && err != io.EOF {
			return fmt.Errorf("failed to read file content: %w", err)
		}
		clear(buf[n:want])
		if _, err := tw.Write(buf[:want]); err != nil {
			return fmt.Errorf("failed to write file content to tar: %w", err)
		}
		done += want
	}
	return nil
}

// sbx: sparseRecord is the PAX record of a sparse entry of a rootfs-upper
// tar: the file's size. The entry's content is the GNU sparse format 1.0's
// (a map: the number of extents, then each extent's offset and length, in
// decimal, one a line, padded with NULs to 512 bytes; then each extent's
// data in turn), but it is announced by this record rather than GNU's
// (GNU.sparse.major, .minor, .name, .realsize): Go's archive/tar writer
// drops GNU.sparse.* records, and its reader turns GNU's sparse entries
// into their full size of zeroes with no way to skip the holes
// (golang/go#22735), which is what this format exists to avoid.
const sparseRecord = "SBX.sparse.realsize"

// sbx: sparseExtent is one run of a file's data: len bytes at off.
type sparseExtent struct{ off, len int64 }

// sbx: maxSparseMap bounds the map a restore reads (2^20 extents of up to
// 40 bytes): a bigger one is refused rather than held in memory.
const maxSparseMap = 48 << 20

// sbx: dataExtents returns the runs of rf that hold data (the pages of its
// memory file), merged where they touch, within its size.
func dataExtents(rf *regularFile) ([]sparseExtent, int64) {
	rf.dataMu.RLock()
	defer rf.dataMu.RUnlock()
	size := int64(rf.size.RacyLoad())
	var extents []sparseExtent
	for seg := rf.data.FirstSegment(); seg.Ok(); seg = seg.NextSegment() {
		r := seg.Range()
		start, end := int64(r.Start), min(int64(r.End), size)
		if start >= end {
			break
		}
		if n := len(extents); n > 0 && extents[n-1].off+extents[n-1].len == start {
			extents[n-1].len += end - start
			continue
		}
		extents = append(extents, sparseExtent{start, end - start})
	}
	if len(extents) == 0 && size > 0 {
		// GNU's format holds at least one extent: the last byte, empty
		extents = append(extents, sparseExtent{size, 0})
	}
	return extents, size
}

// sbx: sparseMap encodes the map of a sparse entry, padded to 512 bytes.
func sparseMap(extents []sparseExtent) []byte {
	b := strconv.AppendInt(nil, int64(len(extents)), 10)
	b = append(b, '\n')
	for _, e := range extents {
		b = strconv.AppendInt(b, e.off, 10)
		b = append(b, '\n')
		b = strconv.AppendInt(b, e.len, 10)
		b = append(b, '\n')
	}
	if pad := len(b) % 512; pad != 0 {
		b = append(b, make([]byte, 512-pad)...)
	}
	return b
}

// sbx: readSparseMap reads a sparse entry's map from r, a 512-byte block at
// a time (so that nothing of the data after it is read), and checks it: the
// extents are in order, apart, within realSize, and the map and the data
// they name make the entry's size.
func readSparseMap(r io.Reader, entrySize, realSize int64) ([]sparseExtent, error) {
	var (
		block   [512]byte
		read    int64
		tok     []byte
		nums    []int64
		want    int64 = -1 // numbers the map holds: 1 + 2 per extent
		extents []sparseExtent
	)
	for int64(len(nums)) != want {
		if read+512 > min(entrySize, maxSparseMap) {
			return nil, fmt.Errorf("map past %d bytes", read)
		}
		if _, err := io.ReadFull(r, block[:]); err != nil {
			return nil, fmt.Errorf("map cut short: %w", err)
		}
		read += 512
		for i, c := range block {
			if int64(len(nums)) == want {
				if c != 0 {
					return nil, fmt.Errorf("map padding holds %q", block[i:])
				}
				continue
			}
			if c != '\n' {
				if len(tok) == 20 || c < '0' || c > '9' {
					return nil, fmt.Errorf("bad number %q", append(tok, c))
				}
				tok = append(tok, c)
				continue
			}
			v, err := strconv.ParseInt(string(tok), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("bad number %q", tok)
			}
			tok = tok[:0]
			nums = append(nums, v)
			if want < 0 {
				if v > maxSparseMap/4 {
					return nil, fmt.Errorf("%d extents", v)
				}
				want = 1 + 2*v
				extents = make([]sparseExtent, 0, v)
			}
		}
	}
	var end, data int64
	for i := 1; i < len(nums); i += 2 {
		off, length := nums[i], nums[i+1]
		if off < end || length > realSize || off > realSize-length {
			return nil, fmt.Errorf("extent %d+%d out of order or past %d", off, length, realSize)
		}
		end, data = off+length, data+length
		extents = append(extents, sparseExtent{off, length})
	}
	if read+data != entrySize {
		return nil, fmt.Errorf("map of %d bytes and %d bytes of data, in an entry of %d", read, data, entrySize)
	}
	return extents, nil
}
