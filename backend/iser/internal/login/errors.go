package login

import (
	"errors"
	"fmt"
)

// Sentinels for errors.Is on a login failure. Every *Error matches exactly one of them.
var (
	ErrAuthFailed        = errors.New("authentication failed")          // class 2 detail 1, or a target that failed mutual CHAP
	ErrAuthorization     = errors.New("authorization failure")          // class 2 detail 2
	ErrTargetNotFound    = errors.New("target not found")               // class 2 detail 3
	ErrTargetRemoved     = errors.New("target removed")                 // class 2 detail 4
	ErrPortalUnreachable = errors.New("portal unreachable")             // dial failed
	ErrTargetUnavailable = errors.New("target temporarily unavailable") // class 3
	ErrRejected          = errors.New("login rejected by the target")   // other class 2
	ErrProtocol          = errors.New("iSCSI login protocol violation") // malformed or inconsistent responses
	ErrTooManyRedirects  = errors.New("too many login redirections")    // redirect loop
	ErrNegotiation       = errors.New("operational negotiation failed") // a key could not be agreed
	ErrConfig            = errors.New("invalid login configuration")    // caller's configuration
)

// Error is a failed login. It names the target and portal, never a secret.
type Error struct {
	Target string // target IQN ("" for discovery)
	Portal string // host:port
	// Class and Detail are the Login Response Status-Class/Status-Detail (RFC 7143 §11.13.5);
	// both zero when the failure was detected locally.
	Class, Detail uint8
	Kind          error  // one of the sentinels above
	Reason        string // human detail
	Err           error  // underlying cause, if any
}

func (e *Error) Error() string {
	who := e.Target
	if who == "" {
		who = "discovery session"
	}
	s := fmt.Sprintf("iSCSI login to %s at %s", who, e.Portal)
	if e.Err == nil || !errors.Is(e.Err, e.Kind) || e.Reason != "" {
		s += ": " + e.Kind.Error() // the cause names it already otherwise
	}
	if e.Reason != "" {
		s += ": " + e.Reason
	}
	if e.Class != 0 || e.Detail != 0 {
		s += fmt.Sprintf(" (status class %d detail %d: %s)", e.Class, e.Detail, statusText(e.Class, e.Detail))
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Is matches the sentinel Kind.
func (e *Error) Is(target error) bool { return target == e.Kind }

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// RedirectError is a Login Response with Status-Class 1 (RFC 7143 §11.13.5): the initiator should
// log in at Address instead. The session follows it a bounded number of times.
type RedirectError struct {
	Target    string
	From      string
	Address   string // host:port from TargetAddress (§13.8)
	TPGT      uint16
	Permanent bool // detail 2 (moved permanently) vs 1 (temporarily)
}

func (e *RedirectError) Error() string {
	kind := "temporarily"
	if e.Permanent {
		kind = "permanently"
	}
	return fmt.Sprintf("iSCSI target %s at %s moved %s to %s", e.Target, e.From, kind, e.Address)
}

// statusText describes a Login Response status (RFC 7143 §11.13.5).
func statusText(class, detail uint8) string {
	switch class {
	case 0:
		return "success"
	case 1:
		switch detail {
		case 1:
			return "target moved temporarily"
		case 2:
			return "target moved permanently"
		}
		return "redirection"
	case 2:
		switch detail {
		case 0:
			return "initiator error"
		case 1:
			return "authentication failure"
		case 2:
			return "authorization failure"
		case 3:
			return "not found"
		case 4:
			return "target removed"
		case 5:
			return "unsupported version"
		case 6:
			return "too many connections"
		case 7:
			return "missing parameter"
		case 8:
			return "can't include in session"
		case 9:
			return "session type not supported"
		case 10:
			return "session does not exist"
		case 11:
			return "invalid during login"
		}
		return "initiator error"
	case 3:
		switch detail {
		case 0:
			return "target error"
		case 1:
			return "service unavailable"
		case 2:
			return "out of resources"
		}
		return "target error"
	}
	return "unknown status"
}

func kindFor(class, detail uint8) error {
	switch class {
	case 2:
		switch detail {
		case 1:
			return ErrAuthFailed
		case 2:
			return ErrAuthorization
		case 3:
			return ErrTargetNotFound
		case 4:
			return ErrTargetRemoved
		}
		return ErrRejected
	case 3:
		return ErrTargetUnavailable
	}
	return ErrProtocol
}
