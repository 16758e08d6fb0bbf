package main

import "fmt"

var resumeCommand = &command{
	name:    "resume",
	usage:   "resume ID [--require-memory]",
	summary: "bring a stopped sandbox back, with its memory if it can be had",
	run:     runResume,
}

func runResume(e *env, args []string) error {
	fs := e.flags("resume")
	requireMemory := fs.Bool("require-memory", false, "fail, keeping the image, rather than boot from the disk")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("resume takes one sandbox id")
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	sb, err := c.Resume(e.ctx, pos[0], *requireMemory)
	if err != nil {
		return err
	}
	if e.json {
		return e.printJSON(sb)
	}
	_, err = fmt.Fprintln(e.stdout, resumed(sb.ID, sb.MemoryRestored, sb.ResumeReason))
	return err
}

// resumed says how a sandbox came back: with its memory, or from its disk and why.
func resumed(id string, memory bool, reason string) string {
	if memory {
		return fmt.Sprintf("resumed %s (memory restored)", id)
	}
	if reason == "" {
		return fmt.Sprintf("resumed %s from its disk", id)
	}
	return fmt.Sprintf("resumed %s from its disk: %s", id, reason)
}
