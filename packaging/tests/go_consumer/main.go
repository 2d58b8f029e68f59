// A Go program built outside the source tree against the installed module
// libpqcache.org/pqcache (the packaging tests; docs/bindings/go.md shows the
// same commands). It prefills one layer with random K/V, waits for the PQ
// index, selects for a random query, fetches the selected rows and checks
// each against the keys and values it prefilled.
//
//	pqcache-consumer EXPECTED_VERSION
package main

import (
	"fmt"
	"math/rand"
	"os"

	"libpqcache.org/pqcache"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: pqcache-consumer EXPECTED_VERSION")
		os.Exit(2)
	}
	if err := run(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		os.Exit(1)
	}
}

func run(expected string) error {
	if v := pqcache.Version(); v != expected {
		return fmt.Errorf("the library says version %s, expected %s", v, expected)
	}
	const qHeads, kvHeads, dim, tokens = 4, 2, 16, 512
	cfg := pqcache.DefaultConfig()
	cfg.NumLayers, cfg.NumQHeads, cfg.NumKVHeads, cfg.HeadDim = 1, qHeads, kvHeads, dim
	cfg.DType = pqcache.DTypeF32
	ctx, err := pqcache.NewContext(cfg)
	if err != nil {
		return err
	}
	defer ctx.Close()

	rng := rand.New(rand.NewSource(1))
	random := func(n int) []float32 {
		s := make([]float32, n)
		for i := range s {
			s[i] = rng.Float32()*2 - 1
		}
		return s
	}
	keys, values := random(tokens*kvHeads*dim), random(tokens*kvHeads*dim)
	const seq = 7
	if err := ctx.AddSequence(seq); err != nil {
		return err
	}
	if err := ctx.PrefillLayer(seq, 0, pqcache.TensorF32(keys, tokens, kvHeads, dim),
		pqcache.TensorF32(values, tokens, kvHeads, dim)); err != nil {
		return err
	}
	if err := ctx.WaitBuilds(); err != nil {
		return err
	}
	sel, err := ctx.DecodeSelect(seq, 0, pqcache.TensorF32(random(qHeads*dim), 1, qHeads, dim))
	if err != nil {
		return err
	}
	k := make([]float32, kvHeads*sel.Capacity*dim)
	v := make([]float32, len(k))
	if err := ctx.FetchKV(seq, 0, sel, pqcache.TensorF32(k, sel.Capacity, kvHeads, dim).HeadMajor(),
		pqcache.TensorF32(v, sel.Capacity, kvHeads, dim).HeadMajor()); err != nil {
		return err
	}
	for h := 0; h < kvHeads; h++ {
		positions := sel.Head(h)
		if len(positions) == 0 || len(positions) >= tokens {
			return fmt.Errorf("kv head %d: %d of %d tokens selected", h, len(positions), tokens)
		}
		for i, p := range positions {
			for d := 0; d < dim; d++ {
				src := (int(p)*kvHeads+h)*dim + d
				dst := (h*sel.Capacity+i)*dim + d
				if k[dst] != keys[src] || v[dst] != values[src] {
					return fmt.Errorf("kv head %d, token %d: the fetched row differs from the prefilled one", h, p)
				}
			}
		}
	}
	fmt.Printf("libpqcache %s: selected %d and %d of %d tokens; the fetched rows match\n",
		pqcache.Version(), len(sel.Head(0)), len(sel.Head(1)), tokens)
	return nil
}
