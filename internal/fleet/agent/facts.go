package agent

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

// Facts are what a node agent publishes about its host and its sbxd, read
// once at start (capacity is read again at every publish).
type Facts struct {
	Address, Version string
	RunscSHA256      string
	CPUFeatures      []string
	CacheLineBytes   int
	DataDir          string // its free space is the disk capacity
}

// ReadFacts reads the host's CPU features and cache line and runsc's
// digest; address and version are sbxd's own.
func ReadFacts(runscPath, dataDir, address, version string) (Facts, error) {
	f := Facts{Address: address, Version: version, DataDir: dataDir}
	var err error
	if f.RunscSHA256, err = fileSHA256(runscPath); err != nil {
		return f, fmt.Errorf("node facts: runsc: %w", err)
	}
	cpuinfo, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return f, fmt.Errorf("node facts: %w", err)
	}
	f.CPUFeatures, f.CacheLineBytes = parseCPUInfo(string(cpuinfo))
	if b, err := os.ReadFile("/sys/devices/system/cpu/cpu0/cache/index0/coherency_line_size"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > 0 {
			f.CacheLineBytes = n
		}
	}
	return f, nil
}

func fileSHA256(path string) (string, error) {
	fh, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer fh.Close()
	h := sha256.New()
	if _, err := io.Copy(h, fh); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// parseCPUInfo returns the first processor's flags, sorted and without
// repeats, and its cache_alignment (0 if it has none).
func parseCPUInfo(s string) (flags []string, cacheLine int) {
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	seenFlags := false
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch k {
		case "flags", "Features": // x86, arm64
			if !seenFlags {
				flags, seenFlags = strings.Fields(v), true
			}
		case "cache_alignment":
			if cacheLine == 0 {
				cacheLine, _ = strconv.Atoi(v)
			}
		}
	}
	slices.Sort(flags)
	return slices.Compact(flags), cacheLine
}

// capacity reads what the host has now.
func (f Facts) capacity() v1alpha1.Capacity {
	c := v1alpha1.Capacity{CPUs: runtime.NumCPU()}
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil {
		c.MemoryBytes = int64(si.Totalram) * int64(si.Unit)
	}
	var st unix.Statfs_t
	if f.DataDir != "" && unix.Statfs(f.DataDir, &st) == nil {
		c.DiskFreeBytes = int64(st.Bavail) * st.Bsize
	}
	return c
}
