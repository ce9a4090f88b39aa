package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
)

// TestVersionUsage: version takes --json and --help and refuses arguments with exit 2.
func TestVersionUsage(t *testing.T) {
	var out bytes.Buffer
	for _, tt := range []struct {
		args []string
		code int
	}{{[]string{"--help"}, exitOK}, {[]string{"extra"}, exitUsage}, {[]string{"--bogus"}, exitUsage}} {
		out.Reset()
		if code := run(context.Background(), append([]string{"version"}, tt.args...), io.Discard, &out); code != tt.code {
			t.Errorf("version %v: exit %d, want %d", tt.args, code, tt.code)
		}
		if n := strings.Count(out.String(), "usage: iser-blk version "); n != 1 {
			t.Errorf("version %v: usage printed %d times", tt.args, n)
		}
	}
}
