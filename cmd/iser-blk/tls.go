package main

import (
	"context"

	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/frontend/nbd"
	"github.com/iser-blk/iser-blk/internal/nbdtls"
)

// TLS for `serve`: the flags of internal/nbdtls, the NBD server's TLS policy (certificates from
// a --tls-certificates directory, re-read on SIGHUP; no plaintext to the network unless --tls
// off).

type tlsFlags struct {
	mode       string // "", off, on or require ("": not given)
	certDir    string
	verifyPeer bool
}

func (f *tlsFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.mode, "tls", "", "TLS for NBD clients (NBD_OPT_STARTTLS): off, on (offered; plaintext clients are served too) or\n"+
		"require (every client must use TLS). Needed on a tcp:// listener other hosts can reach (--tls off to serve plaintext anyway)")
	fs.StringVar(&f.certDir, "tls-certificates", "", "with --tls on|require: the directory of "+nbdtls.CAFile+", "+nbdtls.CertFile+" and "+nbdtls.KeyFile+
		"\n(re-read on SIGHUP)")
	fs.BoolVar(&f.verifyPeer, "tls-verify-peer", false, "with --tls on|require: clients must present a certificate signed by "+nbdtls.CAFile)
}

func (f *tlsFlags) options(listenSpec string, log *zap.Logger) nbdtls.Options {
	return nbdtls.Options{Mode: f.mode, CertDir: f.certDir, VerifyPeer: f.verifyPeer, Listen: listenSpec, Log: log}
}

// serverTLS is the NBD server's TLS policy for the flags and listener (nil: plaintext); every
// error is a usage error (exit 2).
func (f *tlsFlags) serverTLS(ctx context.Context, listenSpec string, log *zap.Logger) (*nbd.TLS, error) {
	t, err := nbdtls.Server(ctx, f.options(listenSpec, log))
	if err != nil {
		return nil, usagef("%v", err)
	}
	return t, nil
}
