//go:build vm

package nbd

import "unsafe"

// alignedBuf returns n bytes aligned for O_DIRECT.
func alignedBuf(n int) []byte {
	b := make([]byte, n+4096)
	off := int(4096 - uintptr(unsafe.Pointer(&b[0]))%4096)
	return b[off : off+n : off+n]
}

func uintptrOf(p *[2]uint64) uintptr { return uintptr(unsafe.Pointer(p)) }
