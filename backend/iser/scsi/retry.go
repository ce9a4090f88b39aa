package scsi

import (
	"context"
	"math/rand/v2"
	"time"
)

// RetryClass says what to do with a completed command.
type RetryClass uint8

const (
	// RetryNo: the command succeeded or failed for good; CheckCommand tells which.
	RetryNo RetryClass = iota
	// RetryNow: re-issue at once. UNIT ATTENTION (SAM-5 §5.14: the command was not executed;
	// the attention is reported once per I_T nexus) and ABORTED COMMAND (the target gave up on
	// this attempt, typically a transport hiccup on its side).
	RetryNow
	// RetryBackoff: the target is congested (BUSY, TASK SET FULL) or the unit is becoming ready;
	// re-issue after a jittered, exponentially growing delay.
	RetryBackoff
)

// Classify decides whether resp is worth another attempt. It does not allocate.
func Classify(resp *Response) RetryClass {
	switch resp.Status {
	case StatusGood, StatusConditionMet:
		return RetryNo
	case StatusBusy, StatusTaskSetFull:
		return RetryBackoff
	case StatusCheckCondition:
	default:
		return RetryNo
	}
	// Only the two or three bytes that decide are looked at, in either sense format, so that
	// classification stays allocation-free.
	n := min(int(resp.SenseLen), MaxSense)
	if n < 3 {
		return RetryNo
	}
	var key SenseKey
	var asc, ascq uint8
	switch resp.Sense[0] & 0x7F {
	case 0x70, 0x71:
		key = SenseKey(resp.Sense[2] & 0x0F)
		if n >= 14 {
			asc, ascq = resp.Sense[12], resp.Sense[13]
		}
	case 0x72, 0x73:
		key = SenseKey(resp.Sense[1] & 0x0F)
		if n >= 4 {
			asc, ascq = resp.Sense[2], resp.Sense[3]
		}
	default:
		return RetryNo
	}
	switch key {
	case KeyUnitAttention, KeyAbortedCommand:
		return RetryNow
	case KeyNotReady:
		code := uint16(asc)<<8 | uint16(ascq)
		if code == ASCLUNotReadyBecoming || code == ASCLUNotReadyInProgress {
			return RetryBackoff
		}
	}
	return RetryNo
}

// Default retry bounds. The back-off table follows QEMU block/iscsi.c (8 ms growing ×4 up to
// 32 s, seven tries): long enough to ride out a target failover, bounded so that a dead LUN
// fails instead of hanging the caller forever.
const (
	DefaultMaxUnitAttention = 10
	DefaultMaxAborted       = 5
	DefaultMaxBackoff       = 7
	DefaultBaseDelay        = 8 * time.Millisecond
	DefaultMaxDelay         = 32 * time.Second
)

// RetryPolicy bounds how often a command is re-issued. The zero value (and nil) uses the
// defaults above.
type RetryPolicy struct {
	MaxUnitAttention int           // re-issues after UNIT ATTENTION
	MaxAborted       int           // re-issues after ABORTED COMMAND
	MaxBackoff       int           // re-issues after BUSY / TASK SET FULL / becoming ready
	BaseDelay        time.Duration // first back-off delay (before jitter)
	MaxDelay         time.Duration // cap on one back-off delay
	// Sleep waits d or until ctx ends; nil uses a timer. Tests replace it to observe the delays.
	Sleep func(ctx context.Context, d time.Duration) error
	// OnUnitAttention, if set, is told about every UNIT ATTENTION (e.g. CAPACITY DATA HAS
	// CHANGED) before the command is re-issued.
	OnUnitAttention func(cmd *Command, resp *Response)
}

// Delay is the back-off before re-issue number attempt (0-based): uniformly jittered in
// [d/2, d] where d = BaseDelay·4^attempt capped at MaxDelay. Jitter keeps many initiators that
// saw the same BUSY from coming back in lockstep.
func (p *RetryPolicy) Delay(attempt int) time.Duration {
	base, maxd := DefaultBaseDelay, DefaultMaxDelay
	if p != nil {
		if p.BaseDelay > 0 {
			base = p.BaseDelay
		}
		if p.MaxDelay > 0 {
			maxd = p.MaxDelay
		}
	}
	d := base
	for i := 0; i < attempt && d < maxd; i++ {
		d *= 4
	}
	d = min(d, maxd)
	half := d / 2
	return half + rand.N(d-half+1)
}

func (p *RetryPolicy) limits() (ua, ab, bo int) {
	ua, ab, bo = DefaultMaxUnitAttention, DefaultMaxAborted, DefaultMaxBackoff
	if p == nil {
		return
	}
	if p.MaxUnitAttention > 0 {
		ua = p.MaxUnitAttention
	}
	if p.MaxAborted > 0 {
		ab = p.MaxAborted
	}
	if p.MaxBackoff > 0 {
		bo = p.MaxBackoff
	}
	return
}

// Execute runs cmd on ex, re-issuing it as Classify and the policy allow, and returns nil when it
// completed GOOD, the context's or the Executor's error, or CheckCommand's error for the final
// response (left in resp). It allocates nothing when the first attempt succeeds.
func (p *RetryPolicy) Execute(ctx context.Context, ex Executor, cmd *Command, resp *Response) error {
	maxUA, maxAborted, maxBackoff := p.limits()
	var ua, aborted, backoff int
	for {
		resp.Reset()
		if err := ex.Execute(ctx, cmd, resp); err != nil {
			return err
		}
		switch Classify(resp) {
		case RetryNo:
			return CheckCommand(cmd, resp)
		case RetryNow:
			if isUnitAttention(resp) {
				if ua >= maxUA {
					return CheckCommand(cmd, resp)
				}
				ua++
				if p != nil && p.OnUnitAttention != nil {
					p.OnUnitAttention(cmd, resp)
				}
			} else {
				if aborted >= maxAborted {
					return CheckCommand(cmd, resp)
				}
				aborted++
			}
		case RetryBackoff:
			if backoff >= maxBackoff {
				return CheckCommand(cmd, resp)
			}
			if err := p.sleep(ctx, p.Delay(backoff)); err != nil {
				return err
			}
			backoff++
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

func isUnitAttention(resp *Response) bool {
	switch resp.Sense[0] & 0x7F {
	case 0x70, 0x71:
		return SenseKey(resp.Sense[2]&0x0F) == KeyUnitAttention
	case 0x72, 0x73:
		return SenseKey(resp.Sense[1]&0x0F) == KeyUnitAttention
	}
	return false
}

func (p *RetryPolicy) sleep(ctx context.Context, d time.Duration) error {
	if p != nil && p.Sleep != nil {
		return p.Sleep(ctx, d)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
