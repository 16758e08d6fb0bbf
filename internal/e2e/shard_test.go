package e2e

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The whole suite can run as shards: test binaries of this package, each
// with its share of the tests and daemons of its own, at once. The tests
// are isolated from one another's daemons (each daemon has its own tag,
// data dir, runsc root, cgroups, namespaces and tmpfs mounts:
// checkNoLeaks looks at its own), as the other packages' tests run beside
// this one.
//
// It pays only where there are cores to spare: the suite keeps two cores
// busy by itself (the sentry's systrap, the captures), and two shards on
// this kind of machine took as long as one (69 minutes against 71, load
// 20 to 50), and four tests that pass alone failed under that load. So a
// machine gets one shard per two cores (defaultShards), and
// SBX_E2E_SHARDS sets the number (1: none). A run of chosen tests (-run),
// a list, benchmarks and -json's test2json output run as one binary, as
// ever: shards would interleave their lines, or their figures.
const shardEnv = "SBX_E2E_SHARD"

// defaultShards is one shard per two cores: 1 on this kind of machine.
var defaultShards = max(1, runtime.NumCPU()/2)

// shardMain runs the suite as shards if this run is one to shard, and
// says so; code is the exit code of the whole.
func shardMain() (sharded bool, code int) {
	if !flag.Parsed() {
		flag.Parse()
	}
	n := defaultShards
	if s := os.Getenv("SBX_E2E_SHARDS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			fmt.Printf("e2e: SBX_E2E_SHARDS=%q: want a number of test binaries, 1 or more\n", s)
			return true, 1
		}
		n = v
	}
	flagSet := func(name string) string {
		if f := flag.Lookup(name); f != nil {
			return f.Value.String()
		}
		return ""
	}
	if n < 2 || os.Getenv(shardEnv) != "" || flagSet("test.run") != "" || flagSet("test.list") != "" ||
		flagSet("test.bench") != "" || flagSet("test.v") == "test2json" || flagSet("test.skip") != "" {
		return false, 0
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Println("e2e: shards: find this test binary:", err)
		return true, 1
	}
	out, err := exec.Command(self, "-test.list", ".").Output()
	if err != nil {
		fmt.Printf("e2e: shards: list the tests: %v\n", err)
		return true, 1
	}
	var names []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "Test") {
			names = append(names, strings.TrimSpace(l))
		}
	}
	slices.Sort(names)
	// dealt in turn in name order: a family of long tests (TestFreeze*,
	// TestAttack*) is spread over the shards, not piled on one
	shares := make([][]string, n)
	for i, name := range names {
		shares[i%n] = append(shares[i%n], regexp.QuoteMeta(name))
	}
	// The templates are built here, once, before the shards share the
	// cache (templateCache): two first builds at once would race.
	d, err := startDaemon(nil)
	if err != nil {
		fmt.Println("e2e:", err)
		return true, 1
	}
	err = d.ensureTemplates()
	d.stop(true)
	if err != nil {
		fmt.Println("e2e:", err)
		return true, 1
	}

	var outMu sync.Mutex
	cmds := make([]*exec.Cmd, n)
	var copying sync.WaitGroup
	for i := range cmds {
		args := append(slices.Clone(os.Args[1:]), "-test.run=^("+strings.Join(shares[i], "|")+")$")
		cmd := exec.Command(self, args...)
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d/%d", shardEnv, i+1, n))
		// a parent killed outright (a CI timeout) stops its shards, which
		// remove what they made on SIGTERM (TestMain's handler)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
		pr, pw := io.Pipe()
		cmd.Stdout, cmd.Stderr = pw, pw
		copying.Add(1)
		go func() {
			defer copying.Done()
			// whole lines, so two shards' lines do not cut into each other
			sc := bufio.NewScanner(pr)
			sc.Buffer(make([]byte, 64<<10), 16<<20)
			for sc.Scan() {
				outMu.Lock()
				os.Stdout.Write(append(sc.Bytes(), '\n'))
				outMu.Unlock()
			}
			io.Copy(io.Discard, pr)
		}()
		cmds[i] = cmd
	}
	fmt.Printf("e2e: %d tests in %d shards (SBX_E2E_SHARDS; 1 runs them in one binary)\n", len(names), n)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	for _, cmd := range cmds {
		if err := cmd.Start(); err != nil {
			fmt.Println("e2e: shards: start:", err)
			code = 1
		}
	}
	go func() {
		sig := <-sigs
		for _, cmd := range cmds {
			if cmd.Process != nil {
				cmd.Process.Signal(sig)
			}
		}
	}()
	start := time.Now()
	var failed []string
	for i, cmd := range cmds {
		if cmd.Process == nil {
			continue
		}
		err := cmd.Wait()
		cmd.Stdout.(*io.PipeWriter).Close()
		if err != nil {
			failed = append(failed, fmt.Sprintf("shard %d/%d: %v", i+1, n, err))
		}
	}
	copying.Wait()
	fmt.Printf("e2e: the shards ran in %s\n", time.Since(start).Round(time.Second))
	if len(failed) > 0 || code != 0 {
		fmt.Printf("e2e: %s\nFAIL\n", strings.Join(failed, "; "))
		return true, 1
	}
	fmt.Println("PASS")
	return true, 0
}
