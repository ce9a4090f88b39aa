package main

// Flags and help shared by every subcommand (spf13/pflag under spf13/cobra): GNU long options,
// flags grouped by topic in each command's help, usage printed once for --help and for usage
// errors, which exit 2.

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// usageError is a command-line mistake (exit code 2).
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, a ...any) error { return &usageError{fmt.Sprintf(format, a...)} }

// Flag groups: each command's help lists its flags under these headings, in the order the
// command adds them. A flag in no group is listed under groupGeneral (--debug, --help).
const (
	groupTarget      = "Target"
	groupReliability = "Reliability (docs/reliability.md)"
	groupNBD         = "Frontend: kernel NBD (--nbd)"
	groupUblk        = "Frontend: ublk (--ublk)"
	groupExport      = "Device and NBD export"
	groupServer      = "NBD server"
	groupTLS         = "TLS (docs/cli.md)"
	groupCache       = "Cache"
	groupService     = "Service (docs/operations.md)"
	groupOutput      = "Output"
	groupGeneral     = "General"
)

// groupAnnotation is the pflag annotation that names a flag's group.
const groupAnnotation = "iser-blk-group"

// flagGroup returns a flag set whose flags go to cmd's flags under the heading title: register
// the group's flags on it, then call add.
type flagGroup struct {
	cmd   *cobra.Command
	title string
	fs    *pflag.FlagSet
}

func newGroup(cmd *cobra.Command, title string) *flagGroup {
	fs := pflag.NewFlagSet(title, pflag.ContinueOnError)
	fs.SortFlags = false
	return &flagGroup{cmd: cmd, title: title, fs: fs}
}

// add moves the group's flags onto the command, annotated with the group's title.
func (g *flagGroup) add() {
	g.fs.VisitAll(func(f *pflag.Flag) {
		if f.Annotations == nil {
			f.Annotations = map[string][]string{}
		}
		f.Annotations[groupAnnotation] = []string{g.title}
	})
	g.cmd.Flags().AddFlagSet(g.fs)
}

// group registers flags with reg on cmd under the heading title.
func group(cmd *cobra.Command, title string, reg func(fs *pflag.FlagSet)) {
	g := newGroup(cmd, title)
	reg(g.fs)
	g.add()
}

// hide hides cmd's flags names from its help and completion; they keep working.
func hide(cmd *cobra.Command, names ...string) {
	for _, n := range names {
		if err := cmd.Flags().MarkHidden(n); err != nil {
			panic("iser-blk: hiding --" + n + ": " + err.Error())
		}
	}
}

// completeWords offers words as the values of cmd's flag name in shell completion.
func completeWords(cmd *cobra.Command, name string, words ...string) {
	err := cmd.RegisterFlagCompletionFunc(name, func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return words, cobra.ShellCompDirectiveNoFileComp
	})
	if err != nil {
		panic("iser-blk: completion of --" + name + ": " + err.Error())
	}
}

// leaf is a subcommand: Use is "NAME SYNOPSIS", Short its one-line summary, Long its
// description; nArgs positional arguments (which may come before, between or after flags).
// run returns the process exit code (exitcodes.go).
func leaf(use, short, long string, nArgs int, run func(cmd *cobra.Command, args []string) int) *cobra.Command {
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Long:  long,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != nArgs {
				return usagef("expected %d argument(s), got %d", nArgs, len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if code := run(cmd, args); code != exitOK {
				return &exitCodeError{code}
			}
			return nil
		},
		// Only flags complete; positional arguments are names and URLs the shell cannot know.
		ValidArgsFunction: cobra.NoFileCompletions,
	}
	cmd.Flags().SortFlags = false
	return cmd
}

// exitCodeError ends a command that has reported its failure itself with the exit code code.
type exitCodeError struct{ code int }

func (e *exitCodeError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// printUsage is every command's usage and help (on its error output, as the CLI always did):
// the synopsis, the description, the subcommands, and the flags under their groups' headings.
func printUsage(c *cobra.Command) error {
	w := c.ErrOrStderr()
	fmt.Fprintf(w, "usage: %s\n", synopsis(c))
	if d := strings.TrimSpace(c.Long); d != "" {
		fmt.Fprintf(w, "\n%s\n", d)
	} else if c.Short != "" {
		fmt.Fprintf(w, "\n%s\n", c.Short)
	}
	if c.HasAvailableSubCommands() {
		fmt.Fprintf(w, "\ncommands:\n")
		for _, s := range c.Commands() {
			if s.IsAvailableCommand() || s.Name() == "help" {
				fmt.Fprintf(w, "  %-11s %s\n", s.Name(), s.Short)
			}
		}
	}
	printFlagGroups(w, c.Flags())
	if c.HasAvailableSubCommands() {
		fmt.Fprintf(w, "\nRun 'iser-blk help COMMAND' or 'iser-blk COMMAND --help' for a command's flags;\n"+
			"'man iser-blk-COMMAND' once the man pages are installed (make man).\n")
	}
	return nil
}

// synopsis is "iser-blk NAME SYNOPSIS" for c.
func synopsis(c *cobra.Command) string {
	if c.HasParent() {
		return c.Parent().CommandPath() + " " + c.Use
	}
	return c.Use
}

// printFlagGroups writes fs's visible flags to w, each group under its heading, in the order the
// groups were added; flags of no group last, under groupGeneral.
func printFlagGroups(w io.Writer, fs *pflag.FlagSet) {
	var order []string
	groups := map[string]*pflag.FlagSet{}
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		title := groupGeneral
		if t := f.Annotations[groupAnnotation]; len(t) == 1 {
			title = t[0]
		}
		g := groups[title]
		if g == nil {
			g = pflag.NewFlagSet(title, pflag.ContinueOnError)
			g.SortFlags = false
			groups[title] = g
			if title != groupGeneral {
				order = append(order, title)
			}
		}
		g.AddFlag(f)
	})
	if groups[groupGeneral] != nil {
		order = append(order, groupGeneral)
	}
	for _, title := range order {
		fmt.Fprintf(w, "\n%s:\n%s", title, groups[title].FlagUsagesWrapped(0))
	}
}

// normaliseArgs rewrites the single-dash long flags Go's flag package accepted (-cache wb,
// -cache=wb) to GNU's --cache wb for the command args name, before pflag parses them: a -NAME or
// -NAME=VALUE whose NAME is a long flag of that command (deprecated spelling, docs/cli.md).
// Values are left alone, and so is everything after "--".
func normaliseArgs(root *cobra.Command, args []string) []string {
	cmd, _, err := root.Find(args)
	if err != nil || cmd == nil {
		return args
	}
	known := func(name string) *pflag.Flag {
		if name == "help" {
			return &pflag.Flag{Name: "help", NoOptDefVal: "true"}
		}
		if f := cmd.Flags().Lookup(name); f != nil {
			return f
		}
		return cmd.InheritedFlags().Lookup(name)
	}
	out := make([]string, 0, len(args))
	takesValue := false // the previous argument is a flag whose value is the next one
	for i, a := range args {
		if a == "--" {
			return append(out, args[i:]...)
		}
		if takesValue {
			takesValue = false
			out = append(out, a)
			continue
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		dashes := len(a) - len(strings.TrimLeft(a, "-"))
		f := known(name)
		if dashes == 0 || dashes > 2 || len(name) < 2 || f == nil {
			out = append(out, a)
			continue
		}
		if dashes == 1 {
			a = "-" + a
		}
		takesValue = !hasValue && f.NoOptDefVal == ""
		out = append(out, a)
	}
	return out
}

// completeFiles makes cmd's flags names complete file names in the shell.
func completeFiles(cmd *cobra.Command, names ...string) {
	for _, n := range names {
		if err := cmd.MarkFlagFilename(n); err != nil {
			panic("iser-blk: completion of --" + n + ": " + err.Error())
		}
	}
}

// completeDirs makes cmd's flags names complete directory names in the shell.
func completeDirs(cmd *cobra.Command, names ...string) {
	for _, n := range names {
		if err := cmd.MarkFlagDirname(n); err != nil {
			panic("iser-blk: completion of --" + n + ": " + err.Error())
		}
	}
}
