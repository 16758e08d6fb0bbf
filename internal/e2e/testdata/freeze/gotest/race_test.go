// Package gotest is the Go acceptance test of hunt --freeze: a server
// fixture, a random token in a local variable, and a seeded race that
// fails the test now and then.
package gotest

import (
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"sbx.dev/sbx/freeze"
)

// startServer serves the last token posted to it, on 127.0.0.1:8766, until
// the test's cleanups run (then it writes /tmp/go-teardown-SEED).
func startServer(t *testing.T) {
	var token atomic.Value
	token.Store("")
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			b, _ := io.ReadAll(r.Body)
			token.Store(string(b))
			return
		}
		fmt.Fprintf(w, "token=%s\n", token.Load())
	})
	ln, err := net.Listen("tcp", "127.0.0.1:8766")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() {
		srv.Close()
		os.WriteFile("/tmp/go-teardown-"+os.Getenv("SEED"), []byte("yes\n"), 0o644)
	})
}

func TestRace(t *testing.T) {
	startServer(t)
	freeze.OnFailure(t)
	seed, _ := strconv.ParseUint(os.Getenv("SEED"), 10, 64)
	rng := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, 8)
	crand.Read(b)
	token := hex.EncodeToString(b)
	if _, err := http.Post("http://127.0.0.1:8766/", "text/plain", strings.NewReader(token)); err != nil {
		t.Fatal(err)
	}
	worker, wait := rng.IntN(20), rng.IntN(20)
	var ready atomic.Bool
	go func() {
		time.Sleep(time.Duration(worker) * time.Millisecond)
		ready.Store(true)
	}()
	time.Sleep(time.Duration(wait) * time.Millisecond)
	if !ready.Load() {
		t.Fatalf("the worker was not ready (token %d chars)", len(token)) // FAIL_LINE
	}
}
