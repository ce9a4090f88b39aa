// Package chapcreds gathers the CHAP credentials of a login from where the CLI allows them: the
// user from --chap-user or the target URL, the secrets from a file (--chap-secret-file,
// --target-secret-file) or the environment (ISERBLK_CHAP_SECRET, ISERBLK_CHAP_SECRET_MUTUAL).
//
// Invariants: secrets never come from argv (visible in ps and shell history) nor from the URL, and
// no error carries one; a file's trailing newline (editors add one) is not part of the secret; a
// half-given configuration (a secret without a user, a target user without its secret) is
// refused, not silently ignored.
package chapcreds

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/iser-blk/iser-blk/backend/iser"
)

// Environment variables holding CHAP secrets.
const (
	EnvSecret       = "ISERBLK_CHAP_SECRET"
	EnvSecretMutual = "ISERBLK_CHAP_SECRET_MUTUAL"
)

// Sources are where the credentials may come from; empty fields are not given.
type Sources struct {
	User             string // --chap-user
	URLUser          string // the target URL's user@
	SecretFile       string // --chap-secret-file (else $EnvSecret)
	TargetUser       string // --target-user: mutual CHAP, the name the target must present
	TargetSecretFile string // --target-secret-file (else $EnvSecretMutual)
}

// readSecret reads a secret from path, or from the environment variable env when path is "".
// A trailing newline (editors add one) is dropped. ok is false when neither is set.
func readSecret(path, env string) (secret string, ok bool, err error) {
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return "", false, fmt.Errorf("reading secret file: %v", err)
		}
		secret = strings.TrimRight(string(b), "\r\n")
		if secret == "" {
			return "", false, fmt.Errorf("secret file %s is empty", path)
		}
		return secret, true, nil
	}
	if v, set := os.LookupEnv(env); set && v != "" {
		return v, true, nil
	}
	return "", false, nil
}

// EnvSecretValue is the initiator's secret from $EnvSecret ("" when unset), for callers whose
// user comes with each target (the CSI pool's user@ URLs) rather than from Sources.
func EnvSecretValue() string {
	secret, _, _ := readSecret("", EnvSecret) // no file: never an error
	return secret
}

// Load builds the CHAP credentials from s: nil when no user is named (by flag or URL). Every
// error is a configuration the operator fixes, and none carries a secret.
func Load(s Sources) (*iser.CHAP, error) {
	user, urlUser := s.User, s.URLUser
	if urlUser != "" {
		if user != "" && user != urlUser {
			return nil, fmt.Errorf("--chap-user %q and the URL's user %q disagree", user, urlUser)
		}
		user = urlUser
	}
	if user == "" {
		if s.SecretFile != "" || s.TargetSecretFile != "" || s.TargetUser != "" {
			return nil, errors.New("CHAP secrets given but no CHAP user (--chap-user or user@ in the URL)")
		}
		return nil, nil
	}
	secret, ok, err := readSecret(s.SecretFile, EnvSecret)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("CHAP user %q needs a secret: --chap-secret-file or $%s", user, EnvSecret)
	}
	c := &iser.CHAP{User: user, Secret: secret}
	mutual, ok, err := readSecret(s.TargetSecretFile, EnvSecretMutual)
	if err != nil {
		return nil, err
	}
	if ok {
		c.TargetUser, c.TargetSecret = s.TargetUser, mutual
	} else if s.TargetUser != "" {
		return nil, fmt.Errorf("--target-user needs the target's secret: --target-secret-file or $%s", EnvSecretMutual)
	}
	return c, nil
}
