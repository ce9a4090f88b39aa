package nbd

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The handshake: fixed newstyle negotiation (proto.md "Handshake", "Fixed newstyle negotiation",
// "Option types"), with NBD_OPT_STARTTLS on listeners served with TLS (tls.go, proto.md "TLS
// support").

var errAbort = errors.New("nbd: client aborted negotiation")

// negotiation is the state of one connection's option haggling.
type negotiation struct {
	c          *conn
	br         *bufio.Reader
	bw         *bufio.Writer
	fixed      bool // the client set NBD_FLAG_C_FIXED_NEWSTYLE (TLS needs it)
	noZeroes   bool
	structured bool
	tlsDone    bool // NBD_OPT_STARTTLS succeeded: everything since went through TLS
}

// negotiate runs the fixed newstyle negotiation on c. It returns the negotiated export when the
// client enters transmission, or an error when the connection must end.
func (c *conn) negotiate() (export, error) {
	n := &negotiation{c: c, br: c.br, bw: bufio.NewWriterSize(c.stream, 4096)}
	if err := n.greet(); err != nil {
		return export{}, err
	}
	for {
		opt, data, err := n.readOption()
		if err != nil {
			return export{}, err
		}
		e, done, err := n.handle(opt, data)
		if err != nil || done {
			return e, err
		}
	}
}

// greet sends the server's greeting and reads the client's flags.
func (n *negotiation) greet() error {
	var b [18]byte
	binary.BigEndian.PutUint64(b[0:8], magicNBD)
	binary.BigEndian.PutUint64(b[8:16], magicOption)
	binary.BigEndian.PutUint16(b[16:18], flagFixedNewstyle|flagNoZeroes)
	if _, err := n.bw.Write(b[:18]); err != nil {
		return err
	}
	if err := n.bw.Flush(); err != nil {
		return err
	}
	if _, err := io.ReadFull(n.br, b[:4]); err != nil {
		return fmt.Errorf("nbd: reading client flags: %w", err)
	}
	cflags := binary.BigEndian.Uint32(b[:4])
	if cflags&^(cflagFixedNewstyle|cflagNoZeroes) != 0 {
		// "the server MUST drop the TCP connection if the client sets an unknown flag"
		return fmt.Errorf("nbd: unknown client flags %#x", cflags)
	}
	n.fixed = cflags&cflagFixedNewstyle != 0
	n.noZeroes = cflags&cflagNoZeroes != 0
	if !n.fixed && n.c.tls != nil && n.c.tls.Require {
		// "The server MUST operate in NOTLS mode unless ... the client replied with
		// NBD_FLAG_C_FIXED_NEWSTYLE": such a client can never get TLS, and require refuses
		// plaintext.
		return errors.New("nbd: TLS is required and the client does not speak fixed newstyle")
	}
	return nil
}

// readOption reads one option request: its type and data.
func (n *negotiation) readOption() (opt uint32, data []byte, err error) {
	var hdr [optionHeaderLen]byte
	if _, err := io.ReadFull(n.br, hdr[:]); err != nil {
		return 0, nil, fmt.Errorf("nbd: reading option: %w", err)
	}
	if binary.BigEndian.Uint64(hdr[0:8]) != magicOption {
		return 0, nil, errors.New("nbd: bad option magic")
	}
	opt = binary.BigEndian.Uint32(hdr[8:12])
	size := binary.BigEndian.Uint32(hdr[12:16])
	if size > maxOptionLen {
		return 0, nil, fmt.Errorf("nbd: option %d carries %d bytes (limit %d)", opt, size, maxOptionLen)
	}
	data = make([]byte, size)
	if _, err := io.ReadFull(n.br, data); err != nil {
		return 0, nil, fmt.Errorf("nbd: reading option %d data: %w", opt, err)
	}
	return opt, data, nil
}

// handle answers one option. done reports that the client entered transmission with e.
func (n *negotiation) handle(opt uint32, data []byte) (e export, done bool, err error) {
	if n.c.s.shutting.Load() && opt != optAbort {
		if opt == optExportName {
			return export{}, false, errors.New("nbd: shutting down")
		}
		return export{}, false, n.reply(opt, repErrShutdown, []byte("server is shutting down"))
	}
	if n.tlsRequired() && opt != optStartTLS && opt != optAbort {
		if opt == optExportName {
			// "as this request cannot error, it MUST terminate the session"
			return export{}, false, errors.New("nbd: TLS is required and the client chose an export without it")
		}
		return export{}, false, n.reply(opt, repErrTLSReqd, []byte("TLS is required: use NBD_OPT_STARTTLS"))
	}
	switch opt {
	case optExportName:
		e, err := n.exportName(data)
		return e, err == nil, err
	case optAbort:
		_ = n.reply(opt, repAck, nil)
		return export{}, false, errAbort
	case optList:
		return export{}, false, n.list(data)
	case optInfo, optGo:
		return n.infoGo(opt, data)
	case optStructuredReply:
		return export{}, false, n.structuredReply(data)
	case optStartTLS:
		return export{}, false, n.startTLS(data)
	default:
		// Meta contexts, extended headers and anything unknown.
		return export{}, false, n.reply(opt, repErrUnsup, nil)
	}
}

// exportName enters transmission the old way (NBD_OPT_EXPORT_NAME): no reply header, and an
// unknown name ends the session ("If the chosen export does not exist ... the server MUST
// terminate the session").
func (n *negotiation) exportName(data []byte) (export, error) {
	s := n.c.s
	if !s.nameMatches(string(data)) {
		return export{}, fmt.Errorf("nbd: unknown export %q", data)
	}
	e := s.export(n.structured)
	var r [10 + 124]byte
	binary.BigEndian.PutUint64(r[0:8], e.size)
	binary.BigEndian.PutUint16(r[8:10], e.tflags)
	w := r[:]
	if n.noZeroes {
		w = r[:10]
	}
	if _, err := n.bw.Write(w); err != nil {
		return export{}, err
	}
	return e, n.bw.Flush()
}

// list answers NBD_OPT_LIST with the one export.
func (n *negotiation) list(data []byte) error {
	if len(data) != 0 {
		return n.reply(optList, repErrInvalid, []byte("NBD_OPT_LIST takes no data"))
	}
	name := []byte(n.c.s.opts.ExportName)
	p := make([]byte, 4+len(name))
	binary.BigEndian.PutUint32(p, uint32(len(name)))
	copy(p[4:], name)
	if err := n.reply(optList, repServer, p); err != nil {
		return err
	}
	return n.reply(optList, repAck, nil)
}

// infoGo answers NBD_OPT_INFO and NBD_OPT_GO; a successful GO enters transmission.
func (n *negotiation) infoGo(opt uint32, data []byte) (e export, done bool, err error) {
	s := n.c.s
	req, err := parseGoRequest(data)
	if err != nil {
		return export{}, false, n.reply(opt, repErrInvalid, []byte("malformed NBD_OPT_INFO/GO data"))
	}
	if !s.nameMatches(req.name) {
		return export{}, false, n.reply(opt, repErrUnknown, []byte("no such export"))
	}
	e = s.export(n.structured)
	if err := s.sendInfo(n.bw, opt, e, req); err != nil {
		return export{}, false, err
	}
	if err := n.reply(opt, repAck, nil); err != nil {
		return export{}, false, err
	}
	return e, opt == optGo, nil
}

// structuredReply answers NBD_OPT_STRUCTURED_REPLY: replies in transmission may be chunked.
func (n *negotiation) structuredReply(data []byte) error {
	if len(data) != 0 {
		return n.reply(optStructuredReply, repErrInvalid, []byte("NBD_OPT_STRUCTURED_REPLY takes no data"))
	}
	n.structured = true
	return n.reply(optStructuredReply, repAck, nil)
}

func (n *negotiation) reply(opt, typ uint32, data []byte) error {
	return optReply(n.bw, opt, typ, data)
}

// optReply writes one option reply ("Fixed newstyle negotiation") and flushes it.
func optReply(bw *bufio.Writer, opt, typ uint32, data []byte) error {
	var h [optReplyHeaderLen]byte
	binary.BigEndian.PutUint64(h[0:8], magicOptReply)
	binary.BigEndian.PutUint32(h[8:12], opt)
	binary.BigEndian.PutUint32(h[12:16], typ)
	binary.BigEndian.PutUint32(h[16:20], uint32(len(data)))
	if _, err := bw.Write(h[:]); err != nil {
		return err
	}
	if _, err := bw.Write(data); err != nil {
		return err
	}
	return bw.Flush()
}
