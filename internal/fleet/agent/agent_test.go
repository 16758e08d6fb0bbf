package agent

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/fleet/v1alpha1"
)

func TestParseCPUInfo(t *testing.T) {
	info := "processor\t: 0\nflags\t\t: sse2 avx fpu avx\ncache_alignment\t: 64\n\nprocessor\t: 1\nflags\t\t: sse2 fpu\ncache_alignment\t: 128\n"
	flags, line := parseCPUInfo(info)
	if diff := cmp.Diff([]string{"avx", "fpu", "sse2"}, flags); diff != "" {
		t.Errorf("flags (-want +got):\n%s", diff)
	}
	if line != 64 {
		t.Errorf("cache line: got %d, want 64", line)
	}
}

func TestBackoff(t *testing.T) {
	for _, tc := range []struct {
		n    int
		want time.Duration
	}{{1, 500 * time.Millisecond}, {2, time.Second}, {3, 2 * time.Second}, {4, 4 * time.Second}, {5, 5 * time.Second}, {50, 5 * time.Second}} {
		if got := backoff(tc.n, 5*time.Second); got != tc.want {
			t.Errorf("backoff(%d): got %v, want %v", tc.n, got, tc.want)
		}
	}
}

func TestSandboxObject(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	sb := api.Sandbox{ID: "sb_abcdefghij", Name: "n", Template: "tiny", State: api.StateReady, CreatedAt: t0.Add(123 * time.Millisecond), CPUs: 0.5}
	o := sandboxObject("node-1", "ns", sb, nil, t0)
	if o.Name != "sb-abcdefghij" || o.Status.ID != sb.ID || o.Status.State != "ready" || o.Spec.NodeName != "node-1" || o.Status.Node != "node-1" ||
		o.Spec.CPUs != "0.5" || o.Spec.OperatingMode != v1alpha1.OperatingModeRunning || o.Labels[v1alpha1.LabelNode] != "node-1" {
		t.Errorf("ready sandbox: got %+v", o)
	}
	cond := func(o *v1alpha1.Sandbox, typ string) metav1.Condition {
		for _, c := range o.Status.Conditions {
			if c.Type == typ {
				return c
			}
		}
		t.Fatalf("no %s condition in %+v", typ, o.Status.Conditions)
		return metav1.Condition{}
	}
	if c := cond(o, v1alpha1.ConditionReady); c.Status != metav1.ConditionTrue {
		t.Errorf("Ready: got %v, want True", c.Status)
	}
	// stopped later: Ready turns False now, Suspended True now
	t1 := t0.Add(time.Minute)
	sb.State = api.StateStopped
	o2 := sandboxObject("node-1", "ns", sb, o.Status.Conditions, t1)
	if o2.Spec.OperatingMode != v1alpha1.OperatingModeSuspended {
		t.Errorf("stopped: operatingMode %q, want Suspended", o2.Spec.OperatingMode)
	}
	for _, typ := range []string{v1alpha1.ConditionReady, v1alpha1.ConditionSuspended} {
		if c := cond(o2, typ); !c.LastTransitionTime.Time.Equal(t1) {
			t.Errorf("stopped: %s changed at %v, want %v", typ, c.LastTransitionTime, t1)
		}
	}
	// the same again: times are kept, so the object does not change
	o3 := sandboxObject("node-1", "ns", sb, o2.Status.Conditions, t1.Add(time.Hour))
	if diff := cmp.Diff(o2.Status, o3.Status); diff != "" {
		t.Errorf("unchanged sandbox changed its status (-want +got):\n%s", diff)
	}
}
