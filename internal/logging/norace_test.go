//go:build !race

package logging

// poolSlack is 0 without the race detector: sync.Pool keeps what is Put.
const poolSlack = 0
