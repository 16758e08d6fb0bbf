package flaky

import "math"

// z95 is the standard normal quantile of a two-sided 95% interval.
const z95 = 1.96

// Wilson returns the 95% Wilson score interval (z = 1.96) of a rate of
// failures in runs. Unlike the normal approximation it stays inside [0, 1]
// and is honest at 0 and at runs failures. With no runs it is [0, 1].
func Wilson(failures, runs int) (lo, hi float64) {
	if runs <= 0 {
		return 0, 1
	}
	n := float64(runs)
	p := float64(failures) / n
	z2 := z95 * z95
	denom := 1 + z2/n
	center := (p + z2/(2*n)) / denom
	margin := z95 * math.Sqrt(p*(1-p)/n+z2/(4*n*n)) / denom
	// rounding can put the ends a hair outside [0, 1] at p = 0 or 1
	return max(0, center-margin), min(1, center+margin)
}
