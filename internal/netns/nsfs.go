package netns

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// named is a namespace made by newNamed: an fd on it and a netlink handle in it.
type named struct {
	fd int
	nl *netlink.Handle
}

func (n named) close() {
	n.nl.Close()
	unix.Close(n.fd)
}

// newNamed makes one new network namespace per path, bind-mounted there as
// `ip netns add` does, with lo up. The last one gets ip_forward=1, since it is
// the gateway; the others 0. On error it removes what it made.
//
// The namespaces are made on a thread of their own that is left in the last
// one and never unlocked, so the runtime discards it instead of reusing it.
func newNamed(paths ...string) ([]named, error) {
	type result struct {
		nss []named
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: this thread ends up in a foreign namespace
		var nss []named
		var made []string
		fail := func(err error) {
			for _, n := range nss {
				n.close()
			}
			for _, p := range made {
				removeNamed(p)
			}
			done <- result{err: err}
		}
		if err := ensureRunDir(); err != nil {
			fail(err)
			return
		}
		for i, p := range paths {
			f, err := os.OpenFile(p, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0)
			if err != nil {
				fail(fmt.Errorf("namespace %s: %w", p, err))
				return
			}
			f.Close()
			made = append(made, p)
			if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
				fail(fmt.Errorf("namespace %s: unshare: %w", p, err))
				return
			}
			self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
			if err := unix.Mount(self, p, "none", unix.MS_BIND, ""); err != nil {
				fail(fmt.Errorf("namespace %s: bind mount: %w", p, err))
				return
			}
			fd, err := unix.Open(self, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				fail(fmt.Errorf("namespace %s: %w", p, err))
				return
			}
			// a handle made on this thread lives in the namespace it is in now
			h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
			if err != nil {
				unix.Close(fd)
				fail(fmt.Errorf("namespace %s: netlink: %w", p, err))
				return
			}
			nss = append(nss, named{fd: fd, nl: h})
			lo, err := h.LinkByName("lo")
			if err == nil {
				err = h.LinkSetUp(lo)
			}
			if err != nil {
				fail(fmt.Errorf("namespace %s: lo up: %w", p, err))
				return
			}
			// a new namespace inherits the host's value; only the gateway forwards.
			// /proc/sys/net belongs to the namespace of the thread that opens it.
			forward := "0"
			if i == len(paths)-1 {
				forward = "1"
			}
			if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte(forward), 0); err != nil {
				fail(fmt.Errorf("namespace %s: ip_forward: %w", p, err))
				return
			}
		}
		done <- result{nss: nss}
	}()
	r := <-done
	return r.nss, r.err
}

// ensureRunDir makes /run/netns a shared mount point, as `ip netns add` does,
// so namespaces mounted there show in every mount namespace.
func ensureRunDir() error {
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		return err
	}
	err := unix.Mount("", runDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("make %s shared: %w", runDir, err)
	}
	// EINVAL: not a mount point yet
	if err := unix.Mount(runDir, runDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind mount %s: %w", runDir, err)
	}
	if err := unix.Mount("", runDir, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make %s shared: %w", runDir, err)
	}
	return nil
}

// isNamespace reports whether path is a namespace (a mounted nsfs file).
func isNamespace(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
}

// removeNamed unmounts and removes a named namespace; a missing one is fine.
func removeNamed(path string) error {
	err := unix.Unmount(path, unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// inNS runs fn on a thread that is in the namespace at path, then returns
// the thread to its namespace. If it cannot, it leaves the thread locked to
// a goroutine that ends, so the runtime discards the thread.
func inNS(path string, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		err := func() error {
			orig, err := netns.Get()
			if err != nil {
				return fmt.Errorf("current namespace: %w", err)
			}
			defer orig.Close()
			target, err := netns.GetFromPath(path)
			if err != nil {
				return err
			}
			defer target.Close()
			if err := netns.Set(target); err != nil {
				return fmt.Errorf("enter %s: %w", path, err)
			}
			ferr := fn()
			if err := netns.Set(orig); err != nil {
				back := fmt.Errorf("return from %s: %w", path, err)
				done <- errors.Join(ferr, back)
				runtime.Goexit() // still locked: the thread dies with this goroutine
			}
			return ferr
		}()
		runtime.UnlockOSThread()
		done <- err
	}()
	return <-done
}

// withHandle runs fn with a netlink handle in the namespace at path.
func withHandle(path string, fn func(*netlink.Handle) error) error {
	var h *netlink.Handle
	err := inNS(path, func() error {
		var err error
		h, err = netlink.NewHandle(unix.NETLINK_ROUTE)
		return err
	})
	if err != nil {
		return err
	}
	defer h.Close()
	return fn(h)
}

// run runs a command and returns its error with its stderr.
func run(name string, args ...string) error {
	var stderr bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return nil
}
