package vmtest

import (
	"maps"
	"strings"
	"testing"
)

func TestParseKV(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    map[string]string
		wantErr string
	}{
		{name: "empty", in: "", want: map[string]string{}},
		{name: "one", in: "RDMA_DEV=rxe0\n", want: map[string]string{"RDMA_DEV": "rxe0"}},
		{name: "no trailing newline", in: "A=1", want: map[string]string{"A": "1"}},
		{name: "value with = and spaces", in: "LIO_ACLS=iqn.a:x iqn.b:y=z\n",
			want: map[string]string{"LIO_ACLS": "iqn.a:x iqn.b:y=z"}},
		{name: "empty value", in: "LIO_FILE=\n", want: map[string]string{"LIO_FILE": ""}},
		{name: "blank lines and CRLF", in: "\nA=1\r\n\n  \nB_2=two\n",
			want: map[string]string{"A": "1", "B_2": "two"}},
		{name: "last wins", in: "A=1\nA=2\n", want: map[string]string{"A": "2"}},
		{name: "portal with colon", in: "LIO_PORTAL=192.168.77.1:3260\n",
			want: map[string]string{"LIO_PORTAL": "192.168.77.1:3260"}},
		{name: "no equals", in: "A=1\nrxe-up.sh: link rxe0/1 state ACTIVE\n", wantErr: "line 2"},
		{name: "lower-case key", in: "dev=x\n", wantErr: "line 1"},
		{name: "empty key", in: "=x\n", wantErr: "line 1"},
		{name: "digit first", in: "1A=x\n", wantErr: "line 1"},
		{name: "space in key", in: "A B=x\n", wantErr: "line 1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseKV(strings.NewReader(tc.in))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseKV(%q) error = %v, want one containing %q", tc.in, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseKV(%q): %v", tc.in, err)
			}
			if !maps.Equal(got, tc.want) {
				t.Fatalf("ParseKV(%q) = %v, want %v", tc.in, got, tc.want)
			}
		})
	}
}

func TestParseKVLongLine(t *testing.T) {
	v := strings.Repeat("x", 100_000)
	got, err := ParseKV(strings.NewReader("LONG=" + v + "\n"))
	if err != nil || got["LONG"] != v {
		t.Fatalf("long value: err %v, len %d", err, len(got["LONG"]))
	}
}

// FuzzParseKV checks that any input either parses into keys that pass validKey and values without
// newlines, or fails with an error — never a panic.
func FuzzParseKV(f *testing.F) {
	for _, s := range []string{"", "A=1\n", "LIO_PORTAL=192.168.77.1:3260\nLIO_LUN=0\n", "x\n", "=\n", "A=b=c\r\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		got, err := ParseKV(strings.NewReader(in))
		if err != nil {
			return
		}
		for k, v := range got {
			if !validKey(k) {
				t.Fatalf("invalid key %q accepted from %q", k, in)
			}
			if strings.ContainsAny(v, "\n") {
				t.Fatalf("value %q of %s contains a newline", v, k)
			}
		}
	})
}
