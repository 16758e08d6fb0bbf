package sandbox

import (
	"context"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/snapstore"
)

// TestAttackAgentKeyLegacyPublishedNotRestored: node b is an sbxd upgraded
// in place (DATA_DIR/agent/sbx-agent still there), so it publishes the
// legacy agent among the builds it holds (Agents), and the fleet's
// placement takes it for a memory image whose agent is "legacy" (the
// manifest says so). But b's adopt of such an image, pushed by node a,
// refuses the memory (PullSnapshot: "a legacy agent is whatever another
// node had last"): what a node publishes is not what it restores.
func TestAttackAgentKeyLegacyPublishedNotRestored(t *testing.T) {
	ctx := context.Background()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	reg := strings.TrimPrefix(srv.URL, "http://")
	a, _ := newTestManager(t, time.Hour)
	b, _ := newTestManager(t, time.Hour)
	for _, m := range []*Manager{a, b} {
		m.cfg.HostFacts = func() (HostFacts, error) { return testFacts, nil }
		// the agent of an sbxd of before versioned agent directories
		if err := os.WriteFile(filepath.Join(m.agentRoot(), "sbx-agent"), []byte("#!/bin/true\n# old\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	sb := stoppedSandbox(t, a, "legacy")
	// its image taken by an sbxd of before the notes, noted legacy since
	if err := os.WriteFile(filepath.Join(a.images.dir(sb.Image), imageAgentFile), []byte(agentLegacy+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if v, err := a.Get(ctx, sb.ID); err != nil || v.Agent != agentLegacy {
		t.Fatalf("a's view: agent %q (%v)", v.Agent, err)
	}
	pushed, err := a.PushSandbox(ctx, sb.ID, api.PushRequest{Ref: reg + "/sbx/moves:" + sb.ID})
	if err != nil {
		t.Fatal(err)
	}
	man, _, err := snapstore.Fetch(ctx, pushed.Ref)
	if err != nil {
		t.Fatal(err)
	}
	held := b.Agents()
	_, adoptErr := b.AdoptSandbox(ctx, api.AdoptRequest{Ref: pushed.Ref, ID: sb.ID})
	if slices.Contains(held, man.Agent) && adoptErr != nil {
		t.Errorf("node b publishes agents %v, which hold the manifest's %q (placement sends the move there), and refuses the adopt: %v", held, man.Agent, adoptErr)
	}
}

// TestAttackAgentKeyNoMemoryNoAgent: a sandbox adopted without its memory
// (another runsc) has an image of its disk alone: no process of it runs on
// any agent, and its resume boots on the node's current one. Its view says
// it runs on the legacy agent (agentOf: an image without a note), which
// the fleet mirrors into status.agent.
func TestAttackAgentKeyNoMemoryNoAgent(t *testing.T) {
	ctx := context.Background()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	reg := strings.TrimPrefix(srv.URL, "http://")
	a, _ := newTestManager(t, time.Hour)
	a.cfg.HostFacts = func() (HostFacts, error) { return testFacts, nil }
	b, _ := newTestManager(t, time.Hour)
	b.cfg.HostFacts = func() (HostFacts, error) {
		f := testFacts
		f.RunscSHA256 = strings.Repeat("cd", 32)
		return f, nil
	}
	sb := stoppedSandbox(t, a, "diskonly")
	pushed, err := a.PushSandbox(ctx, sb.ID, api.PushRequest{Ref: reg + "/sbx/moves:" + sb.ID})
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.AdoptSandbox(ctx, api.AdoptRequest{Ref: pushed.Ref, ID: sb.ID, WithoutMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	if got.Agent != "" && got.Agent != b.agentKey {
		t.Errorf("a stopped sandbox with no memory says its processes run on agent %q (want none, or the one its resume boots on, %s)", got.Agent, b.agentKey)
	}
}
