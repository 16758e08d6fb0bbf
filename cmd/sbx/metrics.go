package main

import (
	"fmt"
	"time"
)

var metricsCommand = &command{
	name:    "metrics",
	usage:   "metrics [ID]   (without ID: sbxd's Prometheus metrics)",
	summary: "print a sandbox's CPU, memory, processes and disk use",
	run:     runMetrics,
}

func runMetrics(e *env, args []string) error {
	fs := e.flags("metrics")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return usagef("metrics takes at most one sandbox id")
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		b, err := c.Prometheus(e.ctx)
		if err != nil {
			return err
		}
		_, err = e.stdout.Write(b)
		return err
	}
	m, err := c.Metrics(e.ctx, pos[0])
	if err != nil {
		return err
	}
	if e.json {
		return e.printJSON(m)
	}
	cpu := time.Duration(m.CPUSeconds * float64(time.Second)).Round(time.Millisecond)
	_, err = fmt.Fprintf(e.stdout, "cpu: %s\nmemory: %s\nprocesses: %d\ndisk: %s\n", cpu, humanBytes(m.MemoryBytes), m.Processes, humanBytes(m.DiskBytes))
	return err
}

// humanBytes writes n in binary units: 0, 512B, 1.5KiB, 20.0MiB.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
