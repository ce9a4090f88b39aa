package control

import (
	"context"
	"fmt"
)

// Restart asks the gateway for a planned restart (OpRestart): it stops taking requests, finishes
// those in flight, writes back every dirty byte, records a clean state and re-executes its binary
// from its path on disk, keeping its PID; the new image takes its device over. Restart returns
// once the old image has answered; a refusal or a failed write-back is an *Error, and the
// gateway then keeps serving.
func (c *Client) Restart(ctx context.Context) (DetachResult, error) {
	var res DetachResult
	err := c.roundTrip(ctx, Request{Op: OpRestart}, func(r Reply) error {
		if r.Type != ReplyDone || r.Result == nil {
			return fmt.Errorf("control: unexpected %q reply to restart", r.Type)
		}
		res = *r.Result
		return nil
	}, nil)
	return res, err
}
