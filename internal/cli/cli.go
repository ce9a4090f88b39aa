// Package cli is the command-line conventions of iser-blk's commands on spf13/cobra and
// spf13/pflag, apart from the commands themselves (cmd/iser-blk):
//
//   - Flags are GNU long options registered in groups (Group). A command's help lists its
//     visible flags under their groups' headings, in the order the groups were added, and the
//     flags of no group last, under General: help groups every visible flag exactly once.
//   - Help and usage are one text (SetUsage), on the command's error output, printed for
//     --help, for `help COMMAND` and with every usage error.
//   - A leaf command (Leaf) takes an exact number of positional arguments and returns its exit
//     code. Execute returns that code, 0 for help, and ExitUsage for a usage error (a bad flag
//     or argument, an unknown command), which it reports with the command's usage.
//   - Go's flag package's single-dash long flags (-cache wb, -cache=wb) still parse: Normalise
//     rewrites only a -NAME or -NAME=VALUE whose NAME is a long flag of the command being run;
//     flag values, positional arguments, short flags and everything after "--" are left alone.
//   - Shell completion offers only flags (and the values Complete* name); man pages are
//     generated from the same commands (GenMan), so neither can drift from --help.
//
// Naming a flag that does not exist (Hide, Complete*) is a programming error and panics.
package cli

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"
)

// ExitUsage is the exit code of a usage error.
const ExitUsage = 2

// ExitError ends a command that has reported its failure itself with the exit code Code.
type ExitError struct{ Code int }

func (e *ExitError) Error() string { return fmt.Sprintf("exit status %d", e.Code) }

// Leaf is a command without subcommands: use is "NAME SYNOPSIS", short its one-line summary,
// long its description; it takes nArgs positional arguments (which may come before, between or
// after flags), and run returns the process exit code. Its flags are listed in the order they
// are added.
func Leaf(use, short, long string, nArgs int, run func(cmd *cobra.Command, args []string) int) *cobra.Command {
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Long:  long,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != nArgs {
				return fmt.Errorf("expected %d argument(s), got %d", nArgs, len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if code := run(cmd, args); code != 0 {
				return &ExitError{code}
			}
			return nil
		},
		// Only flags complete; positional arguments are names and URLs the shell cannot know.
		ValidArgsFunction: cobra.NoFileCompletions,
	}
	cmd.Flags().SortFlags = false
	return cmd
}

// Execute runs root with args (without the program name, Normalise'd) under ctx and returns the
// exit code: the command's own (ExitError), 0 for success and help, ExitUsage for every other
// error cobra returns (flags, arguments, an unknown command), reported as "COMMAND: error"
// followed by the command's usage on its error output.
func Execute(ctx context.Context, root *cobra.Command, args []string) int {
	root.SetArgs(Normalise(root, args))
	cmd, err := root.ExecuteContextC(ctx)
	var ee *ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.Code
	}
	if cmd == nil {
		cmd = root
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "%s: %v\n\n", cmd.CommandPath(), err)
	_ = cmd.Usage()
	return ExitUsage
}
