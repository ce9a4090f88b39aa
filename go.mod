module github.com/iser-blk/iser-blk

go 1.26.0

require (
	github.com/dustin/go-humanize v1.0.1
	github.com/pojntfx/go-nbd v0.3.2
	go.uber.org/goleak v1.3.0
	go.uber.org/zap v1.28.0
	golang.org/x/sys v0.50.0
	pgregory.net/rapid v1.3.0
)

require go.uber.org/multierr v1.10.0 // indirect
