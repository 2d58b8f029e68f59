package pqcache

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"libpqcache.org/pqcache/internal/pqswig"
)

// The selector rule every binding applies the same way (docs/design.md,
// "Adding a selector"; tests/check_selector_enums.py applies it to every
// binding's source): the binding's (name, value) pairs equal the header's
// enum pq_selector, read from include/pqcache.h itself, and there are
// PQ_SELECTOR_COUNT of them, the binding's count constant included.

const selectorPrefix = "PQ_SELECTOR_"

// headerSelectors reads include/pqcache.h ($PQ_HEADER, which CTest sets):
// the pairs of enum pq_selector and PQ_SELECTOR_COUNT.
func headerSelectors(t *testing.T) (map[string]int, int) {
	t.Helper()
	path := os.Getenv("PQ_HEADER")
	if path == "" {
		t.Fatal("$PQ_HEADER is not set (CTest sets it to include/pqcache.h)")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := regexp.MustCompile(`(?s)/\*.*?\*/`).ReplaceAllString(string(data), " ")
	start := strings.Index(text, "enum pq_selector {")
	if start < 0 {
		t.Fatalf("%s: no enum pq_selector", path)
	}
	body := text[start : start+strings.Index(text[start:], "}")]
	pairs := map[string]int{}
	for _, m := range regexp.MustCompile(`\b(PQ_SELECTOR_\w+)\s*=\s*(\d+)`).FindAllStringSubmatch(body, -1) {
		pairs[m[1]], _ = strconv.Atoi(m[2])
	}
	m := regexp.MustCompile(`(?m)^\s*#\s*define\s+PQ_SELECTOR_COUNT\s+(\d+)`).FindStringSubmatch(text)
	if len(pairs) == 0 || m == nil {
		t.Fatalf("%s: no enum pq_selector values or no PQ_SELECTOR_COUNT", path)
	}
	count, _ := strconv.Atoi(m[1])
	return pairs, count
}

// goSelectors reads the binding's list, the Selector constants of
// config.go (Go cannot list a type's constants at run time), each named
// the header's way: SelectorSparQ is PQ_SELECTOR_SPARQ.
func goSelectors(t *testing.T) map[string]int {
	t.Helper()
	file, err := parser.ParseFile(token.NewFileSet(), "config.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	pairs := map[string]int{}
	for _, decl := range file.Decls {
		if g, ok := decl.(*ast.GenDecl); ok && g.Tok == token.CONST {
			for _, spec := range g.Specs {
				v := spec.(*ast.ValueSpec)
				if typ, ok := v.Type.(*ast.Ident); !ok || typ.Name != "Selector" {
					continue
				}
				for i, name := range v.Names {
					lit, ok := v.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.INT {
						t.Fatalf("config.go: %s is not an integer literal", name.Name)
					}
					key := selectorPrefix + strings.ToUpper(strings.TrimPrefix(name.Name, "Selector"))
					pairs[key], _ = strconv.Atoi(lit.Value)
				}
			}
		}
	}
	return pairs
}

// selectorDifferences lists every way the binding's pairs and count
// constant differ from the header's, one line each naming the selector.
func selectorDifferences(pairs map[string]int, countName string, countConst int,
	header map[string]int, count int) []string {
	var problems []string
	values := make([]int, 0, len(header))
	for _, v := range header {
		values = append(values, v)
	}
	sort.Ints(values)
	for i, v := range values {
		if v != i || len(values) != count {
			problems = append(problems, fmt.Sprintf("the header's values %v are not 0 to PQ_SELECTOR_COUNT - 1 = %d",
				values, count-1))
			break
		}
	}
	names := map[string]bool{}
	for n := range header {
		names[n] = true
	}
	for n := range pairs {
		names[n] = true
	}
	sorted := make([]string, 0, len(names))
	for n := range names {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)
	for _, n := range sorted {
		want, inHeader := header[n]
		got, inBinding := pairs[n]
		switch {
		case !inBinding:
			problems = append(problems, fmt.Sprintf("missing %s (= %d in the header)", n, want))
		case !inHeader:
			problems = append(problems, fmt.Sprintf("%s (= %d) is not in the header", n, got))
		case got != want:
			problems = append(problems, fmt.Sprintf("%s is %d, the header says %d", n, got, want))
		}
	}
	if len(pairs) != count {
		problems = append(problems, fmt.Sprintf("%d selectors, PQ_SELECTOR_COUNT is %d", len(pairs), count))
	}
	if countConst != count {
		problems = append(problems, fmt.Sprintf("%s is %d, PQ_SELECTOR_COUNT is %d", countName, countConst, count))
	}
	return problems
}

func TestSelectorsMatchHeader(t *testing.T) {
	header, count := headerSelectors(t)
	problems := selectorDifferences(goSelectors(t), "SelectorCount", SelectorCount, header, count)
	if int(pqswig.PQ_SELECTOR_COUNT) != count {
		problems = append(problems, fmt.Sprintf("pqswig.PQ_SELECTOR_COUNT is %d, the header says %d",
			int(pqswig.PQ_SELECTOR_COUNT), count))
	}
	if len(problems) > 0 {
		t.Errorf("Go Selector differs from include/pqcache.h:\n  %s", strings.Join(problems, "\n  "))
	}
}
