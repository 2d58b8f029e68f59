package pqcache

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The constants docs/bindings/go.md names as defaults (reflect cannot look
// a constant up by its name).
var documentedDefaults = map[string]any{
	"DTypeF16":           DTypeF16,
	"KMeansInitKMeansPP": KMeansInitKMeansPP,
	"SelectorPQ":         SelectorPQ,
	"GQASumSoftmax":      GQASumSoftmax,
	"BackendCPU":         BackendCPU,
	"CacheLRU":           CacheLRU,
	"RotaryNone":         RotaryNone,
	"PoolingMax":         PoolingMax,
	"KVTierHost":         KVTierHost,
	"TailNone":           TailNone,
}

// goMdConfigRows reads the table of Config's fields from docs/bindings/go.md
// (beside $PQ_HEADER's include/): its rows as Go field, C field and default.
func goMdConfigRows(t *testing.T) [][3]string {
	header := os.Getenv("PQ_HEADER")
	if header == "" {
		t.Fatal("$PQ_HEADER is not set (CTest sets it to include/pqcache.h)")
	}
	page := filepath.Join(filepath.Dir(filepath.Dir(header)), "docs", "bindings", "go.md")
	text, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	const head = "| Go field | C field | default | meaning |"
	start := strings.Index(string(text), head)
	if start < 0 {
		t.Fatalf("%s has no table starting %q", page, head)
	}
	table := string(text[start:])
	if end := strings.Index(table, "\n\n"); end >= 0 {
		table = table[:end]
	}
	row := regexp.MustCompile("^\\| `(\\w+)` \\| `(\\w+)` \\| `([^`]*)` \\|")
	var rows [][3]string
	for _, line := range strings.Split(table, "\n")[2:] {
		m := row.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("%s: a row of the Config table not as `Go` | `c` | `default` |: %q", page, line)
		}
		rows = append(rows, [3]string{m[1], m[2], m[3]})
	}
	return rows
}

// documentedValue parses a default as the page writes it, for a field of
// the given kind.
func documentedValue(literal string, field reflect.Value) (any, error) {
	if named, ok := documentedDefaults[literal]; ok {
		return named, nil
	}
	switch field.Kind() {
	case reflect.Int, reflect.Int32, reflect.Int64:
		v, err := strconv.ParseInt(literal, 0, 64)
		return reflect.ValueOf(v).Convert(field.Type()).Interface(), err
	case reflect.Uint64:
		v, err := strconv.ParseUint(literal, 0, 64)
		return reflect.ValueOf(v).Convert(field.Type()).Interface(), err
	case reflect.Float32, reflect.Float64:
		v, err := strconv.ParseFloat(literal, field.Type().Bits())
		return reflect.ValueOf(v).Convert(field.Type()).Interface(), err
	case reflect.String:
		return strconv.Unquote(literal)
	case reflect.Slice:
		if literal == "nil" {
			return reflect.Zero(field.Type()).Interface(), nil
		}
	}
	return nil, strconv.ErrSyntax
}

// TestConfigTableOfGoMd: docs/bindings/go.md lists every Config field, in
// the struct's order, with the pq_config field it sets and the default
// DefaultConfig returns, so that the page cannot fall behind the struct.
func TestConfigTableOfGoMd(t *testing.T) {
	rows := goMdConfigRows(t)
	config := reflect.ValueOf(DefaultConfig())
	var fields []string
	for i := 0; i < config.NumField(); i++ {
		fields = append(fields, config.Type().Field(i).Name)
	}
	var documented []string
	for _, r := range rows {
		documented = append(documented, r[0])
	}
	if !reflect.DeepEqual(documented, fields) {
		t.Fatalf("go.md's Config table lists\n  %v\nthe struct has\n  %v", documented, fields)
	}
	for _, r := range rows {
		goName, cName, literal := r[0], r[1], r[2]
		if strings.ReplaceAll(cName, "_", "") != strings.ToLower(goName) {
			t.Errorf("%s: C field %s is not its pq_config field", goName, cName)
		}
		field := config.FieldByName(goName)
		want, err := documentedValue(literal, field)
		if err != nil {
			t.Errorf("%s: default %q does not parse as a %s", goName, literal, field.Type())
			continue
		}
		if !reflect.DeepEqual(want, field.Interface()) {
			t.Errorf("%s: go.md says default %s, DefaultConfig() gives %#v", goName, literal, field.Interface())
		}
	}
}
