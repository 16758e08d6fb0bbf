package analyze

import (
	"math"
	"testing"
)

func TestFisher(t *testing.T) {
	for _, tc := range []struct {
		name       string
		a, b, c, d int
		want       float64
	}{
		// R: fisher.test(matrix(c(a,c,b,d),2))$p.value
		{"tea tasting", 3, 1, 1, 3, 0.4857143},
		{"perfect 5v5", 5, 0, 0, 5, 0.007936508},
		{"none", 0, 5, 0, 5, 1},
		{"all", 4, 0, 6, 0, 1},
		{"skewed", 10, 2, 3, 15, 0.0005323},
		{"empty", 0, 0, 0, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Fisher(tc.a, tc.b, tc.c, tc.d); math.Abs(got-tc.want) > 1e-4*math.Max(1, tc.want) && math.Abs(got-tc.want)/tc.want > 1e-3 {
				t.Errorf("Fisher(%d,%d,%d,%d) = %g, want %g", tc.a, tc.b, tc.c, tc.d, got, tc.want)
			}
		})
	}
}
