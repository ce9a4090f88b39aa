package journal

// recover rebuilds the index from the log: it follows the chain of batches from the checkpoint
// (the batch at TailPos must carry TailSeq; each next one must name its predecessor's sequence
// number and carry a larger one) and stops at the first batch that breaks it, whose header or
// data fails its checksum, or that does not fit the ring. Everything before that point is served
// again; nothing after it is (a crash can leave there only batches no completed Flush covered).
// It sets head and prevSeq and returns how many batches it applied.
func (j *Journal) recover() (int, error) {
	hdr := make([]byte, HeaderSize)
	var data []byte
	var h Header
	pos, prev, batches, first := j.tail, j.tailSeq-1, 0, true
	for pos-j.tail < j.n {
		phys := pos % j.n
		if j.n-phys < j.hdrU { // no room for a header: the writer went on at the start
			pos += j.n - phys
			continue
		}
		if _, err := j.m.ReadAt(hdr, j.unitOff(phys)); err != nil {
			return 0, err
		}
		if !j.continues(hdr, &h, first, prev) || !j.withinLUN(&h) {
			break
		}
		first = false
		if h.Kind == kindWrap {
			pos, prev = pos+j.n-phys, h.Seq
			continue
		}
		if phys+j.hdrU+uint64(h.DataUnits) > j.n {
			break
		}
		size := int(h.DataUnits) * int(j.u)
		if cap(data) < size {
			data = make([]byte, size)
		}
		data = data[:size]
		if _, err := j.m.ReadAt(data, j.unitOff(phys+j.hdrU)); err != nil {
			return 0, err
		}
		if !j.dataIntact(&h, data) {
			break
		}
		j.apply(&h, phys+j.hdrU)
		pos, prev = pos+j.hdrU+uint64(h.DataUnits), h.Seq
		batches++
	}
	j.head, j.prevSeq = pos, prev
	return batches, nil
}

// continues decodes hdr into h and reports whether it is the next batch of the chain.
func (j *Journal) continues(hdr []byte, h *Header, first bool, prev uint64) bool {
	if UnmarshalHeader(hdr, h) != nil || h.Instance != j.inst {
		return false
	}
	if first {
		return h.Seq == j.tailSeq
	}
	return h.PrevSeq == prev && h.Seq > prev
}

// withinLUN reports whether every entry of h lies on the LUN. One that does not can only come
// from a corrupt batch whose checksums hold; replaying it would make write-back fail for ever.
func (j *Journal) withinLUN(h *Header) bool {
	blocks := uint64(j.be.Size() / j.u) // entries count units
	for _, e := range h.Entries {
		if e.LBA >= blocks || uint64(e.Blocks) > blocks-e.LBA {
			return false
		}
	}
	return true
}

// dataIntact checks every data entry's checksum.
func (j *Journal) dataIntact(h *Header, data []byte) bool {
	off := 0
	for _, e := range h.Entries {
		if e.Flags != entryData {
			continue
		}
		n := int(e.Blocks) * int(j.u)
		if checksum(data[off:off+n]) != e.CRC {
			return false
		}
		off += n
	}
	return true
}

// apply brings the index up to date with a batch whose data starts at ring unit u.
func (j *Journal) apply(h *Header, u uint64) {
	for _, e := range h.Entries {
		if e.Flags == entryInvalidate {
			j.dropRange(e.LBA, uint64(e.Blocks))
			continue
		}
		for i := range uint64(e.Blocks) {
			j.idx.set(e.LBA+i, u)
			u++
		}
	}
}

// dropRange unmaps every block of [lba, lba+n).
func (j *Journal) dropRange(lba, n uint64) {
	j.idx.each(lba, n, func(b, _ uint64) bool {
		j.idx.drop(b)
		return true
	})
}

// unitOff is the byte offset of ring unit u on the cache device.
func (j *Journal) unitOff(u uint64) int64 { return LogStart + int64(u)*j.u }
