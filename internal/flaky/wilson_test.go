package flaky

import (
	"math"
	"testing"
)

func TestWilson(t *testing.T) {
	tests := []struct {
		name           string
		failures, runs int
		wantLo, wantHi float64
	}{
		{"none of 10", 0, 10, 0, 0.27754},
		{"half of 10", 5, 10, 0.23659, 0.76341},
		{"all of 10", 10, 10, 0.72246, 1},
		{"7 of 50", 7, 50, 0.06951, 0.26186},
		{"1 of 1", 1, 1, 0.20654, 1},
		{"30 of 100", 30, 100, 0.21895, 0.39585},
		{"no runs", 0, 0, 0, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lo, hi := Wilson(tc.failures, tc.runs)
			if math.Abs(lo-tc.wantLo) > 5e-5 || math.Abs(hi-tc.wantHi) > 5e-5 {
				t.Errorf("Wilson(%d, %d) = [%.5f, %.5f], want [%.5f, %.5f]", tc.failures, tc.runs, lo, hi, tc.wantLo, tc.wantHi)
			}
			if lo < 0 || hi > 1 || lo > hi {
				t.Errorf("Wilson(%d, %d) = [%v, %v], want 0 <= lo <= hi <= 1", tc.failures, tc.runs, lo, hi)
			}
		})
	}
}
