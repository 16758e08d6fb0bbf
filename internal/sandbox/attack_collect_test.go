package sandbox

import (
	"context"
	"sync"
	"testing"
	"time"

	"sbx.dev/sbx/api"
)

// raceTemplates is a template store of names and versions whose Collect
// lets the test act between its start and the moment it asks inUse, as a
// busy store (many versions, a slow disk, another process's lease) does.
type raceTemplates struct {
	fakeTemplates
	mu      sync.Mutex
	names   map[string]string // name -> version
	entered chan struct{}     // Collect has started
	goOn    chan struct{}     // the test lets it ask inUse
	removed []string
}

func (r *raceTemplates) Resolve(name string) (api.Template, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	v, ok := r.names[name]
	if !ok {
		return api.Template{}, api.Errorf(api.ErrNotFound, "template %s not found", name)
	}
	return api.Template{Name: name, Version: v}, nil
}

func (r *raceTemplates) Remove(name string) (api.Template, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	v := r.names[name]
	delete(r.names, name)
	return api.Template{Name: name, Version: v}, nil
}

// Collect removes every version no name points at and inUse says is unused,
// asking inUse only once the test lets it: the real store asks it after its
// first pass over the store, a while after the manager read its records.
func (r *raceTemplates) Collect(inUse func(string) bool) ([]string, error) {
	r.entered <- struct{}{}
	<-r.goOn
	r.mu.Lock()
	pointed := map[string]bool{}
	for _, v := range r.names {
		pointed[v] = true
	}
	r.mu.Unlock()
	for _, v := range []string{"sha256:v1"} {
		if !pointed[v] && !inUse(v) {
			r.removed = append(r.removed, v)
		}
	}
	return r.removed, nil
}

// TestAttackCollectStaleHolders: collectTemplates reads which versions the
// sandboxes' records hold once, before Collect starts, and Collect asks
// that snapshot later. A sandbox made on a version in between (its create
// lease already released once its record is written) and a `template rm`
// of the name (or a build --force) right after: Collect then finds the
// version pointed at by no name, held by no record it knows of and by no
// create in flight, and removes the files of a live sandbox's template, the
// very thing versioned templates exist to prevent (#10, point 4). inUse
// must read the records when it is asked (or the create's lease must last
// until a collection that started before it is over).
func TestAttackCollectStaleHolders(t *testing.T) {
	m, _ := newTestManager(t, 0)
	rt := &raceTemplates{
		fakeTemplates: fakeTemplates{dir: t.TempDir()},
		names:         map[string]string{"web": "sha256:v1", "other": "sha256:v0"},
		entered:       make(chan struct{}),
		goOn:          make(chan struct{}),
	}
	m.cfg.Templates = rt
	ctx := context.Background()

	done := make(chan struct{})
	go func() { defer close(done); m.collectTemplates(ctx) }() // a rebuild of "other" asked for it
	select {
	case <-rt.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("Collect was not called")
	}
	// meanwhile: a sandbox on web, then web removed
	sb, err := m.Create(ctx, api.CreateRequest{Template: "web"})
	if err != nil {
		t.Fatalf("create on web: %v", err)
	}
	if _, err := rt.Remove("web"); err != nil {
		t.Fatal(err)
	}
	close(rt.goOn)
	<-done
	for _, v := range rt.removed {
		if v == "sha256:v1" {
			t.Errorf("the collection removed version %s, which sandbox %s (created during the collection, on template web) holds: inUse answered from the records as they were before the create", v, sb.ID)
		}
	}
}
