//go:build cgo && linux && !nordma

package rdma

// The send side of an iSER connection: send buffers, the poster, commands with the STags of
// their buffers (RFC 7145) and the bounce buffers of requests outside registered memory.

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
func (ic *ISERConn) acquireSend() (int32, error) {
	select {
	case s := <-ic.sendFree:
		return s, nil
	default:
	}
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

// send builds the descriptor (iSER header, BHS, AHS, data) and posts it. data travels as a second
// SGE straight from registered pool memory when it lies there, else it is copied into the
// descriptor (login, text, NOP payloads).
func (ic *ISERConn) send(h *Header, bhs *pdu.BHS, ahs, data []byte) error {
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
	slot, err := ic.acquireSend()
	if err != nil {
		return err
	}
	ic.memMu.RLock()
	defer ic.memMu.RUnlock()
	if ic.mem == nil {
		return ErrClosed
	}
	b := ic.sendBuf(slot)
	h.Encode(b)
	copy(b[HeaderLen:], bhs[:])
	n := HeaderLen + pdu.BHSLen
	n += copy(b[n:], ahs)
	w := SendWR{ID: wrSend | uint64(slot), Op: OpSend, Signaled: true, NSGE: 1}
	if len(data) > 0 {
		if lkey, _, ok := ic.keysFor(data); ok {
			w.NSGE = 2
			w.SGE[1] = SGE{Addr: addrOf(data), Len: uint32(len(data)), LKey: lkey}
		} else if n+len(data) <= len(b) {
			n += copy(b[n:], data)
		} else {
			ic.sendFree <- slot
			return fmt.Errorf("iser: %d-byte data segment does not fit a %d-byte descriptor", len(data), len(b)-n)
		}
	}
	w.SGE[0] = ic.mr.SGE(b[:n])
	ic.sq.push(w) // never grows the buffers: at most one entry per send slot
	select {
	case ic.sqKick <- struct{}{}:
	default: // the poster is already due to run
	}
	return nil
}

// poster posts queued sends in batches until the connection fails or closes.
func (ic *ISERConn) poster() {
	defer close(ic.posterOut)
	for {
		select {
		case <-ic.sqKick:
		case <-ic.dead:
			return
		}
		batch := ic.sq.take()
		if batch == nil {
			continue // an earlier round took what this kick announced
		}
		if err := ic.c.PostSend(batch...); err != nil {
			for _, w := range batch {
				ic.sendFree <- int32(w.ID & wrMask)
			}
			ic.fail(fmt.Errorf("iser: post %d sends: %w", len(batch), err))
			return
		}
		ic.sq.done(batch)
	}
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
	h := Header{Flags: OpcodeControl}
	buf := t.Buf
	if len(buf) > ic.opts.MaxTransfer {
		return fmt.Errorf("iser: %d-byte command exceeds the %d-byte iSER transfer limit", len(buf), ic.opts.MaxTransfer)
	}
	if len(buf) == 0 || t.Dir == scsi.DirNone {
		return ic.send(&h, bhs, ahs, nil)
	}
	_, rkey, ok := ic.keysFor(buf)
	if !ok {
		b, err := ic.bounce(t)
		if err != nil {
			return err
		}
		buf = b
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
	if err := ic.send(&h, bhs, ahs, imm); err != nil {
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
