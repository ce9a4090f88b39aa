module github.com/iser-blk/iser-blk

go 1.26.0

require (
	github.com/dustin/go-humanize v1.0.1 // indirect
	github.com/pojntfx/go-nbd v0.3.2 // indirect
	go.uber.org/goleak v1.3.0 // indirect
	go.uber.org/multierr v1.10.0 // indirect
	go.uber.org/zap v1.28.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
	pgregory.net/rapid v1.3.0 // indirect
)
