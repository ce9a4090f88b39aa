package chapcreds_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/internal/chapcreds"
)

// TestLoad: the user from the flag or the URL (never two different ones), the secrets from a file
// (trailing newline dropped) before the environment; half-given credentials are refused with an
// error that names what is missing and carries no secret.
func TestLoad(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	secret := write("s", "initiator-secret\n")
	tsecret := write("t", "target-secret\r\n")
	empty := write("e", "\n")
	tests := []struct {
		name    string
		s       chapcreds.Sources
		urlUser string
		env     map[string]string
		want    *iser.CHAP
		wantErr string
	}{
		{"none", chapcreds.Sources{}, "", nil, nil, ""},
		{"env ignored without a user", chapcreds.Sources{}, "", map[string]string{chapcreds.EnvSecret: "x"}, nil, ""},
		{"file", chapcreds.Sources{User: "u", SecretFile: secret}, "", nil, &iser.CHAP{User: "u", Secret: "initiator-secret"}, ""},
		{"url user + env", chapcreds.Sources{}, "alice", map[string]string{chapcreds.EnvSecret: "from-env"}, &iser.CHAP{User: "alice", Secret: "from-env"}, ""},
		{"file beats env", chapcreds.Sources{SecretFile: secret}, "alice", map[string]string{chapcreds.EnvSecret: "from-env"},
			&iser.CHAP{User: "alice", Secret: "initiator-secret"}, ""},
		{"mutual", chapcreds.Sources{User: "u", SecretFile: secret, TargetUser: "tgt", TargetSecretFile: tsecret}, "", nil,
			&iser.CHAP{User: "u", Secret: "initiator-secret", TargetUser: "tgt", TargetSecret: "target-secret"}, ""},
		{"mutual from env", chapcreds.Sources{User: "u"}, "", map[string]string{chapcreds.EnvSecret: "a", chapcreds.EnvSecretMutual: "b"},
			&iser.CHAP{User: "u", Secret: "a", TargetSecret: "b"}, ""},
		{"user without secret", chapcreds.Sources{User: "u"}, "", nil, nil, "needs a secret"},
		{"secret without user", chapcreds.Sources{SecretFile: secret}, "", nil, nil, "no CHAP user"},
		{"empty file", chapcreds.Sources{User: "u", SecretFile: empty}, "", nil, nil, "is empty"},
		{"missing file", chapcreds.Sources{User: "u", SecretFile: filepath.Join(dir, "nope")}, "", nil, nil, "reading secret file"},
		{"users disagree", chapcreds.Sources{User: "u"}, "v", nil, nil, "disagree"},
		{"target user without secret", chapcreds.Sources{User: "u", SecretFile: secret, TargetUser: "t"}, "", nil, nil, "target's secret"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(chapcreds.EnvSecret, "")
			t.Setenv(chapcreds.EnvSecretMutual, "")
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			tt.s.URLUser = tt.urlUser
			got, err := chapcreds.Load(tt.s)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want %q", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), "initiator-secret") {
					t.Fatal("error leaks the secret")
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %#v, %v; want %#v", got, err, tt.want)
			}
		})
	}
}
