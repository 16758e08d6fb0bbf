package main

import (
	"fmt"
	"time"

	"sbx.dev/sbx/api"
)

var fsCommand = &command{
	name:    "fs",
	usage:   "fs stat ID PATH | fs ls ID PATH",
	summary: "describe files in a sandbox",
	run:     runFs,
}

func runFs(e *env, args []string) error {
	pos, err := parseFlags(e.flags("fs"), args)
	if err != nil {
		return err
	}
	if len(pos) != 3 || (pos[0] != "stat" && pos[0] != "ls") {
		return usagef("fs takes stat or ls, a sandbox id and a path")
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	id, p := pos[1], pos[2]
	if pos[0] == "stat" {
		fi, err := c.Stat(e.ctx, id, p)
		if err != nil {
			return err
		}
		if e.json {
			return e.printJSON(fi)
		}
		fmt.Fprintf(e.stdout, "name: %s\n", fi.Name)
		if fi.Path != "" {
			fmt.Fprintf(e.stdout, "path: %s\n", fi.Path)
		}
		fmt.Fprintf(e.stdout, "size: %d\nmode: %s\ndir: %t\nmodified: %s\n", fi.Size, fi.Mode, fi.IsDir, fi.ModTime.Local().Format(time.RFC3339))
		if fi.Link != "" {
			fmt.Fprintf(e.stdout, "link: %s\n", fi.Link)
		}
		return nil
	}
	fis, err := c.ReadDir(e.ctx, id, p)
	if err != nil {
		return err
	}
	if e.json {
		return e.printJSON(fis)
	}
	tw := e.table()
	fmt.Fprintln(tw, "MODE\tSIZE\tMODTIME\tNAME")
	for _, fi := range fis {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", fi.Mode, fi.Size, fi.ModTime.Local().Format("2006-01-02 15:04"), displayName(fi))
	}
	return tw.Flush()
}

// displayName is a file's name, with its target when it is a link.
func displayName(fi api.FileInfo) string {
	if fi.Link != "" {
		return fi.Name + " -> " + fi.Link
	}
	return fi.Name
}
