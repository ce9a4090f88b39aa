package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/internal/status"
)

// NewRegistry returns the registry /metrics serves: the gateway's Collector (whose series carry
// the name and device labels of each snapshot), and the Go runtime and process collectors (which
// carry no gateway labels, as node_exporter's do not).
func NewRegistry(snapshot func() status.Status) (*prometheus.Registry, error) {
	reg := prometheus.NewRegistry()
	for _, c := range []prometheus.Collector{
		NewCollector(snapshot),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
	}
	return reg, nil
}

// Server serves /metrics on --metrics-listen.
type Server struct {
	http     *http.Server
	listener net.Listener
	done     chan error
}

// Listen binds addr (host:port; port 0 picks one, see Addr) and starts serving reg at /metrics.
// Scrape errors are logged, never fatal: metrics must not take a gateway down.
func Listen(addr string, reg *prometheus.Registry, log *zap.Logger) (*Server, error) {
	if log == nil {
		log = zap.NewNop()
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog:      zap.NewStdLog(log),
		ErrorHandling: promhttp.ContinueOnError,
		Timeout:       10 * time.Second,
	}))
	s := &Server{
		http:     &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second},
		listener: l,
		done:     make(chan error, 1),
	}
	go func() {
		err := s.http.Serve(l)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		s.done <- err
	}()
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.listener.Addr().String() }

// Shutdown stops the server, waiting for running scrapes until ctx ends.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.http.Shutdown(ctx)
	if e := <-s.done; err == nil {
		err = e
	}
	return err
}
