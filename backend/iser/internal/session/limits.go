package session

// MaxCommandData implements the device layer's TransferLimiter (backend/iser.transferLimiter): the
// largest data one SCSI command may carry on the current connection's transport, or 0 when the
// transport sets no cap. iSER has no login key for it (RFC 7145), so its transport reports the
// limit itself (tgt rejects iSER commands above 512 KiB).
func (s *Session) MaxCommandData() int64 {
	c := s.cur.Load()
	if c == nil {
		return 0
	}
	if l, ok := c.tc.(interface{ MaxTransferLength() int }); ok {
		return int64(l.MaxTransferLength())
	}
	return 0
}
