// Command sbx-controller is the controller of an sbx fleet on Kubernetes
// (internal/fleet/controller): it watches the node agents' Leases, marks
// the sandboxes of a node that stopped renewing lost, and serves the
// fleet's side of sbx's HTTP API (sbx node ls|cordon|uncordon, sbx list
// and info across nodes) on a TCP address, with a bearer token.
package main

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/fleet/controller"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "sbx-controller:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("sbx-controller", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "the fleet's kubeconfig")
	namespace := fs.String("namespace", v1alpha1.DefaultNamespace, "the namespace of the Sandboxes and the nodes' Leases")
	listen := fs.String("listen", "127.0.0.1:7070", "the TCP address of the fleet's sbx API")
	tokenFile := fs.String("token-file", "", "file holding the API's bearer token (default: a new one, written to --token-out)")
	tokenOut := fs.String("token-out", "", "where to write the token made when --token-file is not given")
	every := fs.Duration("check-every", controller.DefaultCheckEvery, "how often the nodes' Leases are read")
	nodeTokenFile := fs.String("node-token-file", "", "file holding one bearer token for every node agent, with which a request to a sandbox goes on to its node (or --node-token-key)")
	nodeTokenKey := fs.String("node-token-key", "", "file holding the key each node's own bearer token derives from (HMAC-SHA256 of its name, in hex), in place of one --node-token-file for all")
	elect := fs.Bool("leader-elect", true, "elect one leader among the controller's replicas (Lease "+controller.LeaderLease+"): only it checks the nodes and places; every replica serves the API")
	identity := fs.String("identity", "", "this replica's name in the election, the same across its restarts (default: HOST/LISTEN-ADDRESS)")
	moves := fs.String("move-repository", "", "the repository of the fleet's registry that stopped sandboxes move through (127.0.0.1:5000/sbx/moves): a resume of one on a cordoned node, and sbx node drain; none, they do not move")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *kubeconfig == "" {
		return errors.New("--kubeconfig (or $KUBECONFIG) is needed: the fleet's apiserver")
	}
	// the API's own token is never a node's: a node (or an address its
	// SandboxNode names) holding it could call the fleet as its users
	if *nodeTokenFile == "" && *nodeTokenKey == "" {
		return errors.New("give --node-token-key (each node its own token, derived from the key) or --node-token-file (one for every node): the fleet's API token is not sent to nodes")
	}
	token, err := readToken(*tokenFile, *tokenOut)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	var nodeToken string
	if *nodeTokenFile != "" {
		if nodeToken, err = readToken(*nodeTokenFile, ""); err != nil {
			return fmt.Errorf("--node-token-file: %w", err)
		}
		if nodeToken == token {
			return errors.New("--node-token-file holds the fleet's API token: a node holding it could call the fleet as its users; give the nodes a token of their own")
		}
	}
	var key []byte
	if *nodeTokenKey != "" {
		if *nodeTokenFile != "" {
			return errors.New("--node-token-key and --node-token-file: give one (a key derives every node's token)")
		}
		k, err := readToken(*nodeTokenKey, "")
		if err != nil {
			return fmt.Errorf("--node-token-key: %w", err)
		}
		key = []byte(k)
	}
	c, err := controller.New(controller.Config{Kubeconfig: *kubeconfig, Namespace: *namespace, CheckEvery: *every, Logger: log,
		NodeToken: nodeToken, NodeTokenKey: key, MoveRepository: *moves})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("--listen %s: %w", *listen, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// on SIGTERM: the API drains, and the leader releases its Lease (a
	// follower takes over at its next try), before the process ends
	var wg sync.WaitGroup
	if *elect {
		id := *identity
		if id == "" {
			host, _ := os.Hostname()
			id = host + "/" + ln.Addr().String()
		}
		wg.Go(func() {
			if err := c.RunElected(ctx, id); err != nil {
				log.Error("fleet controller: no leader election; this replica does not place", "err", err)
			}
		})
	} else {
		wg.Go(func() { c.Run(ctx) })
	}
	srv := &http.Server{Handler: authorize(token, c.Handler()), ReadHeaderTimeout: 10 * time.Second}
	wg.Go(func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	})
	log.Info("fleet controller serving", "listen", ln.Addr().String())
	err = srv.Serve(ln)
	stop()
	wg.Wait()
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// readToken reads the token of file, or makes one and writes it to out.
func readToken(file, out string) (string, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", err // *PathError names the file
		}
		t := strings.TrimSpace(string(b))
		if len(t) < 16 {
			return "", fmt.Errorf("%s: the token is shorter than 16 characters", file)
		}
		return t, nil
	}
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	t := hex.EncodeToString(b)
	if out == "" {
		return "", errors.New("give --token-file, or --token-out for a new token")
	}
	if err := os.WriteFile(out, []byte(t+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("--token-out: %w", err)
	}
	return t, nil
}

// authorize lets through the requests that carry the token.
func authorize(token string, h http.Handler) http.Handler {
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			err := api.Errorf(api.ErrUnauthorized, "the fleet controller wants its bearer token: set SBX_TOKEN")
			status, _ := api.StatusOf(err)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_ = json.NewEncoder(w).Encode(api.Envelope(err))
			return
		}
		h.ServeHTTP(w, r)
	})
}
