"""The accuracy plot draws every selector in a style of its own (issue 45:
pq and pyramidinfer were both red, out of a 10-colour cycle for 23 lines)."""
from pqeval import report
from pqeval.longctx import FULL, NAMES


def test_every_row_of_the_accuracy_plot_has_its_own_colour_and_line():
    styles = {name: report.accuracy_style(name) for name in [FULL, *NAMES]}
    keys = [(s["color"], s.get("ls", "-")) for s in styles.values()]
    assert len(set(keys)) == len(keys), styles
    # Red is PQ's alone, black full attention's.
    for name, style in styles.items():
        assert (style["color"] == "tab:red") == (name == "pq" or name.startswith("pq-")), name
        assert (style["color"] == "black") == (name == FULL), name
        assert style["color"] not in ("#d62728", "#ff9896"), name  # tab20's reds


def test_a_name_outside_the_table_still_gets_a_style_that_is_not_pq_s():
    style = report.accuracy_style("some-new-selector")
    assert style["color"] not in ("tab:red", "black")
