package cli

import (
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// General is the heading of the flags in no group (--help, and what a command adds to its flags
// directly).
const General = "General"

// groupAnnotation is the pflag annotation that names a flag's group.
const groupAnnotation = "cli.group"

// Group registers flags with reg on cmd under the heading title; help lists the groups in the
// order they are added, each group's flags in the order reg registers them.
func Group(cmd *cobra.Command, title string, reg func(fs *pflag.FlagSet)) {
	fs := pflag.NewFlagSet(title, pflag.ContinueOnError)
	fs.SortFlags = false
	reg(fs)
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Annotations == nil {
			f.Annotations = map[string][]string{}
		}
		f.Annotations[groupAnnotation] = []string{title}
	})
	cmd.Flags().AddFlagSet(fs)
}

// Hide hides cmd's flags names from its help, man page and completion; they keep working.
func Hide(cmd *cobra.Command, names ...string) {
	for _, n := range names {
		must(n, "hiding", cmd.Flags().MarkHidden(n))
	}
}

// CompleteWords offers words as the values of cmd's flag name in shell completion.
func CompleteWords(cmd *cobra.Command, name string, words ...string) {
	must(name, "completion of", cmd.RegisterFlagCompletionFunc(name, func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return words, cobra.ShellCompDirectiveNoFileComp
	}))
}

// CompleteFiles makes cmd's flags names complete file names in the shell.
func CompleteFiles(cmd *cobra.Command, names ...string) {
	for _, n := range names {
		must(n, "completion of", cmd.MarkFlagFilename(n))
	}
}

// CompleteDirs makes cmd's flags names complete directory names in the shell.
func CompleteDirs(cmd *cobra.Command, names ...string) {
	for _, n := range names {
		must(n, "completion of", cmd.MarkFlagDirname(n))
	}
}

// must panics with err, a mistake in the program's flag definitions.
func must(name, what string, err error) {
	if err != nil {
		panic("cli: " + what + " --" + name + ": " + err.Error())
	}
}
