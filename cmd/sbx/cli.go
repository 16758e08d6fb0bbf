package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"sbx.dev/sbx/client"
)

// The groups the verbs are listed in by `sbx help`.
const (
	groupSandboxes = "sandboxes"
	groupCaptures  = "captures"
	groupRun       = "run"
	groupFiles     = "files"
	groupFlaky     = "flaky"
)

// newRoot builds sbx's command tree for one run: every verb's flags are
// fresh, so run can be called again (the tests do).
func newRoot(e *env) *cobra.Command {
	root := &cobra.Command{
		Use:   "sbx",
		Short: "sandboxes that freeze, fork and replay a failing machine",
		Long: "sbx is the command line of sbxd: sandboxes, snapshots, forks, execs, files and templates.\n\n" +
			"Exit codes: 0 success, 1 the operation failed (the message says why), 2 a usage\n" +
			"error; `sbx exec` exits with the remote command's code, a signal with 128+N.",
		Version:       version,
		Args:          rootArgs,
		RunE:          func(cmd *cobra.Command, args []string) error { return usagef("no command given") },
		SilenceErrors: true,
		SilenceUsage:  true,
		// `sbx run -it base`: say that run is no command, not that -it is
		// no flag of sbx's
		FParseErrWhitelist: cobra.FParseErrWhitelist{UnknownFlags: true},
		CompletionOptions: cobra.CompletionOptions{
			HiddenDefaultCmd: false,
		},
	}
	root.SetIn(e.stdin)
	root.SetOut(e.stdout)
	root.SetErr(e.stderr)
	pf := root.PersistentFlags()
	pf.StringVar(&e.host, "host", "", "sbxd address: unix:///path or tcp://host:port (default $SBX_HOST, else "+client.DefaultHost+")")
	pf.BoolVar(&e.json, "json", false, "print JSON on stdout: one object, or one JSON line per event")
	root.AddGroup(
		&cobra.Group{ID: groupSandboxes, Title: "Sandboxes:"},
		&cobra.Group{ID: groupCaptures, Title: "Snapshots, forks, stop and resume:"},
		&cobra.Group{ID: groupRun, Title: "Commands, logs and reach:"},
		&cobra.Group{ID: groupFiles, Title: "Files, templates and disk use:"},
		&cobra.Group{ID: groupFlaky, Title: "Flaky tests:"},
	)
	verbs := []struct {
		group string
		cmds  []*cobra.Command
	}{
		{groupSandboxes, []*cobra.Command{newNewCmd(e), newListCmd(e), newInfoCmd(e), newDeleteCmd(e), newTTLCmd(e), newPersistCmd(e), newNodeCmd(e)}},
		{groupCaptures, []*cobra.Command{newSnapshotCmd(e), newForkCmd(e), newStopCmd(e), newResumeCmd(e), newEventsCmd(e)}},
		{groupRun, []*cobra.Command{newExecCmd(e), newShellCmd(e), newAttachCmd(e), newKillCmd(e), newPsCmd(e), newLogsCmd(e), newMetricsCmd(e), newPortsCmd(e), newPreviewCmd(e), newCrashesCmd(e)}},
		{groupFiles, []*cobra.Command{newScpCmd(e), newFsCmd(e), newTemplateCmd(e), newDfCmd(e), newPruneCmd(e)}},
		{groupFlaky, []*cobra.Command{newHuntCmd(e), newFlakeRateCmd(e), newReplayCmd(e), newExplainCmd(e), newTraceCmd(e)}},
	}
	for _, v := range verbs {
		for _, c := range v.cmds {
			c.GroupID = v.group
			root.AddCommand(c)
		}
	}
	root.SetHelpCommand(newHelpCmd(e))
	root.SetHelpCommandGroupID("")
	root.SetCompletionCommandGroupID("")
	// cobra's `completion bash|zsh|fish|powershell`, made now so that an
	// unknown shell is a usage error like any other
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() == "completion" {
			c.Args = subcommandArgs
			c.RunE = func(cmd *cobra.Command, args []string) error { return subcommandArgs(cmd, args) }
		}
	}
	prepare(e, root)
	return root
}

// prepare gives every command of the tree sbx's rules: flag errors are
// usage errors (with a "did you mean"), and a command's own code marks the
// run as started, so that an error before it is known to be cobra's.
func prepare(e *env, c *cobra.Command) {
	c.SuggestionsMinimumDistance = 2
	c.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error { return flagError(cmd, err) })
	if c.RunE != nil {
		run := c.RunE
		c.RunE = func(cmd *cobra.Command, args []string) error {
			e.cmd, e.started, e.args = cmd, true, args
			return run(cmd, args)
		}
	}
	for _, sub := range c.Commands() {
		prepare(e, sub)
	}
}

// rootArgs refuses an unknown command, with the commands it may have meant.
func rootArgs(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	return usagef("unknown command %q%s", args[0], didYouMean(cmd.SuggestionsFor(args[0])))
}

// subcommandArgs is the Args of a noun whose verbs are subcommands
// (template, fs): anything else is a usage error naming them.
func subcommandArgs(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return usagef("%s takes one of: %s", cmd.Name(), strings.Join(subcommandNames(cmd), ", "))
	}
	return usagef("unknown %s command %q%s; the commands are %s", cmd.Name(), args[0],
		didYouMean(cmd.SuggestionsFor(args[0])), strings.Join(subcommandNames(cmd), ", "))
}

func subcommandNames(cmd *cobra.Command) []string {
	var names []string
	for _, c := range cmd.Commands() {
		if c.IsAvailableCommand() {
			names = append(names, c.Name())
		}
	}
	return names
}

// didYouMean says which of the suggestions may have been meant, or nothing.
func didYouMean(suggestions []string) string {
	suggestions = slices.Compact(slices.Sorted(slices.Values(suggestions)))
	switch len(suggestions) {
	case 0:
		return ""
	case 1:
		return fmt.Sprintf(" (did you mean %q?)", suggestions[0])
	}
	q := make([]string, len(suggestions))
	for i, s := range suggestions {
		q[i] = fmt.Sprintf("%q", s)
	}
	return " (did you mean one of " + strings.Join(q, ", ") + "?)"
}

// newHelpCmd is `sbx help [COMMAND...]`: an unknown topic is a usage error.
func newHelpCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "help [COMMAND]...",
		Short: "show the help of sbx or of a command",
		Args:  cobra.ArbitraryArgs,
		ValidArgsFunction: func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
			c, _, err := e.root.Find(args)
			if err != nil {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			var names []string
			for _, sub := range c.Commands() {
				if sub.IsAvailableCommand() && strings.HasPrefix(sub.Name(), toComplete) {
					names = append(names, sub.Name())
				}
			}
			return names, cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			e.started = true
			target := e.root
			for i, a := range args {
				var next *cobra.Command
				for _, sub := range target.Commands() {
					if sub.Name() == a || slices.Contains(sub.Aliases, a) {
						next = sub
					}
				}
				if next == nil {
					what := "help topic"
					if i > 0 {
						what = target.Name() + " command"
					}
					return usagef("unknown %s %q%s; run `sbx help` for the commands", what, a, didYouMean(target.SuggestionsFor(a)))
				}
				target = next
			}
			e.cmd = target
			return target.Help()
		},
	}
}

// printUsageHint writes, after a usage error, how the command is used and
// where its help is.
func (e *env) printUsageHint(w io.Writer) {
	c := e.cmd
	if c == nil || c == e.root || c.Name() == "help" {
		fmt.Fprintln(w, "usage: sbx [--host ADDR] [--json] COMMAND [ARGS]")
		fmt.Fprintln(w, "run `sbx help` for the commands")
		return
	}
	fmt.Fprintf(w, "usage: %s\n", c.UseLine())
	fmt.Fprintf(w, "run `%s --help` for its flags\n", c.CommandPath())
}

// flagError turns pflag's complaint into a usage error, with the flag the
// user may have meant, and what sbx does instead of a docker flag it lacks.
func flagError(cmd *cobra.Command, err error) error {
	msg := err.Error()
	name := ""
	switch {
	case strings.HasPrefix(msg, "unknown flag: --"):
		name = strings.TrimPrefix(msg, "unknown flag: --")
	case strings.HasPrefix(msg, "unknown shorthand flag: "):
		// -json: a long flag written with one dash
		if _, word, ok := strings.Cut(msg, " in -"); ok {
			word, _, _ = strings.Cut(word, "=")
			if cmd.Flags().Lookup(word) != nil {
				return usagef("%s (did you mean --%s?)", msg, word)
			}
			name = word
		}
	default:
		return &usageError{msg}
	}
	if hint, ok := dockerHints[cmd.Name()+" "+name]; ok {
		return usagef("%s: %s", msg, hint)
	}
	if hint, ok := dockerHints[name]; ok {
		return usagef("%s: %s", msg, hint)
	}
	if s := closestFlag(cmd.Flags(), name); s != "" {
		return usagef("%s (did you mean --%s?)", msg, s)
	}
	return &usageError{msg}
}

// dockerHints say what sbx does where a docker habit asks for a flag sbx
// does not have: "COMMAND FLAG" for a flag of one command, else "FLAG".
var dockerHints = map[string]string{
	"exec workdir":    "sbx exec takes --cwd DIR for the command's working directory",
	"exec w":          "sbx exec takes --cwd DIR for the command's working directory",
	"exec env-file":   "pass each variable with -e KEY=VALUE (`sbx exec -e A=1 -e B=2 ID CMD`)",
	"stop t":          "sbx stop has no grace period: it keeps the sandbox's memory and processes, and `sbx resume ID` brings them back as they were",
	"stop time":       "sbx stop has no grace period: it keeps the sandbox's memory and processes, and `sbx resume ID` brings them back as they were",
	"logs since":      "sbx logs has no --since; take the last lines with --tail N",
	"logs until":      "sbx logs has no --until; take the last lines with --tail N",
	"logs timestamps": "sbx logs prints no timestamps; take the last lines with --tail N, or `sbx --json logs` for each line with its time",
	"logs t":          "sbx logs prints no timestamps; take the last lines with --tail N, or `sbx --json logs` for each line with its time",
	"rm":              "sbx has no --rm: a sandbox lives until `sbx delete ID`, or until it has been idle for its --ttl",
	"volume":          "sbx has no volumes and mounts no host paths: copy files in with `sbx scp -r DIR ID:/path`",
	"v":               "sbx has no volumes and mounts no host paths: copy files in with `sbx scp -r DIR ID:/path`",
	"publish":         "ports are reached through preview URLs: `sbx preview ID PORT`",
	"p":               "ports are reached through preview URLs: `sbx preview ID PORT`",
	"privileged":      "every sandbox is a gVisor sandbox; there is no privileged mode",
	"restart":         "sbx has no restart policy: `sbx stop ID` keeps a sandbox, `sbx resume ID` brings it back",
	"entrypoint":      "give the command after the sandbox id: `sbx exec ID CMD [ARGS...]`",
	"interactive":     "only `sbx exec` takes -i, with -t: `sbx exec -it ID CMD`",
	"a":               "`sbx list` lists every sandbox; `sbx ps ID` lists one sandbox's execs",
	"all":             "`sbx list` lists every sandbox; `sbx ps ID` lists one sandbox's execs",
}

// closestFlag is the flag of fs whose name is nearest to name (a typo of
// at most two letters, or a prefix of it), or "".
func closestFlag(fs *pflag.FlagSet, name string) string {
	if name == "" {
		return ""
	}
	best, bestDist := "", 3
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		d := levenshtein(strings.ToLower(name), f.Name)
		if strings.HasPrefix(f.Name, name) && len(name) >= 3 {
			d = min(d, 1)
		}
		if d < bestDist {
			best, bestDist = f.Name, d
		}
	})
	return best
}

// levenshtein is the edit distance of a and b.
func levenshtein(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// remoteArgs splits the arguments of a verb that runs a command (exec,
// shell, hunt, flake-rate, replay): its fixed arguments (the first fixed
// ones), then sbx's own flags, then the command, which owns everything from
// its first word on: `sbx exec ID ls -la` runs `ls -la`, and `sbx exec ID
// ls --timeout 5s` gives --timeout to ls. A `--` before the command is
// accepted, not needed. cobra has parsed the flags before the first fixed
// argument (the verb does not intersperse); those between the fixed
// arguments and the command are parsed here. It returns flag.ErrHelp's
// cobra equivalent when --help came among sbx's flags.
func remoteArgs(cmd *cobra.Command, args []string, fixed int) (pos, command []string, err error) {
	rest := args
	for len(pos) < fixed && len(rest) > 0 {
		pos = append(pos, rest[0])
		rest = rest[1:]
		fs := cmd.Flags()
		if err := fs.Parse(rest); err != nil {
			return nil, nil, flagError(cmd, err)
		}
		if help, _ := fs.GetBool("help"); help {
			return nil, nil, errHelp
		}
		rest = fs.Args()
	}
	return pos, rest, nil
}

// errHelp asks for the command's help, as --help does.
var errHelp = errors.New("help requested")

// remote wraps the RunE of a verb that runs a command: --help among its
// flags after the fixed arguments shows the help too.
func remote(run func(cmd *cobra.Command, args []string) error) func(cmd *cobra.Command, args []string) error {
	return func(cmd *cobra.Command, args []string) error {
		err := run(cmd, args)
		if errors.Is(err, errHelp) {
			return cmd.Help()
		}
		return err
	}
}

// exactArgs is cobra.ExactArgs as a usage error that says what the
// arguments are.
func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usagef("%s takes %s, got %d argument(s)", cmd.Name(), what, len(args))
		}
		return nil
	}
}

// rangeArgs is cobra.RangeArgs as a usage error that says what the
// arguments are.
func rangeArgs(min, max int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < min || len(args) > max {
			return usagef("%s takes %s, got %d argument(s)", cmd.Name(), what, len(args))
		}
		return nil
	}
}

// completeSandboxes completes the first argument with the ids and names of
// the sandboxes sbxd has.
func completeSandboxes(e *env) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveDefault
		}
		c, err := e.client()
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ctx, cancel := context.WithTimeout(e.ctx, 2*time.Second)
		defer cancel()
		sbs, err := c.List(ctx)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var out []string
		for _, sb := range sbs {
			for _, s := range []string{sb.ID, sb.Name} {
				if s != "" && strings.HasPrefix(s, toComplete) {
					out = append(out, s+"\t"+string(sb.State))
				}
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}
