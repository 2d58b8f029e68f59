package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Trace is a .pqtrace attention trace (docs/trace-format.md): per traced
// layer, the queries (positions QFirst..Tokens-1), keys and values of a
// model run over a real text. The whole file is read into memory; the
// accessors return subslices of it, ready to hand to the library.
type Trace struct {
	Model, Text string
	DType       string // "f16" or "f32"
	Tokens      int    // N: positions 0..N-1 have keys and values
	QFirst      int    // F: queries are stored for positions F..N-1
	QHeads      int
	KVHeads     int
	HeadDim     int
	Layers      []int // the model's layer indices, in payload order
	ModelLayers int   // the model's depth

	data                      []byte
	qOffset, kOffset, vOffset []int // per entry of Layers
}

func align64(x int) int { return (x + 63) &^ 63 }

// ReadTrace reads and checks a PQTRACE 1 file.
func ReadTrace(path string) (*Trace, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	end := bytes.Index(data, []byte("\nend\n"))
	if end < 0 {
		return nil, fmt.Errorf("%s: no \"end\" line: not a .pqtrace file", path)
	}
	t := &Trace{data: data}
	dataOffset := 0
	sawMagic := false
	scanner := bufio.NewScanner(bytes.NewReader(data[:end+1]))
	for scanner.Scan() {
		fields := strings.Fields(scanner.Text())
		if len(fields) < 2 {
			continue
		}
		key, values := fields[0], fields[1:]
		number := func() int { // unknown or malformed numbers fail the checks below
			n, err := strconv.Atoi(values[0])
			if err != nil {
				return -1
			}
			return n
		}
		switch key {
		case "PQTRACE":
			sawMagic = values[0] == "1"
		case "model":
			t.Model = values[0]
		case "text":
			t.Text = values[0]
		case "dtype":
			t.DType = values[0]
		case "tokens":
			t.Tokens = number()
		case "q_first":
			t.QFirst = number()
		case "q_heads":
			t.QHeads = number()
		case "kv_heads":
			t.KVHeads = number()
		case "head_dim":
			t.HeadDim = number()
		case "model_layers":
			t.ModelLayers = number()
		case "data_offset":
			dataOffset = number()
		case "layers":
			for _, v := range values {
				l, err := strconv.Atoi(v)
				if err != nil || l < 0 {
					return nil, fmt.Errorf("%s: bad layer index %q", path, v)
				}
				t.Layers = append(t.Layers, l)
			}
		} // other keys: ignored, as the format asks
	}
	if !sawMagic || (t.DType != "f16" && t.DType != "f32") || t.Tokens <= 0 || t.QFirst < 0 ||
		t.QFirst > t.Tokens || t.QHeads <= 0 || t.KVHeads <= 0 || t.QHeads%t.KVHeads != 0 ||
		t.HeadDim <= 0 || len(t.Layers) == 0 || dataOffset <= end || dataOffset%64 != 0 {
		return nil, fmt.Errorf("%s: not a valid PQTRACE 1 header", path)
	}
	for _, l := range t.Layers {
		if l+1 > t.ModelLayers {
			t.ModelLayers = l + 1 // the default: the largest stored index + 1
		}
	}

	// Payload: token ids, then Q, K, V per layer, each 64-byte aligned.
	at := align64(dataOffset + 4*t.Tokens)
	qBytes := (t.Tokens - t.QFirst) * t.QHeads * t.HeadDim * t.ElementSize()
	kvBytes := t.Tokens * t.KVHeads * t.HeadDim * t.ElementSize()
	for range t.Layers {
		t.qOffset = append(t.qOffset, at)
		at = align64(at + qBytes)
		t.kOffset = append(t.kOffset, at)
		at = align64(at + kvBytes)
		t.vOffset = append(t.vOffset, at)
		at = align64(at + kvBytes)
	}
	if need := t.vOffset[len(t.vOffset)-1] + kvBytes; need > len(data) {
		return nil, fmt.Errorf("%s is truncated: %d bytes, the payload needs %d", path, len(data), need)
	}
	return t, nil
}

// ElementSize is the bytes per element of Q, K and V.
func (t *Trace) ElementSize() int {
	if t.DType == "f16" {
		return 2
	}
	return 4
}

// KeyRows and ValueRows are tokens [first, first+n) of entry i of Layers:
// [n][KVHeads][HeadDim] elements.
func (t *Trace) KeyRows(i, first, n int) []byte   { return t.rows(t.kOffset[i], t.KVHeads, first, n) }
func (t *Trace) ValueRows(i, first, n int) []byte { return t.rows(t.vOffset[i], t.KVHeads, first, n) }

// Query is the query of position pos (QFirst <= pos < Tokens) of entry i of
// Layers: [QHeads][HeadDim] elements.
func (t *Trace) Query(i, pos int) []byte {
	return t.rows(t.qOffset[i], t.QHeads, pos-t.QFirst, 1)
}

func (t *Trace) rows(offset, heads, first, n int) []byte {
	row := heads * t.HeadDim * t.ElementSize()
	return t.data[offset+first*row : offset+(first+n)*row]
}
