package scsi

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/block"
)

// scripted answers each Execute with the next response of a script.
type scripted struct {
	script []func(*Response)
	calls  int
	err    error
}

func (s *scripted) Execute(ctx context.Context, cmd *Command, resp *Response) error {
	if s.err != nil {
		return s.err
	}
	i := min(s.calls, len(s.script)-1)
	s.calls++
	s.script[i](resp)
	return nil
}

func good(r *Response)     { r.Status = StatusGood }
func busy(r *Response)     { r.Status = StatusBusy }
func tsf(r *Response)      { r.Status = StatusTaskSetFull }
func ua(r *Response)       { r.SetSense(KeyUnitAttention, 0x29, 0) }
func abrt(r *Response)     { r.SetSense(KeyAbortedCommand, 0x47, 0) }
func medium(r *Response)   { r.SetSense(KeyMediumError, 0x11, 0) }
func becoming(r *Response) { r.SetSense(KeyNotReady, 0x04, 0x01) }
func uaDesc(r *Response) {
	r.Status = StatusCheckCondition
	r.SenseLen = uint8(copy(r.Sense[:], []byte{0x72, 0x06, 0x2A, 0x09, 0, 0, 0, 0}))
}

func TestClassify(t *testing.T) {
	tests := []struct {
		name string
		set  func(*Response)
		want RetryClass
	}{
		{"good", good, RetryNo},
		{"busy", busy, RetryBackoff},
		{"task set full", tsf, RetryBackoff},
		{"unit attention", ua, RetryNow},
		{"unit attention descriptor", uaDesc, RetryNow},
		{"aborted command", abrt, RetryNow},
		{"becoming ready", becoming, RetryBackoff},
		{"medium error", medium, RetryNo},
		{"reservation conflict", func(r *Response) { r.Status = StatusReservationConflict }, RetryNo},
		{"check condition without sense", func(r *Response) { r.Status = StatusCheckCondition }, RetryNo},
	}
	for _, tt := range tests {
		var r Response
		tt.set(&r)
		if got := Classify(&r); got != tt.want {
			t.Errorf("%s: Classify = %d, want %d", tt.name, got, tt.want)
		}
	}
}

func TestRetryPolicy(t *testing.T) {
	tests := []struct {
		name      string
		script    []func(*Response)
		policy    RetryPolicy
		wantCalls int
		wantSleep int
		want      error // nil or a sentinel
	}{
		{"good first time", []func(*Response){good}, RetryPolicy{}, 1, 0, nil},
		{"UA then good", []func(*Response){ua, ua, good}, RetryPolicy{}, 3, 0, nil},
		{"UA bounded", []func(*Response){ua}, RetryPolicy{MaxUnitAttention: 3}, 4, 0, block.ErrIO},
		{"aborted then good", []func(*Response){abrt, good}, RetryPolicy{}, 2, 0, nil},
		{"aborted bounded", []func(*Response){abrt}, RetryPolicy{MaxAborted: 2}, 3, 0, block.ErrIO},
		{"busy backs off", []func(*Response){busy, tsf, good}, RetryPolicy{}, 3, 2, nil},
		{"busy bounded", []func(*Response){busy}, RetryPolicy{}, DefaultMaxBackoff + 1, DefaultMaxBackoff, block.ErrIO},
		{"medium error not retried", []func(*Response){medium, good}, RetryPolicy{}, 1, 0, block.ErrMedium},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ex := &scripted{script: tt.script}
			var delays []time.Duration
			p := tt.policy
			p.Sleep = func(ctx context.Context, d time.Duration) error { delays = append(delays, d); return nil }
			uas := 0
			p.OnUnitAttention = func(*Command, *Response) { uas++ }
			var cmd Command
			var resp Response
			cmd.Read16(0, 1, false, make([]byte, 512))
			err := p.Execute(context.Background(), ex, &cmd, &resp)
			if ex.calls != tt.wantCalls || len(delays) != tt.wantSleep {
				t.Fatalf("calls %d sleeps %d, want %d %d", ex.calls, len(delays), tt.wantCalls, tt.wantSleep)
			}
			if tt.want == nil && err != nil || tt.want != nil && !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			for i, d := range delays {
				hi := min(DefaultBaseDelay<<(2*i), DefaultMaxDelay)
				if d < hi/2 || d > hi {
					t.Errorf("delay %d = %v, want in [%v, %v]", i, d, hi/2, hi)
				}
			}
		})
	}
}

func TestRetryExecutorErrorAndCancel(t *testing.T) {
	boom := errors.New("connection reset")
	var cmd Command
	var resp Response
	cmd.TestUnitReady()
	if err := (*RetryPolicy)(nil).Execute(context.Background(), &scripted{err: boom}, &cmd, &resp); !errors.Is(err, boom) {
		t.Fatalf("executor error lost: %v", err)
	}
	// Cancelling during a back-off ends the wait with the context's error (real timer path).
	ctx, cancel := context.WithCancel(context.Background())
	p := &RetryPolicy{BaseDelay: time.Hour, MaxDelay: time.Hour}
	ex := &scripted{script: []func(*Response){func(r *Response) { cancel(); busy(r) }}}
	if err := p.Execute(ctx, ex, &cmd, &resp); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled back-off returned %v", err)
	}
}

func TestDelayTable(t *testing.T) {
	var p *RetryPolicy
	for i := range 10 {
		want := min(DefaultBaseDelay<<(2*i), DefaultMaxDelay)
		for range 50 {
			d := p.Delay(i)
			if d < want/2 || d > want {
				t.Fatalf("Delay(%d) = %v, want in [%v, %v]", i, d, want/2, want)
			}
		}
	}
}
