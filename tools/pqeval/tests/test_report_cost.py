"""The report's cost line reads as prose: a remaining run under an hour and a
half in minutes, longer ones in hours, and never "1 hours"."""

from pqeval import evaluate


def test_short_durations_are_minutes():
    assert evaluate._about(20) == "1 minute"
    assert evaluate._about(50 * 60) == "50 minutes"
    assert evaluate._about(84 * 60) == "84 minutes"


def test_long_durations_are_hours():
    assert evaluate._about(2 * 3600) == "2 hours"
    assert evaluate._about(13.4 * 3600) == "13 hours"
