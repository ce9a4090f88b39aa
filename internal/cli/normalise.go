package cli

import (
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Normalise rewrites the single-dash long flags Go's flag package accepted (-cache wb,
// -cache=wb) to GNU's --cache wb for the command args name, before pflag parses them: a -NAME or
// -NAME=VALUE whose NAME is a long flag of that command (or -help). Flag values are left alone,
// and so is everything after "--".
func Normalise(root *cobra.Command, args []string) []string {
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
