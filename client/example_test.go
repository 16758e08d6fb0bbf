package client_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"time"

	"sbx.dev/sbx/client"
)

// Run a project's tests in a fresh sandbox and fetch their report: upload
// the project, run the tests with a time limit, read the result back. The
// sandbox goes when the work is done (and, were the program to die first,
// after 30 idle minutes).
func Example_runTests() {
	ctx := context.Background()
	c, err := client.New("") // $SBX_HOST, else the local socket
	if err != nil {
		log.Fatal(err)
	}
	info, err := c.Create(ctx, client.WithTemplate("base"), client.WithTTL(30*time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	sb := c.Sandbox(info.ID)
	defer sb.Delete(context.WithoutCancel(ctx))

	if err := sb.Files().UploadDir(ctx, "testdata/project", "/work"); err != nil {
		log.Fatal(err)
	}
	res, err := sb.Exec(ctx, []string{"./test.sh"}, client.WithCwd("/work"), client.WithTimeout(10*time.Minute))
	if err != nil {
		log.Fatal(err) // sbx could not run it; a failing test is res.ExitCode
	}
	report, err := sb.Files().ReadFile(ctx, "/work/report.txt", 1<<20)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("exit %d\n%s", res.ExitCode, report)
	// Output:
	// exit 0
	// ok  	example.com/project	0.012s
}

// Start a server, snapshot it warm, fork it three ways with its memory
// (each child carries on the running server, no boot, no warm-up) and
// query every child through its preview URL. PreviewClient reaches the
// preview URLs without wildcard DNS.
func Example_forkServer() {
	ctx := context.Background()
	c, err := client.New("")
	if err != nil {
		log.Fatal(err)
	}
	info, err := c.Create(ctx, client.WithTemplate("base"))
	if err != nil {
		log.Fatal(err)
	}
	sb := c.Sandbox(info.ID)
	defer sb.Delete(context.WithoutCancel(ctx), client.WithSnapshots())

	if _, err := sb.Start(ctx, []string{"python3", "-m", "http.server", "8080"}); err != nil {
		log.Fatal(err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := sb.WaitPort(waitCtx, 8080); err != nil {
		log.Fatal(err)
	}
	// a snapshot to start more from later: c.Create(ctx, client.WithFrom("warm"))
	if _, err := sb.Snapshot(ctx, "warm", client.WithMemory()); err != nil {
		log.Fatal(err)
	}
	kids, err := sb.Fork(ctx, client.WithMemory(), client.WithCount(3), client.WithMeta("job", "load-test"))
	if err != nil {
		log.Fatal(err) // Fork made all or none: nothing is left to clean up
	}
	hc := client.PreviewClient()
	for _, kid := range kids {
		defer c.Sandbox(kid.ID).Delete(context.WithoutCancel(ctx))
		p, err := c.Sandbox(kid.ID).Preview(ctx, 8080)
		if err != nil {
			log.Fatal(err)
		}
		resp, err := hc.Get(p.URL)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		fmt.Printf("%s (memory carried over: %t): %s", kid.ID, kid.MemoryRestored, body)
	}
	same, err := c.List(ctx, client.WithMeta("job", "load-test"), client.WithParent(info.ID))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(same), "children listed by their meta")
	// Output:
	// sb_3 (memory carried over: true): served by pid 42
	// sb_4 (memory carried over: true): served by pid 42
	// sb_5 (memory carried over: true): served by pid 42
	// 3 children listed by their meta
}

// Hunt a flaky test: run it with a new seed until it fails, then stop the
// sandbox at once, which keeps its memory and every process the failure
// left behind, and later resume the failure alive to look at it. (sbx hunt
// does this inside the sandbox, faster; this is the same with the SDK.)
func Example_huntFlaky() {
	ctx := context.Background()
	c, err := client.New("")
	if err != nil {
		log.Fatal(err)
	}
	info, err := c.Create(ctx, client.WithTemplate("base"), client.WithName("flaky"))
	if err != nil {
		log.Fatal(err)
	}
	sb := c.Sandbox(info.ID)
	defer sb.Delete(context.WithoutCancel(ctx))

	for seed := 1; seed <= 100; seed++ {
		res, err := sb.Exec(ctx, []string{"./flaky-test"}, client.WithCwd("/work"), client.WithEnv(fmt.Sprintf("SEED=%d", seed)))
		if err != nil {
			log.Fatal(err)
		}
		if res.ExitCode == 0 {
			continue
		}
		fmt.Printf("seed %d failed: exit %d\n", seed, res.ExitCode)
		// freeze the failure: no CPU, no memory on the host, processes kept
		if _, err := sb.Stop(ctx); err != nil {
			log.Fatal(err)
		}
		break
	}

	// ... later: the same processes, the same memory
	back, err := sb.Resume(ctx, client.RequireMemory())
	if err != nil {
		log.Fatal(err) // api.ErrConflict if the memory could not be restored
	}
	fmt.Println("state:", back.State, "memory restored:", back.MemoryRestored)
	leak, err := sb.WaitPort(ctx, 9000) // what the failing run left listening
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("still listening on %d: %s (pid %d)\n", leak.Port, leak.Command, leak.Pid)
	// Output:
	// seed 3 failed: exit 1
	// state: ready memory restored: true
	// still listening on 9000: flaky-helper (pid 77)
}
