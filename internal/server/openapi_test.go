package server

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"gopkg.in/yaml.v3"

	"sbx.dev/sbx/api"
)

// openAPI is the part of api/openapi.yaml the test holds to the code.
type openAPI struct {
	Paths      map[string]map[string]yaml.Node `yaml:"paths"`
	Components struct {
		Schemas map[string]schema `yaml:"schemas"`
	} `yaml:"components"`
}

type schema struct {
	Type       string            `yaml:"type"`
	Required   []string          `yaml:"required"`
	Properties map[string]schema `yaml:"properties"`
	Enum       []string          `yaml:"enum"`
}

func loadOpenAPI(t *testing.T) openAPI {
	t.Helper()
	b, err := os.ReadFile("../../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc openAPI
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("api/openapi.yaml: %v", err)
	}
	return doc
}

// routes are the "METHOD /path" patterns the router registers, read from
// the source of Handler, so that a route added there is seen here.
func routes(t *testing.T) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "server.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) != 2 {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || sel.Sel.Name != "HandleFunc" {
			return true
		}
		lit, ok := call.Args[0].(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return true
		}
		pattern, _ := strconv.Unquote(lit.Value)
		if pattern != "/" { // the catch-all answers 404 for the rest
			out = append(out, pattern)
		}
		return true
	})
	if len(out) < 10 {
		t.Fatalf("found %d routes in server.go: the test no longer reads the router", len(out))
	}
	slices.Sort(out)
	return out
}

// TestOpenAPIRoutes: the paths and methods api/openapi.yaml describes are
// exactly those the router serves.
func TestOpenAPIRoutes(t *testing.T) {
	doc := loadOpenAPI(t)
	var described []string
	for path, item := range doc.Paths {
		for method := range item {
			switch method {
			case "get", "put", "post", "delete", "patch", "head", "options":
				described = append(described, strings.ToUpper(method)+" "+path)
			}
		}
	}
	slices.Sort(described)
	if diff := cmp.Diff(routes(t), described); diff != "" {
		t.Errorf("routes (-router +openapi.yaml):\n%s", diff)
	}
}

// wireTypes maps each schema of api/openapi.yaml to the api type it
// describes; schemas of no Go type (a stream, a WebSocket frame) map to nil.
var wireTypes = map[string]any{
	"ErrorBody":        api.ErrorBody{},
	"ErrorDetail":      api.ErrorDetail{},
	"Health":           api.Health{},
	"Sandbox":          api.Sandbox{},
	"Node":             api.Node{},
	"CreateRequest":    api.CreateRequest{},
	"NetShape":         api.NetShape{},
	"DeleteResult":     api.DeleteResult{},
	"SignalRequest":    api.SignalRequest{},
	"RenameRequest":    api.RenameRequest{},
	"SnapshotRequest":  api.SnapshotRequest{},
	"PushRequest":      api.PushRequest{},
	"PushResult":       api.PushResult{},
	"PullRequest":      api.PullRequest{},
	"PullResult":       api.PullResult{},
	"AdoptRequest":     api.AdoptRequest{},
	"DrainResult":      api.DrainResult{},
	"MoveResult":       api.MoveResult{},
	"Snapshot":         api.Snapshot{},
	"ForkRequest":      api.ForkRequest{},
	"ForkEvent":        api.ForkEvent{},
	"ResumeRequest":    api.ResumeRequest{},
	"TTLRequest":       api.TTLRequest{},
	"PersistRequest":   api.PersistRequest{},
	"Event":            api.Event{},
	"LogEvent":         api.LogEvent{},
	"Metrics":          api.Metrics{},
	"Port":             api.Port{},
	"Trace":            api.Trace{},
	"TraceEvent":       api.TraceEvent{},
	"PreviewRequest":   api.PreviewRequest{},
	"Preview":          api.Preview{},
	"ExecRequest":      api.ExecRequest{},
	"Exec":             api.Exec{},
	"ExecEvent":        api.ExecEvent{},
	"FileInfo":         api.FileInfo{},
	"Template":         api.Template{},
	"TemplateDefaults": api.TemplateDefaults{},
	"Progress":         api.Progress{},
	"ImageImport":      api.ImageImport{},
	"Storage":          api.Storage{},
	"StorageItem":      api.StorageItem{},
	"PruneRequest":     api.PruneRequest{},
	"PruneResult":      api.PruneResult{},
	"PtyControl":       ptyControl{},
	"State":            nil,
	"ExecState":        nil,
	"EventStream":      nil,
}

// jsonFields are the JSON names of t's fields, and those without omitempty
// or omitzero (which the wire always has). An embedded struct without a
// JSON name (the error envelope in a stream's frame) gives its fields, as
// encoding/json does.
func jsonFields(t reflect.Type) (all, always []string) {
	for f := range t.Fields() {
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			a, al := jsonFields(f.Type)
			all, always = append(all, a...), append(always, al...)
			continue
		}
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		all = append(all, name)
		if !strings.Contains(opts, "omitempty") && !strings.Contains(opts, "omitzero") {
			always = append(always, name)
		}
	}
	slices.Sort(all)
	slices.Sort(always)
	return all, always
}

// TestOpenAPITypes: every schema's properties are the JSON fields of its
// api type, the fields the wire always has are required, and every wire
// type of package api has its schema.
func TestOpenAPITypes(t *testing.T) {
	doc := loadOpenAPI(t)
	for name, s := range doc.Components.Schemas {
		v, ok := wireTypes[name]
		if !ok {
			t.Errorf("schema %s describes no api type the test knows: add it to wireTypes", name)
			continue
		}
		if v == nil {
			continue
		}
		typ := reflect.TypeOf(v)
		all, always := jsonFields(typ)
		var props []string
		for p := range s.Properties {
			props = append(props, p)
		}
		slices.Sort(props)
		if diff := cmp.Diff(all, props); diff != "" {
			t.Errorf("schema %s: properties (-%s +openapi.yaml):\n%s", name, typ, diff)
		}
		required := slices.Clone(s.Required)
		slices.Sort(required)
		for _, r := range required {
			if !slices.Contains(all, r) {
				t.Errorf("schema %s: required %q is no field of %s", name, r, typ)
			}
		}
		// A request's fields may all be left out; an answer always has those
		// it does not omit, and the schema must say so.
		if !strings.HasSuffix(name, "Request") && name != "PtyControl" {
			for _, a := range always {
				if !slices.Contains(required, a) && s.Properties[a].Type != "object" {
					t.Errorf("schema %s: %q is always on the wire (no omitempty in %s) but not required", name, a, typ)
				}
			}
		}
	}
	for name := range wireTypes {
		if _, ok := doc.Components.Schemas[name]; !ok {
			t.Errorf("wireTypes has %s, which openapi.yaml does not describe", name)
		}
	}
	// every struct type of package api is on the wire, so it needs its schema
	described := map[reflect.Type]bool{}
	for _, v := range wireTypes {
		if v != nil {
			described[reflect.TypeOf(v)] = true
		}
	}
	for _, name := range apiStructs(t) {
		found := false
		for typ := range described {
			if typ.Name() == name && typ.PkgPath() == "sbx.dev/sbx/api" {
				found = true
			}
		}
		// EventDetail is Event.Detail decoded by Event.Details: not on the wire;
		// DeleteOptions travel as the query of a delete (described there)
		if !found && name != "Error" && name != "EventDetail" && name != "DeleteOptions" {
			t.Errorf("api.%s has no schema in openapi.yaml", name)
		}
	}
}

// apiStructs are the exported struct types declared in package api.
func apiStructs(t *testing.T) []string {
	t.Helper()
	pkgs, err := parser.ParseDir(token.NewFileSet(), "../../api", func(fi os.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range pkgs {
		for _, f := range p.Files {
			for _, d := range f.Decls {
				g, ok := d.(*ast.GenDecl)
				if !ok {
					continue
				}
				for _, s := range g.Specs {
					ts, ok := s.(*ast.TypeSpec)
					if ok && ts.Name.IsExported() {
						if _, isStruct := ts.Type.(*ast.StructType); isStruct {
							out = append(out, ts.Name.Name)
						}
					}
				}
			}
		}
	}
	return out
}

// TestOpenAPIEnums: the states the schema lists are the api's.
func TestOpenAPIEnums(t *testing.T) {
	doc := loadOpenAPI(t)
	tests := []struct {
		schema string
		want   []string
	}{
		{"State", []string{string(api.StateCreating), string(api.StateReady), string(api.StateStopping), string(api.StateStopped),
			string(api.StateError), string(api.StateLost), string(api.StateDeleted)}},
		{"ExecState", []string{string(api.ExecRunning), string(api.ExecExited), string(api.ExecLost)}},
	}
	for _, tc := range tests {
		got := slices.Clone(doc.Components.Schemas[tc.schema].Enum)
		slices.Sort(got)
		slices.Sort(tc.want)
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s enum (-api +openapi.yaml):\n%s", tc.schema, diff)
		}
	}
}
