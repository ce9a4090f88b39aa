package main

import (
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime"
)

// pprofEnv names the environment variable that, when set to a listen address such as
// 127.0.0.1:6060, serves net/http/pprof on it for the life of the process (any subcommand).
// It is for profiling under load (make bench, docs/bench/README.md) and deliberately not a flag:
// nothing is listening unless an operator asks for it, and the profiles expose internals, so bind
// it to loopback. Only while it is on are mutex and block profiles sampled: the mutex profile
// records 1 in 100 contention events, the block profile about one event per 100 µs spent blocked
// (runtime.SetBlockProfileRate takes nanoseconds, not a fraction).
const pprofEnv = "ISERBLK_PPROF"

func startPprof() {
	addr := os.Getenv(pprofEnv)
	if addr == "" {
		return
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "iser-blk: %s=%s: %v (profiling off)\n", pprofEnv, addr, err)
		return
	}
	runtime.SetMutexProfileFraction(100)
	runtime.SetBlockProfileRate(100_000) // one sample per 100 µs blocked
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	fmt.Fprintf(os.Stderr, "iser-blk: pprof on http://%s/debug/pprof/\n", ln.Addr())
	go func() { _ = http.Serve(ln, mux) }()
}
