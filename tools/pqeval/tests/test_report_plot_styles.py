"""The accuracy plot draws every selector in a style of its own (issue 45:
pq and pyramidinfer were both red, out of a 10-colour cycle for 23 lines;
then 24 lines of tab20 whose light colours read as one)."""
from pqeval import report
from pqeval.longctx import ALL_NAMES, FULL


def test_every_row_of_the_accuracy_plot_has_its_own_colour_and_marker():
    styles = {name: report.accuracy_style(name) for name in [FULL, *ALL_NAMES]}
    keys = [(s["color"], s["marker"]) for s in styles.values()]
    assert len(set(keys)) == len(keys), styles
    # Red is PQ's alone, black full attention's.
    for name, style in styles.items():
        assert (style["color"] == "tab:red") == (name == "pq" or name.startswith("pq-")), name
        assert (style["color"] == "black") == (name == FULL), name


def test_a_name_outside_the_table_still_gets_a_style_that_is_not_pq_s():
    style = report.accuracy_style("some-new-selector")
    assert style["color"] not in ("tab:red", "black")


def test_the_plot_lists_every_selector_once_the_oracle_first_then_pq():
    rows = report.accuracy_rows()
    assert sorted(rows) == sorted(ALL_NAMES)
    assert rows[:2] == ["exact", "pq"]
