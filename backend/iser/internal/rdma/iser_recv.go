//go:build cgo && linux && !nordma

package rdma

// The receive side of an iSER connection: completions, and the PDU headers and data the target
// sends (RFC 7145: a read's data arrives by RDMA Write, not in Data-In PDUs).

import (
	"fmt"
	"os"
	"time"

	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
)

func (ic *ISERConn) recvBuf(i int32) []byte {
	off := int(i) * ic.recvSize
	return ic.mem[off : off+ic.recvSize : off+ic.recvSize]
}

// onCompletion runs on the CQ poller goroutine.
func (ic *ISERConn) onCompletion(batch []Completion) {
	for i := range batch {
		wc := &batch[i]
		slot := int32(wc.ID & wrMask)
		switch wc.ID &^ wrMask {
		case wrRecv:
			if !wc.OK() {
				if pe := ic.pendingErr.Load(); pe != nil && wc.Flushed() {
					ic.fail(*pe)
				} else {
					ic.fail(fmt.Errorf("iser: receive from %s: %w", ic.remote, &CompletionError{Op: wc.Op, Status: wc.Status, VendorErr: wc.VendorErr}))
				}
				continue
			}
			ic.rxq <- rxItem{slot: slot, n: wc.ByteLen} // never blocks: one entry per descriptor
		case wrSend: // signalled, or in error: gives back its descriptor and the earlier ones
			ic.reclaim.completed(slot, ic.sendFree)
			if !wc.OK() {
				ic.fail(fmt.Errorf("iser: send to %s: %w", ic.remote, &CompletionError{Op: wc.Op, Status: wc.Status, VendorErr: wc.VendorErr}))
			}
		}
	}
}

func (ic *ISERConn) deadlineChan() (<-chan time.Time, func()) {
	d := ic.deadline.Load()
	if d == 0 {
		return nil, func() {}
	}
	t := time.NewTimer(time.Until(time.Unix(0, d)))
	return t.C, func() { t.Stop() }
}

// errTimeout satisfies os.ErrDeadlineExceeded like a net.Conn's deadline error.
var errTimeout = fmt.Errorf("iser: %w", os.ErrDeadlineExceeded)

// ReadHeader implements transport.Conn.
func (ic *ISERConn) ReadHeader(bhs *pdu.BHS) ([]byte, error) {
	if ic.cur >= 0 {
		ic.repost = append(ic.repost, RecvWR{ID: wrRecv | uint64(ic.cur), SGE: ic.mr.SGE(ic.recvBuf(ic.cur))})
		ic.cur = -1
	}
	var it rxItem
	select {
	case it = <-ic.rxq:
	default:
		// Nothing waiting: hand the consumed descriptors back before parking.
		if err := ic.flushReposts(); err != nil {
			return nil, err
		}
		tc, stop := ic.deadlineChan()
		select {
		case it = <-ic.rxq:
		case <-ic.dead:
			stop()
			// PDUs that arrived before the failure are queued before it is reported.
			select {
			case it = <-ic.rxq:
			default:
				return nil, ic.err()
			}
		case <-tc:
			stop()
			return nil, errTimeout
		}
		stop()
	}
	if len(ic.repost) >= 16 {
		if err := ic.flushReposts(); err != nil {
			return nil, err
		}
	}
	ic.cur = it.slot
	ic.memMu.RLock()
	defer ic.memMu.RUnlock()
	if ic.mem == nil {
		return nil, ErrClosed
	}
	b := ic.recvBuf(it.slot)
	n := int(it.n)
	if n > len(b) {
		return nil, fmt.Errorf("iser: receive of %d bytes in a %d-byte descriptor", n, len(b))
	}
	b = b[:n]
	if _, err := decodeHeader(b); err != nil {
		return nil, err
	}
	if n < HeaderLen+pdu.BHSLen {
		return nil, fmt.Errorf("%w: %d-byte Send holds no iSCSI header", ErrMalformedHeader, n)
	}
	copy(bhs[:], b[HeaderLen:HeaderLen+pdu.BHSLen])
	if err := bhs.Validate(int(ic.maxRecv.Load())); err != nil {
		return nil, fmt.Errorf("iser: %w", err)
	}
	ahsLen := bhs.TotalAHSLength()
	dsl := bhs.DataSegmentLength()
	ic.dataOff = HeaderLen + pdu.BHSLen + ahsLen
	ic.dataLen = dsl
	if ic.dataOff+dsl > n {
		return nil, fmt.Errorf("iser: %v PDU declares %d AHS + %d data bytes but the Send carried %d",
			bhs.Opcode(), ahsLen, dsl, n-HeaderLen-pdu.BHSLen)
	}
	if bhs.Opcode() == pdu.OpSCSIResponse {
		ic.unbounce(bhs)
	}
	var ahs []byte
	if ahsLen > 0 {
		ahs = ic.ahs[:copy(ic.ahs[:], b[HeaderLen+pdu.BHSLen:ic.dataOff])]
	}
	return ahs, nil
}

func (ic *ISERConn) flushReposts() error {
	if len(ic.repost) == 0 {
		return nil
	}
	err := ic.c.PostRecv(ic.repost...)
	ic.repost = ic.repost[:0]
	if err != nil {
		ic.fail(fmt.Errorf("iser: repost receives: %w", err))
		return ic.err()
	}
	return nil
}

// ReadData implements transport.Conn.
func (ic *ISERConn) ReadData(dst []byte) error {
	if ic.cur < 0 || len(dst) != ic.dataLen {
		return fmt.Errorf("iser: ReadData of %d bytes, the PDU carries %d", len(dst), ic.dataLen)
	}
	ic.memMu.RLock()
	defer ic.memMu.RUnlock()
	if ic.mem == nil {
		return ErrClosed
	}
	copy(dst, ic.recvBuf(ic.cur)[ic.dataOff:ic.dataOff+ic.dataLen])
	ic.dataLen = 0
	return nil
}

// DiscardData implements transport.Conn.
func (ic *ISERConn) DiscardData() error {
	ic.dataLen = 0
	return nil
}

// Buffered is what the session's reader can take without waiting (its bufferedInput): the data
// of the current PDU not read yet, and a whole receive descriptor for each PDU that arrived and
// waits in rxq. With it the reader completes the responses of one batch of receive completions
// in a run and wakes their frontends once, as it does for the responses of one TCP read.
// Reader goroutine only (dataLen is its state).
func (ic *ISERConn) Buffered() int {
	return pdu.Padded(ic.dataLen) + len(ic.rxq)*ic.recvSize // padded: what the reader asks for
}
