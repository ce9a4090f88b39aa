// Package profiling serves net/http/pprof when an operator asks for it through the environment:
// ISERBLK_PPROF=127.0.0.1:6060 in the environment of any iser-blk command, for profiling under
// load (make bench, docs/bench/README.md).
//
// It is deliberately not a flag: nothing is listening unless an operator asks for it, and the
// profiles expose internals, so bind it to loopback. Only while it is on are mutex and block
// profiles sampled: the mutex profile records 1 in 100 contention events, the block profile about
// one event per 100 µs spent blocked (runtime.SetBlockProfileRate takes nanoseconds, not a
// fraction). A listen failure is reported and profiling stays off; the command runs on.
package profiling

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime"
)

// Env names the environment variable that, set to a listen address, serves pprof on it for the
// life of the process.
const Env = "ISERBLK_PPROF"

// FromEnv is Start with the address in $ISERBLK_PPROF.
func FromEnv(w io.Writer) net.Addr { return Start(os.Getenv(Env), w) }

// Start serves /debug/pprof/ on addr for the life of the process and turns on the mutex and
// block profiles; "" serves nothing. What it does, or why it could not, is written to w. It
// returns the address it listens on (nil: off).
func Start(addr string, w io.Writer) net.Addr {
	if addr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintf(w, "iser-blk: %s=%s: %v (profiling off)\n", Env, addr, err)
		return nil
	}
	runtime.SetMutexProfileFraction(100)
	runtime.SetBlockProfileRate(100_000) // one sample per 100 µs blocked
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	fmt.Fprintf(w, "iser-blk: pprof on http://%s/debug/pprof/\n", ln.Addr())
	go func() { _ = http.Serve(ln, mux) }()
	return ln.Addr()
}
