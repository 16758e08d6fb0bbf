package explain

import (
	"context"
	"fmt"
	"math"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/internal/flaky"
)

// RunsToProve is how many passing runs in a row show, with confidence
// 1-alpha, that a test which failed at rate p no longer does: the n with
// (1-p)^n <= alpha, ln(alpha)/ln(1-p) rounded up. A rate of 0 proves
// nothing (0), a rate of 1 needs one run.
func RunsToProve(p, alpha float64) int {
	switch {
	case p <= 0 || alpha <= 0 || alpha >= 1:
		return 0
	case p >= 1:
		return 1
	}
	return int(math.Ceil(math.Log(alpha)/math.Log(1-p) - 1e-9))
}

// Verdict is what a fix verification found.
type Verdict struct {
	// OldRate is the rate the fix is measured against; Need95 and Need99
	// the passing runs in a row that prove the fix at 95% and 99%.
	OldRate float64 `json:"oldRate"`
	Need95  int     `json:"need95"`
	Need99  int     `json:"need99"`
	Runs    int     `json:"runs"`
	Failed  int     `json:"failed"`
	// Fixed is true when no run failed; Confidence is then what Runs
	// passes in a row prove (0.99, 0.95, or less).
	Fixed      bool        `json:"fixed"`
	Confidence float64     `json:"confidence"`
	Summary    string      `json:"summary"`
	Failures   []flaky.Run `json:"failures"`
}

// maxVerifyRuns bounds a verification of a rare failure (p = 0.1% needs
// 4603 runs at 99%).
const maxVerifyRuns = 500

// VerifyFix runs the fixed test Need99 times (at most maxVerifyRuns) from
// the same ready state, and says whether the fix holds: "fixed with 99%
// confidence: 0 of 9 failed", or the failures.
func VerifyFix(ctx context.Context, c Client, o Options, fixed flaky.Test, oldRate float64) (*Verdict, error) {
	v := &Verdict{OldRate: oldRate, Need95: RunsToProve(oldRate, 0.05), Need99: RunsToProve(oldRate, 0.01), Failures: []flaky.Run{}}
	if v.Need99 == 0 {
		v.Summary = "no run failed before the fix: there is no rate to prove it against"
		return v, nil
	}
	// in batches, stopping at the first that fails: a fix that does not
	// hold ran all of Need99 (up to 500) before it said so
	n := min(v.Need99, maxVerifyRuns)
	batch := max(api.MaxForks, 2*parallelOf(o))
	for v.Runs < n && v.Failed == 0 {
		k := min(batch, n-v.Runs)
		res, err := flaky.FlakeRate(ctx, c, flaky.RateOptions{Sandbox: o.Sandbox, From: o.From, N: k, Parallel: o.Parallel, Test: fixed, Seed: o.Seed, ForkTTL: forkTTL(o)})
		if err != nil {
			return nil, fmt.Errorf("verify the fix: %w", err)
		}
		for _, r := range res.Runs {
			r.Run += v.Runs
			if !r.Pass {
				v.Failures = append(v.Failures, r)
			}
		}
		v.Runs += res.Summary.Runs
		v.Failed += res.Summary.Failures
	}
	if v.Failed > 0 {
		f := v.Failures[0]
		v.Summary = fmt.Sprintf("not fixed: %d of %d failed (run %d, seed %d, exit %d; replay it with --seed %d)", v.Failed, v.Runs, f.Run, f.Seed, f.ExitCode, f.Seed)
		if v.Runs < n {
			v.Summary += fmt.Sprintf("; stopped there, of the %d runs a pass needed", n)
		}
		return v, nil
	}
	v.Fixed = true
	v.Confidence = 1 - math.Pow(1-oldRate, float64(v.Runs))
	switch {
	case v.Runs >= v.Need99:
		v.Summary = fmt.Sprintf("fixed with 99%% confidence: 0 of %d failed", v.Runs)
	default:
		v.Summary = fmt.Sprintf("fixed with %.1f%% confidence: 0 of %d failed (%d runs would prove it at 99%%)", 100*v.Confidence, v.Runs, v.Need99)
	}
	return v, nil
}
