// Command delayproxy forwards TCP connections to one address and delays every byte by a fixed
// time in each direction: a remote target on a host whose kernel has no netem (the bench host's
// has none). test/bench/remote_ab.py puts it between the gateways and tgtd.
//
//	delayproxy -listen 127.0.0.1:PORT -to 127.0.0.1:PORT -delay 500us
//
// What it reads from one side is handed to the other side's writer with the time it arrived, and
// the writer sends it once that time plus the delay has come: order is kept and a request's bytes
// reach the far side the delay after they left, like a link's latency (its bandwidth is the
// host's). It prints "listening ADDR" once it accepts connections.
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

type chunk struct {
	b  []byte
	at time.Time
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to accept connections on")
	to := flag.String("to", "", "address to forward them to")
	delay := flag.Duration("delay", 500*time.Microsecond, "delay of every byte, each way")
	flag.Parse()
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Fprintf(os.Stdout, "listening %s\n", l.Addr())
	for {
		c, err := l.Accept()
		if err != nil {
			log.Fatal(err)
		}
		go serve(c, *to, *delay)
	}
}

func serve(c net.Conn, to string, delay time.Duration) {
	u, err := net.Dial("tcp", to)
	if err != nil {
		log.Print(err)
		c.Close()
		return
	}
	for _, tc := range []net.Conn{c, u} {
		tc.(*net.TCPConn).SetNoDelay(true)
	}
	go pump(c, u, delay)
	pump(u, c, delay)
}

// pump copies src to dst, each chunk sent delay after it was read.
func pump(src, dst net.Conn, delay time.Duration) {
	q := make(chan chunk, 4096)
	go func() {
		defer dst.Close()
		// time.Sleep rounds a sub-millisecond wait up to the netpoller's millisecond; a thread of
		// its own sleeping in nanosleep(2), with the least timer slack, wakes within microseconds
		runtime.LockOSThread()
		if err := unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0); err != nil {
			log.Print(err)
		}
		for ch := range q {
			if d := time.Until(ch.at.Add(delay)); d > 0 {
				ts := unix.NsecToTimespec(d.Nanoseconds()) // the link's latency: what this program is for
				for unix.Nanosleep(&ts, &ts) == unix.EINTR {
				}
			}
			if _, err := dst.Write(ch.b); err != nil {
				return
			}
		}
	}()
	defer close(q)
	for {
		b := make([]byte, 256<<10)
		n, err := src.Read(b)
		if n > 0 {
			q <- chunk{b[:n], time.Now()}
		}
		if err != nil {
			if err != io.EOF {
				log.Print(err)
			}
			return
		}
	}
}
