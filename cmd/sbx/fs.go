package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"sbx.dev/sbx/api"
)

// filesJSON is what `sbx --json fs ls` prints.
type filesJSON struct {
	Files []api.FileInfo `json:"files"`
}

func newFsCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "fs COMMAND",
		Short: "describe files in a sandbox",
		Long: "fs describes files in a sandbox without changing anything. PATH is absolute, or\n" +
			"starts at a home directory (~/x, ~name/x).",
		Args: subcommandArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return subcommandArgs(cmd, args) },
	}
	cmd.AddCommand(&cobra.Command{
		Use:               "stat [flags] ID PATH",
		Short:             "describe one file (a link itself, not what it points to)",
		Args:              exactArgs(2, "a sandbox id and a path"),
		ValidArgsFunction: completeSandboxes(e),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.client()
			if err != nil {
				return err
			}
			fi, err := c.Sandbox(args[0]).Files().Stat(e.ctx, args[1])
			if err != nil {
				return err
			}
			if e.json {
				return e.printJSON(fi)
			}
			// names come from the sandbox: quoted, so that they cannot act on the terminal
			fmt.Fprintf(e.stdout, "name: %s\n", safe(fi.Name))
			if fi.Path != "" {
				fmt.Fprintf(e.stdout, "path: %s\n", safe(fi.Path))
			}
			fmt.Fprintf(e.stdout, "size: %d\nmode: %s\ndir: %t\nmodified: %s\n", fi.Size, safe(fi.Mode), fi.IsDir, fi.ModTime.Local().Format(time.RFC3339))
			if fi.Link != "" {
				fmt.Fprintf(e.stdout, "link: %s\n", safe(fi.Link))
			}
			return nil
		},
	}, &cobra.Command{
		Use:               "ls [flags] ID PATH",
		Short:             "list a directory",
		Args:              exactArgs(2, "a sandbox id and a path"),
		ValidArgsFunction: completeSandboxes(e),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.client()
			if err != nil {
				return err
			}
			fis, err := c.Sandbox(args[0]).Files().ReadDir(e.ctx, args[1])
			if err != nil {
				return err
			}
			if e.json {
				if fis == nil {
					fis = []api.FileInfo{}
				}
				return e.printJSON(filesJSON{fis})
			}
			tw := e.table()
			fmt.Fprintln(tw, "MODE\tSIZE\tMODTIME\tNAME")
			for _, fi := range fis {
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", safe(fi.Mode), fi.Size, fi.ModTime.Local().Format("2006-01-02 15:04"), displayName(fi))
			}
			return tw.Flush()
		},
	})
	return cmd
}

// displayName is a file's name, with its target when it is a link, quoted
// for the terminal (a sandbox names its files as it likes).
func displayName(fi api.FileInfo) string {
	if fi.Link != "" {
		return safe(fi.Name) + " -> " + safe(fi.Link)
	}
	return safe(fi.Name)
}
