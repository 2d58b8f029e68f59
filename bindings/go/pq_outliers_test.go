package pqcache

import (
	"reflect"
	"testing"
)

// PQOutliers (0.13): the keys with the largest quantization residuals are
// scored by their exact q.k, so the selection of the same tokens and query
// changes; the share round-trips through Config; it needs SelectorPQ.
func TestPQOutliersScoreTheWorstCodedKeysExactly(t *testing.T) {
	var rows [2][][]int32
	for i, share := range []float32{0, 0.05} {
		c := refConfig()
		c.PQOutliers = share
		ctx, sel := refSelectOnce(t, c, 300, 61)
		defer ctx.Close()
		if got := ctx.Config().PQOutliers; got != share {
			t.Fatalf("Config().PQOutliers = %g, want %g", got, share)
		}
		for h := 0; h < refKVHeads; h++ {
			rows[i] = append(rows[i], append([]int32(nil), sel.Head(h)...))
		}
	}
	if reflect.DeepEqual(rows[0], rows[1]) {
		t.Error("the outliers' exact scores left every kv head's selection as it was")
	}

	c := refConfig()
	c.PQOutliers = 0.01
	c.Selector = SelectorExact
	_, err := NewContext(c)
	wantError(t, err, ErrInvalidArgument, "pq_outliers", "PQ_SELECTOR_PQ")
	c = refConfig()
	c.PQOutliers = 0.5
	_, err = NewContext(c)
	wantError(t, err, ErrInvalidArgument, "pq_outliers")
}
