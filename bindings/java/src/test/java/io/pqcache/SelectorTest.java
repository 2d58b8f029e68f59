package io.pqcache;

import static org.junit.jupiter.api.Assertions.assertTrue;

import io.pqcache.swig.pqcache;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Test;

/**
 * The selector rule every binding applies the same way (docs/design.md, "Adding a selector";
 * tests/check_selector_enums.py applies it to every binding's source): Selector's (name, code)
 * pairs equal the header's {@code enum pq_selector}, read from include/pqcache.h itself, and there
 * are {@code PQ_SELECTOR_COUNT} of them, {@link Selector#COUNT} included.
 */
class SelectorTest {
  /** The pairs of the header's {@code enum pq_selector}, and PQ_SELECTOR_COUNT under "COUNT". */
  static Map<String, Integer> headerSelectors() throws IOException {
    String path = System.getenv("PQ_HEADER");
    assertTrue(path != null, "$PQ_HEADER is not set (CTest sets it to include/pqcache.h)");
    String text = Files.readString(Path.of(path)).replaceAll("(?s)/\\*.*?\\*/", " ");
    int start = text.indexOf("enum pq_selector {");
    assertTrue(start >= 0, path + ": no enum pq_selector");
    String body = text.substring(start, text.indexOf('}', start));
    Map<String, Integer> pairs = new TreeMap<>();
    Matcher m = Pattern.compile("\\b(PQ_SELECTOR_\\w+)\\s*=\\s*(\\d+)").matcher(body);
    while (m.find()) {
      pairs.put(m.group(1), Integer.parseInt(m.group(2)));
    }
    Matcher count =
        Pattern.compile("(?m)^\\s*#\\s*define\\s+PQ_SELECTOR_COUNT\\s+(\\d+)").matcher(text);
    assertTrue(!pairs.isEmpty() && count.find(), path + ": no selectors or no PQ_SELECTOR_COUNT");
    pairs.put("COUNT", Integer.parseInt(count.group(1)));
    return pairs;
  }

  /** Every way the binding's pairs and count constant differ from the header's, one a line. */
  static List<String> differences(Map<String, Integer> binding, String countName, int countConst,
      Map<String, Integer> header, int count) {
    List<String> problems = new ArrayList<>();
    List<Integer> values = new ArrayList<>(header.values());
    values.sort(null);
    for (int i = 0; i < values.size(); i++) {
      if (values.get(i) != i || values.size() != count) {
        problems.add("the header's values " + values + " are not 0 to PQ_SELECTOR_COUNT - 1 = "
            + (count - 1));
        break;
      }
    }
    TreeSet<String> names = new TreeSet<>(header.keySet());
    names.addAll(binding.keySet());
    for (String name : names) {
      Integer want = header.get(name);
      Integer got = binding.get(name);
      if (got == null) {
        problems.add("missing " + name + " (= " + want + " in the header)");
      } else if (want == null) {
        problems.add(name + " (= " + got + ") is not in the header");
      } else if (!got.equals(want)) {
        problems.add(name + " is " + got + ", the header says " + want);
      }
    }
    if (binding.size() != count) {
      problems.add(binding.size() + " selectors, PQ_SELECTOR_COUNT is " + count);
    }
    if (countConst != count) {
      problems.add(countName + " is " + countConst + ", PQ_SELECTOR_COUNT is " + count);
    }
    return problems;
  }

  @Test
  void selectorMirrorsTheHeader() throws IOException {
    Map<String, Integer> header = headerSelectors();
    int count = header.remove("COUNT");
    // The binding's list, each constant named the header's way: SPARQ is PQ_SELECTOR_SPARQ.
    Map<String, Integer> binding = new TreeMap<>();
    for (Selector s : Selector.values()) {
      binding.put("PQ_SELECTOR_" + s.name(), s.code());
    }
    List<String> problems = differences(binding, "Selector.COUNT", Selector.COUNT, header, count);
    if (pqcache.PQ_SELECTOR_COUNT != count) {
      problems.add("the SWIG layer's PQ_SELECTOR_COUNT is " + pqcache.PQ_SELECTOR_COUNT
          + ", the header says " + count);
    }
    assertTrue(problems.isEmpty(),
        "Java Selector differs from include/pqcache.h:\n  " + String.join("\n  ", problems));
  }
}
