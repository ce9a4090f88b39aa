//go:build e2e

package tls_test

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// versionProxy relays TCP connections to the gateway and reads, from what the gateway sends, the
// TLS version it chose: NBD_OPT_STARTTLS's reply is followed in the clear by the ServerHello,
// whose supported_versions extension says TLS 1.3 (RFC 8446 §4.2.1) and whose absence leaves
// legacy_version's TLS 1.2 (RFC 5246 §7.4.1.3). So the tests know what was negotiated without
// trusting the client's priority settings to have taken effect.
type versionProxy struct {
	l      net.Listener
	target string

	mu       sync.Mutex
	accepted int
	seen     []string      // per finished connection: "TLS1.2", "TLS1.3" or why neither
	changed  chan struct{} // closed and replaced when accepted or seen changes
}

func startVersionProxy(t *testing.T, target string) *versionProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &versionProxy{l: l, target: target, changed: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return // closed by the cleanup
			}
			p.update(func() { p.accepted++ })
			wg.Add(1)
			go func() {
				defer wg.Done()
				v := p.relay(c)
				p.update(func() { p.seen = append(p.seen, v) })
			}()
		}
	}()
	t.Cleanup(func() { l.Close(); wg.Wait() })
	return p
}

func (p *versionProxy) addr() string { return p.l.Addr().String() }

func (p *versionProxy) port() string {
	_, port, _ := net.SplitHostPort(p.addr())
	return port
}

func (p *versionProxy) update(f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f()
	close(p.changed)
	p.changed = make(chan struct{})
}

// relay copies c to and from a new connection to the target until both directions end, and
// returns the version of the ServerHello in what the target sent.
func (p *versionProxy) relay(c net.Conn) string {
	defer c.Close()
	s, err := net.DialTimeout("tcp", p.target, 10*time.Second)
	if err != nil {
		return "dial: " + err.Error()
	}
	defer s.Close()
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(s, c)
		_ = s.(*net.TCPConn).CloseWrite()
		close(done)
	}()
	head := &capped{max: 64 << 10}
	_, _ = io.Copy(io.MultiWriter(c, head), s)
	_ = c.(*net.TCPConn).CloseWrite()
	<-done
	return serverHelloVersion(head.b)
}

// capped keeps the first max bytes written to it.
type capped struct {
	b   []byte
	max int
}

func (w *capped) Write(b []byte) (int, error) {
	if n := min(len(b), w.max-len(w.b)); n > 0 {
		w.b = append(w.b, b[:n]...)
	}
	return len(b), nil
}

// serverHelloVersion finds the first TLS handshake record holding a ServerHello in b (the NBD
// bytes before it never hold 0x16 0x03 0x03) and returns the version it selects.
func serverHelloVersion(b []byte) string {
	for i := 0; i+9 <= len(b); i++ {
		if b[i] != 0x16 || b[i+1] != 0x03 || b[i+2] != 0x03 || b[i+5] != 0x02 { // handshake, TLS 1.2 record, ServerHello
			continue
		}
		h := b[i+9:] // past the record header (5) and the handshake header (4)
		if len(h) < 2+32+1 {
			return "short ServerHello"
		}
		legacy := binary.BigEndian.Uint16(h)
		h = h[2+32:] // legacy_version, random
		if len(h) < 1+int(h[0])+2+1+2 {
			return "short ServerHello"
		}
		h = h[1+int(h[0])+2+1:] // session id, cipher suite, compression method
		exts := h[2:min(len(h), 2+int(binary.BigEndian.Uint16(h)))]
		for len(exts) >= 4 {
			typ, n := binary.BigEndian.Uint16(exts), int(binary.BigEndian.Uint16(exts[2:]))
			if len(exts) < 4+n {
				return "short extension"
			}
			if typ == 43 && n == 2 { // supported_versions, selected_version
				return versionName(binary.BigEndian.Uint16(exts[4:]))
			}
			exts = exts[4+n:]
		}
		return versionName(legacy)
	}
	return "no ServerHello"
}

func versionName(v uint16) string {
	switch v {
	case 0x0303:
		return "TLS1.2"
	case 0x0304:
		return "TLS1.3"
	}
	return fmt.Sprintf("version %#04x", v)
}

// expect waits until every connection accepted so far has ended, and requires that there was at
// least one and that the gateway chose version v in each. It starts the next count.
func (p *versionProxy) expect(t *testing.T, v string) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		p.mu.Lock()
		accepted, seen, changed := p.accepted, p.seen, p.changed
		if accepted == len(seen) {
			p.accepted, p.seen = 0, nil
		}
		p.mu.Unlock()
		if accepted == len(seen) {
			if len(seen) == 0 {
				t.Fatalf("no connection went through the proxy, want %s", v)
			}
			for _, s := range seen {
				if s != v {
					t.Fatalf("the gateway negotiated %v, want %s on every connection", seen, v)
				}
			}
			return
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("%d of %d connections still open 30s after the client ended", accepted-len(seen), accepted)
		}
	}
}
