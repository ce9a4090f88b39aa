package iser

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// DefaultPort is the IANA iSCSI port (RFC 7143 §13.1); iSER uses the same port number.
const DefaultPort = 3260

// Target is a parsed target URL: iscsi://[user@]host[:port]/IQN/LUN or iser://... The scheme
// selects the transport. A secret is never part of a URL: it would end up in shell history,
// process listings and logs, so ParseURL rejects user:password@.
type Target struct {
	Transport string // "iscsi" (TCP) or "iser" (RDMA)
	User      string // CHAP user name, "" for none
	Host      string // host name or address, without brackets
	Port      int
	IQN       string // target name
	LUN       uint16
}

// Portal is host:port, with brackets for IPv6.
func (t Target) Portal() string { return net.JoinHostPort(t.Host, strconv.Itoa(t.Port)) }

// String renders the URL (never with a secret).
func (t Target) String() string {
	u := t.Transport + "://"
	if t.User != "" {
		u += url.User(t.User).String() + "@"
	}
	return u + t.Portal() + "/" + t.IQN + "/" + strconv.Itoa(int(t.LUN))
}

// ErrBadURL is wrapped by every ParseURL error.
var ErrBadURL = errors.New("invalid target URL")

// ParseURL parses a target URL. The LUN is required: LUN 0 of many targets (tgt among them) is
// the array controller, not a disk, so defaulting to it would be a trap.
func ParseURL(s string) (Target, error) {
	bad := func(format string, a ...any) (Target, error) {
		return Target{}, fmt.Errorf("%w %q: %s", ErrBadURL, RedactURL(s), fmt.Sprintf(format, a...))
	}
	u, err := url.Parse(s)
	if err != nil {
		return bad("%v", errors.Unwrap(err))
	}
	t := Target{Transport: strings.ToLower(u.Scheme), Port: DefaultPort}
	switch t.Transport {
	case "iscsi", "iser":
	case "":
		return bad("missing scheme (want iscsi:// or iser://)")
	default:
		return bad("unknown scheme %q (want iscsi:// or iser://)", u.Scheme)
	}
	if u.User != nil {
		if _, has := u.User.Password(); has {
			return bad("a CHAP secret must not be in the URL; use --chap-secret-file or ISERBLK_CHAP_SECRET")
		}
		t.User = u.User.Username()
	}
	t.Host = u.Hostname()
	if t.Host == "" {
		return bad("missing host")
	}
	if !validHost(t.Host) {
		return bad("bad host %q", t.Host)
	}
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return bad("bad port %q", p)
		}
		t.Port = n
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return bad("unexpected query or fragment")
	}
	path := strings.TrimPrefix(u.Path, "/")
	i := strings.LastIndexByte(path, '/')
	if i < 0 {
		return bad("want /IQN/LUN after the host")
	}
	t.IQN, path = path[:i], path[i+1:]
	if !validName(t.IQN) {
		return bad("bad target name %q", t.IQN)
	}
	lun, err := strconv.ParseUint(path, 10, 16)
	if err != nil || lun > 16383 {
		return bad("bad LUN %q (want a number 0..16383)", path)
	}
	t.LUN = uint16(lun)
	return t, nil
}

// RedactURL is raw without its user information (user name and any password), for showing a
// target URL to anyone: logs, errors, the NBD export description. It is the one redaction of
// target URLs in the program. A string that does not parse as a URL loses whatever lies between
// "://" and the last "@" before the path.
func RedactURL(raw string) string {
	if u, err := url.Parse(raw); err == nil {
		u.User = nil
		return u.String()
	}
	j := strings.Index(raw, "://")
	if j < 0 {
		return raw
	}
	rest := raw[j+3:]
	auth := rest
	if k := strings.Index(rest, "/"); k >= 0 {
		auth = rest[:k]
	}
	if i := strings.LastIndex(auth, "@"); i >= 0 {
		return raw[:j+3] + rest[i+1:]
	}
	return raw
}

// validName accepts the characters RFC 7143 §4.2.7.1 allows in an iSCSI name (after
// stringprep): ASCII letters, digits, '-', '.' and ':'. Targets in practice also use upper case
// (eui. names are hex) and '_', which are accepted too.
func validName(s string) bool {
	if s == "" || len(s) > 223 {
		return false
	}
	for _, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '.', c == ':', c == '_':
		default:
			return false
		}
	}
	return true
}

// validHost accepts an IP address (IPv6 without a zone) or a DNS name.
func validHost(h string) bool {
	if strings.Contains(h, ":") {
		a, err := netip.ParseAddr(h)
		return err == nil && a.Zone() == ""
	}
	for _, c := range h {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '.', c == '_':
		default:
			return false
		}
	}
	return true
}

// ParsePortal turns a portal as `iser-blk discover` takes it, HOST[:PORT] (IPv6 in brackets,
// or an iscsi:// / iser:// prefix), into a transport scheme and a host:port for Discover. Every
// error says what is malformed.
func ParsePortal(arg string) (scheme, portal string, err error) {
	scheme = "iscsi"
	if i := strings.Index(arg, "://"); i >= 0 {
		scheme, arg = strings.ToLower(arg[:i]), strings.TrimSuffix(arg[i+3:], "/")
		if scheme != "iscsi" && scheme != "iser" {
			return "", "", fmt.Errorf("unknown scheme %q (want iscsi:// or iser://)", scheme)
		}
	}
	if arg == "" || strings.ContainsAny(arg, "/@ ") {
		return "", "", fmt.Errorf("bad portal %q: want HOST[:PORT]", arg)
	}
	host, port := arg, strconv.Itoa(DefaultPort)
	if h, p, err := net.SplitHostPort(arg); err == nil {
		host, port = h, p
	} else if strings.HasPrefix(arg, "[") && strings.HasSuffix(arg, "]") {
		host = arg[1 : len(arg)-1]
	} else if strings.Count(arg, ":") == 1 {
		return "", "", fmt.Errorf("bad portal %q: %v", arg, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "", "", fmt.Errorf("bad port %q", port)
	}
	if host == "" {
		return "", "", fmt.Errorf("bad portal %q: no host", arg)
	}
	return scheme, net.JoinHostPort(host, port), nil
}
