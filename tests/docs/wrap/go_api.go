// The Go API snippets of README.md and docs/bindings/go.md as a program:
// the slices and indices they take from their caller (f16 bits).
package main

import (
	"errors"
	"fmt"
	"math/rand"
	"os"

	"libpqcache.org/pqcache"
)

var _ = errors.Is

func randomF16(n int) []uint16 {
	out := make([]uint16, n)
	for i := range out {
		out[i] = uint16(rand.Intn(2))<<15 | 0x3000 | uint16(rand.Intn(0x800)) // |x| < 0.5
	}
	return out
}

func run() error {
	n := 2048
	l, layer := 0, 0
	_, _ = l, layer
	keys, values, query := randomF16(n*8*128), randomF16(n*8*128), randomF16(32*128)
@SNIPPET@
	if err != nil {
		return err
	}
	fmt.Printf("selected %d tokens for kv head 0\n", len(sel.Head(0)))
	return nil
}

func main() {
	if err := run(); err != nil {
		fmt.Println("FAIL:", err)
		os.Exit(1)
	}
}
