package pqcache

import (
	"testing"
)

// TopP (0.15): budgets per kv head and step. A tiny share keeps the floor
// (one middle token with a floor of 0), 1 keeps all k; both fields
// round-trip through Config; a selector without q.k estimates is a named
// error.
func TestTopPKeepsTheFloorOrEveryK(t *testing.T) {
	for _, tc := range []struct {
		topP, floor float32
		middle      int
	}{{1e-6, 0, 1}, {1, 0.02, 16}} {
		c := refConfig()
		c.TopP, c.TopPFloor = tc.topP, tc.floor
		ctx, sel := refSelectOnce(t, c, 300, 81)
		defer ctx.Close()
		if got := ctx.Config(); got.TopP != tc.topP || got.TopPFloor != tc.floor {
			t.Fatalf("Config() TopP %g TopPFloor %g, want %g %g", got.TopP, got.TopPFloor, tc.topP, tc.floor)
		}
		for h := 0; h < refKVHeads; h++ {
			// 4 sinks and a 16-token window around the middle's picks.
			if got, want := len(sel.Head(h)), 4+tc.middle+16; got != want {
				t.Errorf("top_p %g: kv head %d holds %d positions, want %d", tc.topP, h, got, want)
			}
		}
	}
	if got := DefaultConfig(); got.TopP != 0 || got.TopPFloor != 0.02 {
		t.Errorf("DefaultConfig() TopP %g TopPFloor %g, want 0 0.02", got.TopP, got.TopPFloor)
	}

	c := refConfig()
	c.TopP = 0.5
	c.Selector = SelectorH2O
	_, err := NewContext(c)
	wantError(t, err, ErrInvalidArgument, "top_p", "PQ_SELECTOR_H2O")
}
