package analyze

import "math"

// Fisher is the two-sided p-value of Fisher's exact test on the 2×2 table
// [a b; c d]: the probability, with the margins fixed, of a table at most
// as likely as this one. It suits the small samples of a flaky test, where
// a chi-square test's approximation does not hold.
func Fisher(a, b, c, d int) float64 {
	if a < 0 || b < 0 || c < 0 || d < 0 {
		return 1
	}
	row1, col1, n := a+b, a+c, a+b+c+d
	if n == 0 {
		return 1
	}
	logp := func(x int) float64 { // hypergeometric P(a = x) in log
		return lchoose(col1, x) + lchoose(n-col1, row1-x) - lchoose(n, row1)
	}
	observed := logp(a)
	lo, hi := max(0, row1+col1-n), min(row1, col1)
	p := 0.0
	for x := lo; x <= hi; x++ {
		if l := logp(x); l <= observed+1e-9 {
			p += math.Exp(l)
		}
	}
	return min(1, p)
}

func lchoose(n, k int) float64 {
	if k < 0 || k > n {
		return math.Inf(-1)
	}
	a, _ := math.Lgamma(float64(n + 1))
	b, _ := math.Lgamma(float64(k + 1))
	c, _ := math.Lgamma(float64(n - k + 1))
	return a - b - c
}
