package control

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/dustin/go-humanize"

	"github.com/iser-blk/iser-blk/internal/status"
)

// The control protocol, version 1. A client connects to NAME.sock and writes one request: a
// JSON object on one line of at most MaxRequestBytes. The gateway answers with JSON lines:
// zero or more "progress" replies, then exactly one final reply ("status", "done" or "error").
// A connection may carry several requests in turn. Every message carries "version"; a request
// of another version gets an "unsupported_version" error naming the versions spoken.
const (
	ProtocolVersion = 1
	MaxRequestBytes = 64 << 10
	// maxReplyBytes bounds what a client accepts for one reply line (a status with many paths).
	maxReplyBytes = 4 << 20
)

// Request ops.
const (
	OpStatus  = "status"
	OpDetach  = "detach"
	OpRestart = "restart" // a planned restart; "unsupported" unless the handler is a Restarter
	OpStop    = "stop"    // with Keep: a stop that keeps the device; "unsupported" unless the handler is a Stopper
)

// Reply types.
const (
	ReplyStatus   = "status"
	ReplyProgress = "progress"
	ReplyDone     = "done"
	ReplyError    = "error"
)

// Request is one control request.
type Request struct {
	Version int    `json:"version"`
	Op      string `json:"op"`
	// Detach: Force detaches a device that is mounted or held open; TimeoutMS bounds the
	// drain and write-back (0: no bound).
	Force     bool  `json:"force,omitempty"`
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// Stop: Keep leaves the kernel device for a successor (the only stop there is: without it,
	// detach is the request).
	Keep bool `json:"keep,omitempty"`
}

// Timeout is TimeoutMS as a duration.
func (r Request) Timeout() time.Duration { return time.Duration(r.TimeoutMS) * time.Millisecond }

// Reply is one line of an answer; Type says which of the other fields is set.
type Reply struct {
	Version  int            `json:"version"`
	Type     string         `json:"type"`
	Status   *status.Status `json:"status,omitempty"`
	Progress *Progress      `json:"progress,omitempty"`
	Result   *DetachResult  `json:"result,omitempty"`
	Error    *Error         `json:"error,omitempty"`
}

// Progress is a detach's progress: a state change, or how far the write-back has come.
type Progress struct {
	State            string `json:"state"`
	Reason           string `json:"reason,omitempty"`
	DirtyBytes       uint64 `json:"dirty_bytes"`
	WrittenBackBytes uint64 `json:"written_back_bytes"`
}

// String is the progress as the CLI shows it: "STATE: W written back, D to go" during the
// write-back, else the state and its reason if any.
func (p Progress) String() string {
	switch {
	case p.DirtyBytes > 0 || p.WrittenBackBytes > 0:
		return fmt.Sprintf("%s: %s written back, %s to go", p.State, humanize.IBytes(p.WrittenBackBytes), humanize.IBytes(p.DirtyBytes))
	case p.Reason != "":
		return p.State + ": " + p.Reason
	}
	return p.State
}

// DetachResult is what a finished detach, restart or stop --keep reports: the gateway's PID and
// the bytes it wrote back on the way.
type DetachResult struct {
	PID              int    `json:"pid"` // the gateway, which exits after this reply
	WrittenBackBytes uint64 `json:"written_back_bytes"`
}

// Error codes. A Handler returns an *Error to choose one; any other error is "failed".
const (
	CodeBadRequest         = "bad_request"
	CodeTooLarge           = "too_large"
	CodeUnsupportedVersion = "unsupported_version"
	CodeUnknownOp          = "unknown_op"
	CodeUnsupported        = "unsupported"
	CodeForbidden          = "forbidden"
	CodeBusy               = "busy"
	CodeRefused            = "refused" // e.g. the device is mounted; --force overrides
	CodeFailed             = "failed"  // e.g. write-back failed; the gateway keeps running
	CodeTimeout            = "timeout"
)

// Error is an error reply.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Refused returns the error a Handler's Detach gives when the device is busy (mounted or held
// open) and the request did not force.
func Refused(format string, args ...any) error {
	return &Error{Code: CodeRefused, Message: fmt.Sprintf(format, args...)}
}

// DecodeRequest parses one request line (without its newline). It accepts exactly one JSON
// object with known fields, the current version and a known op; anything else is an *Error.
func DecodeRequest(line []byte) (Request, error) {
	var req Request
	if len(line) > MaxRequestBytes {
		return req, &Error{Code: CodeTooLarge, Message: fmt.Sprintf("request of %d bytes, limit %d", len(line), MaxRequestBytes)}
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return Request{}, &Error{Code: CodeBadRequest, Message: "malformed request: " + err.Error()}
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Request{}, &Error{Code: CodeBadRequest, Message: "malformed request: data after the JSON object"}
	}
	if req.Version != ProtocolVersion {
		return Request{}, &Error{Code: CodeUnsupportedVersion, Message: fmt.Sprintf("request version %d; this gateway speaks version %d", req.Version, ProtocolVersion)}
	}
	switch req.Op {
	case OpStatus, OpDetach, OpRestart:
	case OpStop:
		if !req.Keep {
			return Request{}, &Error{Code: CodeBadRequest, Message: "stop needs keep: to remove the device, detach"}
		}
	default:
		return Request{}, &Error{Code: CodeUnknownOp, Message: fmt.Sprintf("unknown op %.40q", req.Op)}
	}
	if req.TimeoutMS < 0 {
		return Request{}, &Error{Code: CodeBadRequest, Message: "timeout_ms is negative"}
	}
	return req, nil
}

// encodeLine marshals v as one JSON line.
func encodeLine(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
