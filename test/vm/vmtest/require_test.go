//go:build vm

package vmtest

import (
	"fmt"
	"strings"
	"testing"
)

// fakeT records Fatalf instead of stopping the goroutine, so Require's decision can be tested.
type fakeT struct{ msgs []string }

func (f *fakeT) Helper() {}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.msgs = append(f.msgs, fmt.Sprintf(format, args...))
}

func TestRequireDecision(t *testing.T) {
	tests := []struct {
		name     string
		env      map[string]string
		wantFail string // "" = must not fail
	}{
		{name: "outside the guest", env: map[string]string{}, wantFail: "runs only inside the QEMU guest"},
		{name: "wrong value", env: map[string]string{EnvInVM: "yes", EnvGuestDir: "/g"}, wantFail: "runs only inside"},
		{name: "no guest dir", env: map[string]string{EnvInVM: "1"}, wantFail: EnvGuestDir},
		{name: "in the guest", env: map[string]string{EnvInVM: "1", EnvGuestDir: "/g"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeT{}
			require(f, func(k string) string { return tc.env[k] })
			if tc.wantFail == "" {
				if len(f.msgs) != 0 {
					t.Fatalf("Require failed in the guest: %v", f.msgs)
				}
				return
			}
			if len(f.msgs) == 0 || !strings.Contains(f.msgs[0], tc.wantFail) {
				t.Fatalf("Require messages %v, want one containing %q", f.msgs, tc.wantFail)
			}
			if strings.Contains(strings.Join(f.msgs, " "), "skip") {
				t.Fatalf("Require must fail, not skip: %v", f.msgs)
			}
		})
	}
}
