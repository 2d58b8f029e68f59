"""evaluate's command line refuses an unknown part or model by name, before
it measures anything (a full run is hours long: a typo must not cost them)."""

import pytest

from pqeval import evaluate


@pytest.mark.parametrize("argv, named", [
    (["--parts", "tasks,bogus"], "parts ['bogus']: expected some of tasks, ppl, traces"),
    (["--parts", "traces", "--models", "gemma3-270m,llama"], "models ['llama']"),
])
def test_an_unknown_part_or_model_is_a_usage_error(argv, named, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        evaluate.main(argv + ["--data", str(tmp_path / "data"), "--out", str(tmp_path)])
    assert exit_.value.code == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "data").exists()


def test_the_selection_names_the_models_to_measure():
    assert evaluate.check_selection(["traces"], ["gemma3-270m"]) == {"gemma3-270m"}
    assert evaluate.check_selection(evaluate.PARTS) == {"smollm2-135m", "gemma3-270m"}
