package udevname

import (
	"fmt"
	"strings"

	"github.com/iser-blk/iser-blk/internal/control"
)

// backendPrefix starts every backend identifier an iser-blk gateway configures.
const backendPrefix = "iser-blk:"

// maxBackendBytes bounds what ParseBackendID looks at: a name is at most control.MaxNameLen
// bytes and a target URL a few hundred.
const maxBackendBytes = 4096

// BackendID is the NBD backend identifier of gateway name serving target (a URL without
// credentials): the kernel keeps it in /sys/block/nbdN/backend, a successor finds its device by
// it (nbd.Reattach), and udev its name (ParseBackendID).
func BackendID(name, target string) string { return backendPrefix + name + ":" + target }

// ParseBackendID is BackendID backwards. ok is false for an identifier that is not one a named
// gateway sets: another program's, an unnamed gateway's ("iser-blk:EXPORT"), or one whose name
// control.ValidateName refuses. Names cannot hold ':', so the first one after the prefix ends it.
func ParseBackendID(id string) (name, target string, ok bool) {
	id = strings.TrimSuffix(id, "\n") // sysfs shows it with a newline
	if len(id) > maxBackendBytes || !strings.HasPrefix(id, backendPrefix) {
		return "", "", false
	}
	name, target, found := strings.Cut(id[len(backendPrefix):], ":")
	if !found || !strings.Contains(target, "://") || control.ValidateName(name) != nil {
		return "", "", false
	}
	return name, target, true
}

// envValue is v when udev can take it as a property value unquoted: printable ASCII without
// spaces, quotes or backslashes; "" otherwise (the property is then left out).
func envValue(v string) string {
	for _, c := range []byte(v) {
		if c <= ' ' || c > '~' || c == '"' || c == '\'' || c == '\\' {
			return ""
		}
	}
	return v
}

// Device is what the lookup found: the gateway serving a kernel device.
type Device struct {
	Name   string // the gateway's name, valid for control.ValidateName
	Target string // the target URL without credentials ("" when unknown or unprintable)
}

// Env is d as udev's IMPORT{program} reads it: KEY=VALUE lines.
func (d Device) Env() string {
	s := fmt.Sprintf("ISER_BLK_NAME=%s\n", d.Name)
	if t := envValue(d.Target); t != "" {
		s += fmt.Sprintf("ISER_BLK_TARGET=%s\n", t)
	}
	return s
}
