package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

func newMetricsCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "metrics [flags] [ID]",
		Short: "print a sandbox's CPU, memory, processes and disk use (without ID: sbxd's Prometheus metrics)",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 {
				return usagef("metrics takes at most one sandbox id")
			}
			return nil
		},
		ValidArgsFunction: completeSandboxes(e),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.client()
			if err != nil {
				return err
			}
			if len(args) == 0 {
				b, err := c.Prometheus(e.ctx)
				if err != nil {
					return err
				}
				if e.json {
					return e.printJSON(promJSON{parseProm(string(b))})
				}
				_, err = e.stdout.Write(b)
				return err
			}
			m, err := c.Sandbox(args[0]).Metrics(e.ctx)
			if err != nil {
				return err
			}
			if e.json {
				return e.printJSON(m)
			}
			cpu := time.Duration(m.CPUSeconds * float64(time.Second)).Round(time.Millisecond)
			_, err = fmt.Fprintf(e.stdout, "cpu: %s\nmemory: %s\nprocesses: %d\ndisk: %s\n", cpu, humanBytes(m.MemoryBytes), m.Processes, humanBytes(m.DiskBytes))
			return err
		},
	}
}

// humanBytes writes n in binary units: 0, 512B, 1.5KiB, 20.0MiB.
func humanBytes(n int64) string {
	if n < 1024 {
		return size(n)
	}
	return size(n) + "iB"
}

// promJSON is what `sbx --json metrics` prints for sbxd's own metrics.
type promJSON struct {
	Metrics []promSample `json:"metrics"`
}

// promSample is one sample of the Prometheus text format.
type promSample struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels,omitempty"`
	// Value is a number, or for NaN and ±Inf (which JSON has no number
	// for) the string Prometheus writes.
	Value any `json:"value"`
}

// parseProm reads the samples of a Prometheus text exposition; comments
// and lines it cannot read are left out.
func parseProm(text string) []promSample {
	out := []promSample{}
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		s, ok := parsePromLine(line)
		if ok {
			out = append(out, s)
		}
	}
	return out
}

func parsePromLine(line string) (promSample, bool) {
	var s promSample
	rest := line
	if i := strings.IndexAny(line, "{ "); i >= 0 && line[i] == '{' {
		s.Name = line[:i]
		labels, after, ok := parsePromLabels(line[i+1:])
		if !ok {
			return s, false
		}
		s.Labels, rest = labels, after
	} else if i >= 0 {
		s.Name, rest = line[:i], line[i:]
	} else {
		return s, false
	}
	fields := strings.Fields(rest)
	if s.Name == "" || len(fields) == 0 {
		return s, false
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return s, false
	}
	s.Value = v
	if math.IsNaN(v) || math.IsInf(v, 0) {
		s.Value = fields[0]
	}
	return s, true
}

// parsePromLabels reads `a="x",b="y\"z"}` and returns the labels and what
// follows the closing brace.
func parsePromLabels(s string) (map[string]string, string, bool) {
	labels := map[string]string{}
	for {
		s = strings.TrimLeft(s, " ,")
		if strings.HasPrefix(s, "}") {
			return labels, s[1:], true
		}
		name, rest, ok := strings.Cut(s, "=")
		if !ok || !strings.HasPrefix(rest, `"`) {
			return nil, "", false
		}
		var val strings.Builder
		i := 1
		for ; i < len(rest) && rest[i] != '"'; i++ {
			if rest[i] == '\\' && i+1 < len(rest) {
				i++
				switch rest[i] {
				case 'n':
					val.WriteByte('\n')
				default:
					val.WriteByte(rest[i])
				}
				continue
			}
			val.WriteByte(rest[i])
		}
		if i >= len(rest) {
			return nil, "", false
		}
		labels[strings.TrimSpace(name)] = val.String()
		s = rest[i+1:]
	}
}
