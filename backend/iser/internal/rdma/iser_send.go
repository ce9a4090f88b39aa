//go:build cgo && linux && !nordma

package rdma

// The send side of an iSER connection: send buffers, posting (sendq.go), commands with the STags
// of their buffers (RFC 7145) and the bounce buffers of requests outside registered memory.

import (
	"context"
	"fmt"
	"time"

	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
	"github.com/iser-blk/iser-blk/backend/iser/internal/transport"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
)

func (ic *ISERConn) sendBuf(i int32) []byte {
	off := ic.nrecv*ic.recvSize + int(i)*ic.sendSize
	return ic.mem[off : off+ic.sendSize : off+ic.sendSize]
}

// acquireSend takes a free send descriptor, waiting for a send completion if all are in flight.
// Before it waits it posts what the caller queued (b), since those work requests hold
// descriptors that only their completions give back.
func (ic *ISERConn) acquireSend(b *postTurn) (int32, error) {
	select {
	case s := <-ic.sendFree:
		return s, nil
	default:
	}
	_ = b.post(ic) // a failed post ends the connection: the wait below sees it
	tc, stop := ic.deadlineChan()
	defer stop()
	select {
	case s := <-ic.sendFree:
		return s, nil
	case <-ic.dead:
		return -1, ic.err()
	case <-tc:
		return -1, errTimeout
	}
}

// postTurn is one sender's call into the transport (a PDU, or a batch of them): whether one of
// its pushes made it the poster (sendQueue), so that it posts before it returns.
type postTurn struct{ poster bool }

// post posts the queue if this sender is the poster (see sendQueue); the error is the
// connection's when a post failed.
func (b *postTurn) post(ic *ISERConn) error {
	if !b.poster {
		return nil
	}
	b.poster = false
	return ic.post()
}

// finish ends the sender's call: it posts what the call queued, and returns err, the queueing's
// error, or else the post's.
func (b *postTurn) finish(ic *ISERConn, err error) error {
	if perr := b.post(ic); err == nil {
		err = perr
	}
	return err
}

// queue builds the descriptor (iSER header, BHS, AHS, data) and queues it for posting (b). data
// travels as a second SGE straight from registered pool memory when it lies there, else it is
// copied into the descriptor (login, text, NOP payloads).
func (ic *ISERConn) queue(b *postTurn, h *Header, bhs *pdu.BHS, ahs, data []byte) error {
	select {
	case <-ic.dead:
		return ic.err()
	default:
	}
	if len(ahs) > ahsRoom || len(ahs)%4 != 0 {
		return fmt.Errorf("iser: AHS of %d bytes", len(ahs))
	}
	if limit := int(ic.maxSend.Load()); len(data) > limit && ic.started.Load() {
		return fmt.Errorf("iser: %d-byte data segment exceeds TargetRecvDataSegmentLength %d", len(data), limit)
	}
	slot, err := ic.acquireSend(b)
	if err != nil {
		return err
	}
	ic.memMu.RLock()
	defer ic.memMu.RUnlock()
	if ic.mem == nil {
		return ErrClosed
	}
	d := ic.sendBuf(slot)
	h.Encode(d)
	copy(d[HeaderLen:], bhs[:])
	n := HeaderLen + pdu.BHSLen
	n += copy(d[n:], ahs)
	w := SendWR{ID: wrSend | uint64(slot), Op: OpSend, NSGE: 1} // the poster decides Signaled (reclaim.go)
	if len(data) > 0 {
		if lkey, _, ok := ic.keysFor(data); ok {
			w.NSGE = 2
			w.SGE[1] = SGE{Addr: addrOf(data), Len: uint32(len(data)), LKey: lkey}
		} else if n+len(data) <= len(d) {
			n += copy(d[n:], data)
		} else {
			ic.sendFree <- slot
			return fmt.Errorf("iser: %d-byte data segment does not fit a %d-byte descriptor", len(data), len(d)-n)
		}
	}
	w.SGE[0] = ic.mr.SGE(d[:n])
	if ic.sq.push(w) { // never grows the buffers: at most one entry per send slot
		b.poster = true
	}
	return nil
}

// post posts queued sends in batches, each as one chain, until the queue is empty: the poster's
// turn (sendQueue), which also decides which sends are signalled (reclaim.go). A failed post
// fails the connection, and the rest of the turn only empties the queue: a PDU posted after a
// lost one would reach the target behind a gap. Nothing gives back the descriptors of a failed
// post (the device may hold some of its work requests, and a descriptor given back twice would
// be worse than one lost): every sender that waits for one also waits for the connection's end.
func (ic *ISERConn) post() error {
	var err error
	for batch := ic.sq.take(); batch != nil; batch = ic.sq.take() {
		select {
		case <-ic.dead:
			err = ic.err()
		default:
			ic.reclaim.post(batch, len(ic.sendFree))
			if perr := ic.c.PostSend(batch...); perr != nil {
				ic.fail(fmt.Errorf("iser: post %d sends: %w", len(batch), perr))
				err = ic.err()
			}
		}
		ic.sq.done(batch)
	}
	return err
}

// send queues one PDU and posts it (with whatever others queued meanwhile).
func (ic *ISERConn) send(h *Header, bhs *pdu.BHS, ahs, data []byte) error {
	var b postTurn
	err := ic.queue(&b, h, bhs, ahs, data)
	return b.finish(ic, err)
}

// WritePDU implements transport.Conn.
func (ic *ISERConn) WritePDU(bhs *pdu.BHS, ahs, data []byte) error {
	h := Header{Flags: OpcodeControl}
	return ic.send(&h, bhs, ahs, data)
}

// WriteCommand implements transport.Conn: the SCSI Command goes out with the task buffer's STag
// and address, so the target RDMA-Reads write data (WSV) or RDMA-Writes read data (RSV) straight
// from/into it. A buffer that is not registered pool memory is bounced through a pool buffer.
func (ic *ISERConn) WriteCommand(bhs *pdu.BHS, ahs []byte, t *transport.Task) error {
	var b postTurn
	err := ic.queueCommand(&b, bhs, ahs, t)
	return b.finish(ic, err)
}

// WritePDUs implements transport.BatchWriter: every PDU of the batch is queued, then posted
// as one chain (one doorbell). What was queued before an error goes out too, in order.
func (ic *ISERConn) WritePDUs(batch []transport.OutPDU) error {
	var b postTurn
	var err error
	for i := range batch {
		o := &batch[i]
		if o.Task != nil {
			err = ic.queueCommand(&b, o.BHS, o.AHS, o.Task)
		} else {
			err = ic.queue(&b, &Header{Flags: OpcodeControl}, o.BHS, o.AHS, o.Data)
		}
		if err != nil {
			break
		}
	}
	return b.finish(ic, err)
}

var _ transport.BatchWriter = (*ISERConn)(nil)

// queueCommand queues a SCSI Command PDU (see WriteCommand).
func (ic *ISERConn) queueCommand(b *postTurn, bhs *pdu.BHS, ahs []byte, t *transport.Task) error {
	h := Header{Flags: OpcodeControl}
	buf := t.Buf
	if len(buf) > ic.opts.MaxTransfer {
		return fmt.Errorf("iser: %d-byte command exceeds the %d-byte iSER transfer limit", len(buf), ic.opts.MaxTransfer)
	}
	if len(buf) == 0 || t.Dir == scsi.DirNone {
		return ic.queue(b, &h, bhs, ahs, nil)
	}
	_, rkey, ok := ic.keysFor(buf)
	if !ok {
		// The bounce buffer may wait for the pool, whose buffers the PDUs queued before this one
		// hold until their responses come: post them first.
		_ = b.post(ic)
		bb, err := ic.bounce(t)
		if err != nil {
			return err
		}
		buf = bb
		if _, rkey, ok = ic.keysFor(buf); !ok {
			ic.dropBounce(t.ITT)
			return fmt.Errorf("iser: bounce buffer is not registered: %w", errNotRegistered)
		}
	}
	var imm []byte
	switch t.Dir {
	case scsi.DirWrite:
		if t.Immediate > 0 {
			imm = buf[:t.Immediate]
		}
		if t.Unsolicited < len(buf) {
			h.Flags |= FlagWSV
			h.WriteSTag = rkey
			h.WriteVA = addrOf(buf) + uint64(t.Unsolicited)
		}
	case scsi.DirRead:
		h.Flags |= FlagRSV
		h.ReadSTag = rkey
		h.ReadVA = addrOf(buf)
	}
	if err := ic.queue(b, &h, bhs, ahs, imm); err != nil {
		ic.dropBounce(t.ITT)
		return err
	}
	return nil
}

// Direct implements transport.DirectMemory: buf lies in memory the connection has registered,
// so WriteCommand advertises it as it is.
func (ic *ISERConn) Direct(buf []byte) bool {
	_, _, ok := ic.keysFor(buf)
	return ok
}

var _ transport.DirectMemory = (*ISERConn)(nil)

// bounce copies a task's foreign buffer into a pool buffer (writes) or prepares one to receive
// (reads), remembering it by ITT.
func (ic *ISERConn) bounce(t *transport.Task) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := ic.pool.Get(ctx, len(t.Buf))
	if err != nil {
		return nil, fmt.Errorf("iser: bounce buffer for a %d-byte command: %w", len(t.Buf), err)
	}
	if t.Dir == scsi.DirWrite {
		copy(b, t.Buf)
	}
	ic.bmu.Lock()
	ic.bounces[t.ITT] = &bounced{orig: t.Buf, bounce: b, dir: t.Dir}
	ic.bmu.Unlock()
	ic.Bounces.Add(1)
	return b, nil
}

// unbounce copies a bounced read's data back when its SCSI Response arrives: the target's RDMA
// Writes were placed before the Send that carries the response (RC ordering).
func (ic *ISERConn) unbounce(bhs *pdu.BHS) {
	ic.bmu.Lock()
	bt := ic.bounces[bhs.ITT()]
	ic.bmu.Unlock()
	if bt == nil || bt.dir != scsi.DirRead {
		return
	}
	n := len(bt.orig)
	if bhs.Flags()&pdu.FlagUnderflow != 0 {
		if r := int(bhs.ResidualCount()); r < n {
			n -= r
		} else {
			n = 0
		}
	}
	copy(bt.orig[:n], bt.bounce[:n])
}

func (ic *ISERConn) dropBounce(itt uint32) {
	ic.bmu.Lock()
	bt := ic.bounces[itt]
	delete(ic.bounces, itt)
	ic.bmu.Unlock()
	if bt != nil {
		ic.pool.Put(bt.bounce)
	}
}

// TaskDone implements transport.Conn. Registered pool buffers need nothing (their keys live as
// long as the region); a bounce buffer goes back to the pool.
func (ic *ISERConn) TaskDone(itt uint32) {
	ic.bmu.Lock()
	_, ok := ic.bounces[itt]
	ic.bmu.Unlock()
	if ok {
		ic.dropBounce(itt)
	}
}
