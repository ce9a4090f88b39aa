package csi

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/internal/control"
	gwstatus "github.com/iser-blk/iser-blk/internal/status"
)

// HealResult counts what Heal found.
type HealResult struct {
	Adopted   int // running gateways of recorded volumes
	Restarted int // gateways started again to take over a waiting device
	Failed    int // volumes left as they were: see the log
}

// Heal adopts every recorded volume's gateway, at the plugin's start. A gateway that runs is
// left alone (the plugin needs nothing from it but its control socket). One that is gone while
// its kernel device still waits — it died, or was stopped with --keep — is started again under
// the same name, and the takeover resumes the device (or fences it when acknowledged writes may
// be lost: the volume's health then says so). One that is gone with its device was never
// fully staged or was removed by hand: the CO's next NodeStage or NodeUnstage settles it.
func (n *Node) Heal(ctx context.Context) (HealResult, error) {
	var res HealResult
	names, err := n.records.Names()
	if err != nil {
		return res, err
	}
	var errs []error
	for _, name := range names {
		err := n.heal(ctx, name, &res)
		if err != nil {
			res.Failed++
			errs = append(errs, err)
			n.log.Error("volume not healed", zap.String("name", name), zap.Error(err))
		}
		if ctx.Err() != nil {
			break
		}
	}
	return res, errors.Join(errs...)
}

func (n *Node) heal(ctx context.Context, name string, res *HealResult) error {
	unlock, err := n.locks.lock(ctx, name)
	if err != nil {
		return err
	}
	defer unlock()
	rec, ok, err := n.records.Load(name)
	if err != nil || !ok { // unstaged meanwhile: nothing to heal
		return err
	}
	log := n.log.With(zap.String("volume_id", rec.VolumeID), zap.String("name", name))
	st, err := n.gateways.Status(ctx, name)
	switch {
	case err == nil:
		res.Adopted++
		h := gwstatus.Check(st)
		log.Info("adopted a running gateway", zap.String("device", st.Gateway.FrontendPath),
			zap.String("state", st.Gateway.State), zap.Bool("healthy", h.Healthy), zap.String("why", h.Why))
		return nil
	case !errors.Is(err, control.ErrUnknownGateway):
		return fmt.Errorf("gateway does not answer: %w", err)
	case !n.gateways.Waiting(name):
		log.Warn("the volume's gateway is gone and so is its device; left for the CO's next NodeStage or NodeUnstage")
		return nil
	}
	log.Info("the volume's gateway is gone and its device waits: starting it again to take the device over")
	st, err = n.gateways.Ensure(ctx, n.spec(rec))
	if err != nil {
		return err
	}
	res.Restarted++
	h := gwstatus.Check(st)
	log.Info("gateway restarted", zap.String("device", st.Gateway.FrontendPath), zap.String("state", st.Gateway.State),
		zap.Bool("healthy", h.Healthy), zap.String("why", h.Why))
	return nil
}
