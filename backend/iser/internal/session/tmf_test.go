package session

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
)

// TestTaskManagementEndsStuckCommands: commands the target never answers are ended by ABORT
// TASK (AbortOutstanding) or LOGICAL UNIT RESET (ResetLUN) when the target confirms, failing
// with ErrTaskAborted; a refused TMF leaves the task outstanding and reports an error; the
// connection keeps working either way.
func TestTaskManagementEndsStuckCommands(t *testing.T) {
	for _, tc := range []struct {
		name     string
		stuck    int
		reset    bool
		response uint8 // the fake's TMF answer
		ended    bool
	}{
		{"abort task", 2, false, 0, true},
		{"abort task, task does not exist", 1, false, 1, true},
		{"abort task refused", 1, false, 255, false},
		{"lun reset", 3, true, 0, true},
		{"lun reset refused", 1, true, 5, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &pipeDialer{}
			f := newFake(t, d, "fake:3260", nil)
			got := make(chan pdu.BHS, 16)
			tmfs := make(chan pdu.BHS, 16)
			f.serve(func(f *fakeTarget, p wirePDU) error {
				b := p.bhs
				switch b.Opcode() {
				case pdu.OpSCSICommand:
					if b.CDB()[0] == 0x00 { // TEST UNIT READY answers; reads hang
						return f.respond(b.ITT(), 0, nil, 0, 0)
					}
					got <- b
					return nil
				case pdu.OpTaskMgmtReq:
					tmfs <- b
					var r pdu.BHS
					pdu.EncodeTaskMgmtResponse(&r, tc.response, b.ITT(), f.sns())
					f.statSN++
					return f.write(&r, nil)
				case pdu.OpLogoutReq:
					return logoutOK(f, &b)
				}
				return fmt.Errorf("unexpected %v", b.Opcode())
			})
			s := newTestSession(t, d, nil)
			mustLogin(t, s)
			errc := make(chan error, tc.stuck)
			for i := range tc.stuck {
				go func() {
					var cmd scsi.Command
					rw16(&cmd, false, int64(i)*4096, make([]byte, 4096))
					cmd.LUN = 0
					var resp scsi.Response
					errc <- s.Execute(context.Background(), &cmd, &resp)
				}()
			}
			for range tc.stuck {
				<-got
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var err error
			var n int
			if tc.reset {
				err = s.ResetLUN(ctx, 0)
			} else {
				n, err = s.AbortOutstanding(ctx)
			}
			if tc.ended != (err == nil) {
				t.Fatalf("TMF result: %v", err)
			}
			wantTMFs := tc.stuck
			if tc.reset {
				wantTMFs = 1
			}
			for range wantTMFs {
				b := <-tmfs
				if fn := b[1] & 0x7f; (tc.reset && fn != pdu.TMFLogicalUnitReset) || (!tc.reset && fn != pdu.TMFAbortTask) {
					t.Fatalf("TMF function %d", fn)
				}
			}
			if !tc.reset && tc.ended && n != tc.stuck {
				t.Fatalf("%d tasks aborted, want %d", n, tc.stuck)
			}
			if tc.ended {
				for range tc.stuck {
					select {
					case err := <-errc:
						if !errors.Is(err, ErrTaskAborted) {
							t.Fatalf("stuck command: %v, want ErrTaskAborted", err)
						}
					case <-time.After(5 * time.Second):
						t.Fatal("stuck command not ended by a confirmed TMF")
					}
				}
			} else {
				select {
				case err := <-errc:
					t.Fatalf("a refused TMF ended the command: %v", err)
				default:
				}
			}
			var resp scsi.Response
			if err := s.Execute(ctx, tur(), &resp); err != nil {
				t.Fatalf("the connection after the TMF: %v", err)
			}
			if !tc.ended {
				s.Drop(errors.New("test over"))
				for range tc.stuck {
					if err := <-errc; errors.Is(err, ErrTaskAborted) {
						t.Fatalf("dropped command reports %v", err)
					}
				}
			}
		})
	}
}
