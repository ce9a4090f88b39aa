package cli

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// SetUsage makes root's and every subcommand's help and usage one text, written to the
// command's error output: "usage: " and the synopsis, the description, the subcommands, the
// flags under their groups' headings, and for a command with subcommands footer.
func SetUsage(root *cobra.Command, footer string) {
	usage := func(c *cobra.Command) error {
		printUsage(c, footer)
		return nil
	}
	root.SetUsageFunc(usage)
	root.SetHelpFunc(func(c *cobra.Command, _ []string) { printUsage(c, footer) })
}

func printUsage(c *cobra.Command, footer string) {
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
		fmt.Fprint(w, footer)
	}
}

// synopsis is "PROGRAM NAME SYNOPSIS" for c.
func synopsis(c *cobra.Command) string {
	if c.HasParent() {
		return c.Parent().CommandPath() + " " + c.Use
	}
	return c.Use
}

// printFlagGroups writes fs's visible flags to w, each group under its heading, in the order the
// groups were added; flags of no group last, under General.
func printFlagGroups(w io.Writer, fs *pflag.FlagSet) {
	var order []string
	groups := map[string]*pflag.FlagSet{}
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		title := General
		if t := f.Annotations[groupAnnotation]; len(t) == 1 {
			title = t[0]
		}
		g := groups[title]
		if g == nil {
			g = pflag.NewFlagSet(title, pflag.ContinueOnError)
			g.SortFlags = false
			groups[title] = g
			if title != General {
				order = append(order, title)
			}
		}
		g.AddFlag(f)
	})
	if groups[General] != nil {
		order = append(order, General)
	}
	for _, title := range order {
		fmt.Fprintf(w, "\n%s:\n%s", title, groups[title].FlagUsagesWrapped(0))
	}
}
