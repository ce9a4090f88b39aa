package csipool

// The background erases: a LUN DeleteVolume returned stays in the claims file's erasing list,
// out of CreateVolume's, GetCapacity's and Probe's reach, until its Eraser succeeded; then it
// leaves the list (written to the file) and is free. A failed erase (target down, login
// refused, a sample that reads back non-zero) is logged and tried again after a back-off that
// doubles up to MaxEraseRetry, for as long as the controller runs: a LUN is never freed unerased.
// Close interrupts the erases; New starts one for every LUN the file lists, so an erase cut by a
// restart starts again from the LUN's first block (zeroing is idempotent; the file records no
// progress).

import (
	"fmt"
	"time"

	"go.uber.org/zap"
)

// Erase back-off and parallelism.
const (
	// DefaultEraseRetry is the first back-off after a failed erase.
	DefaultEraseRetry = 10 * time.Second
	// MaxEraseRetry bounds the back-off: a target that comes back is erased within it.
	MaxEraseRetry = 10 * time.Minute
	// eraseParallel bounds the erases in flight: each writes a whole LUN to an array that is
	// serving other volumes.
	eraseParallel = 2
)

// startEraseLocked starts the background erase of e's LUN, unless the controller is closing (the
// LUN then stays erasing in the claims file, for the next start). c.mu is held, which orders it
// with Close's cancel, so no erase is added to bgWG once Close waits on it.
func (c *Controller) startEraseLocked(e *Erasing) {
	if c.bg.Err() != nil {
		return
	}
	c.bgWG.Add(1)
	go c.eraseLoop(*e)
}

// eraseLoop erases e's LUN until it succeeds and the claims file says so, or the controller
// closes.
func (c *Controller) eraseLoop(e Erasing) {
	defer c.bgWG.Done()
	log := c.log.With(zap.String("lun", e.LUN), zap.String("volume_id", e.VolumeID))
	lun, inPool := c.byKey[e.LUN]
	if !inPool {
		// Writing to a LUN the administrator took out of the pool could destroy data that is no
		// longer ours; handing it out is impossible anyway. Put back, it is erased at the next
		// start.
		log.Warn("a LUN waiting to be erased is no longer in the pool file: it is neither erased nor handed out")
		return
	}
	backoff := c.eraseRetry
	for attempt := 1; ; attempt++ {
		start := time.Now()
		log.Info("erasing a returned LUN", zap.Int("attempt", attempt))
		res, err := c.eraseOnce(lun)
		if c.bg.Err() != nil {
			log.Info("erase interrupted by the controller's stop; the LUN stays out of the pool and is erased at the next start")
			return
		}
		if err == nil {
			freed := func() {
				log.Info("LUN erased; it is free", zap.String("method", res.Method), zap.Int64("bytes", res.Bytes),
					zap.Duration("took", time.Since(start)), zap.Int("attempt", attempt))
			}
			if err = c.finishErase(e.LUN, freed); err == nil {
				return
			}
			// Erased again on the next attempt: rare, and cheaper than a second retry path.
			err = fmt.Errorf("the LUN is erased but the claims file could not be written: %w", err)
		}
		c.mu.Lock()
		c.eraseFailed[e.LUN] = true // CreateVolume does not wait for it
		c.mu.Unlock()
		log.Warn("erasing a returned LUN failed; it stays out of the pool and is tried again",
			zap.Int("attempt", attempt), zap.Duration("retry_in", backoff), zap.Error(err))
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-c.bg.Done():
			t.Stop()
			return
		}
		backoff = min(backoff*2, MaxEraseRetry)
	}
}

// eraseOnce runs the Eraser on lun in one of the eraseParallel slots.
func (c *Controller) eraseOnce(lun LUN) (Erased, error) {
	select {
	case c.eraseSlots <- struct{}{}:
	case <-c.bg.Done():
		return Erased{}, c.bg.Err()
	}
	defer func() { <-c.eraseSlots }()
	return c.eraser.Erase(c.bg, lun)
}

// finishErase frees an erased LUN: out of the erasing list, in memory and in the file, and its
// size known again for CreateVolume; freed is called before anyone can claim it (the log line
// comes before the volume created on it). On a failed write memory is left as it was.
func (c *Controller) finishErase(key string, freed func()) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.erasing[key]
	if e == nil {
		return nil // cannot happen: only this loop removes it
	}
	delete(c.erasing, key)
	if err := c.persistLocked(); err != nil {
		c.erasing[key] = e
		return err
	}
	delete(c.eraseFailed, key)
	c.sizes.set(key, e.Size)
	freed()
	close(c.erased) // CreateVolume calls waiting for a LUN look again
	c.erased = make(chan struct{})
	return nil
}
