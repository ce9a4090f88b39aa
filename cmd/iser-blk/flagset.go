package main

// Flag parsing shared by every subcommand: flags interspersed with positional arguments, usage
// printed once for --help and for usage errors, which exit 2.

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

// usageError is a command-line mistake (exit code 2).
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, a ...any) error { return &usageError{fmt.Sprintf(format, a...)} }

// usageOutput is where a subcommand's usage goes (a variable so that tests can read it).
var usageOutput io.Writer = os.Stderr

// newFlagSet returns a flag set whose Usage prints the synopsis, description and flags.
// parseOrExit prints it, once, for --help and usage errors.
func newFlagSet(name, synopsis, description string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {
		w := usageOutput
		fmt.Fprintf(w, "usage: iser-blk %s %s\n\n%s\n\nflags:\n", name, synopsis, description)
		fs.SetOutput(w)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	return fs
}

// parseArgs parses flags that may appear before, between or after positional arguments and
// returns the positional ones. It returns flag.ErrHelp for -h/--help. It prints nothing: the
// flag package would call fs.Usage itself on -h and on a bad flag, and parseOrExit prints it
// after that again, so it is silenced while parsing.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	usage := fs.Usage
	fs.Usage = func() {}
	defer func() { fs.Usage = usage }()
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, usagef("%v", err)
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if rest[0] == "--" {
			return append(pos, rest[1:]...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// parseOrExit handles parseArgs' outcome for a subcommand: help exits 0, a usage error prints
// the message and the usage and exits 2. done is false when the command should go on.
func parseOrExit(fs *flag.FlagSet, args []string, nPos int) (pos []string, code int, done bool) {
	pos, err := parseArgs(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		fs.Usage()
		return nil, exitOK, true
	}
	if err == nil && len(pos) != nPos {
		err = usagef("expected %d argument(s), got %d", nPos, len(pos))
	}
	if err != nil {
		fmt.Fprintf(usageOutput, "iser-blk %s: %v\n\n", fs.Name(), err)
		fs.Usage()
		return nil, exitUsage, true
	}
	return pos, 0, false
}
