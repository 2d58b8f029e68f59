"""RULER's vendored niah_single_1 generator (pqeval.ruler): the samples'
shape and length, the answer in the prompt, determinism, the key list equal
to the one niah.py builds, and RULER's scoring. No model: lengths are
counted in words, a stand-in for a tokenizer."""
import re

import pytest

from pqeval import tasks
from pqeval.ruler import cell, niah

LENGTH = 2048
NEEDLE = re.compile(r"One of the special magic numbers for (\S+) is: (\d{7})\.")


def count_words(text: str) -> int:
    return len(text.split())


def count_sample_words(sample: tasks.Sample) -> int:
    return count_words(sample.prompt + "\n" + sample.answer_prefix)


def test_the_key_list_is_niah_pys_sorted_set_of_pairs():
    # Prefixes that extend others ("old-" and "old-fashioned-", in two levels
    # with "a-b-"), a space that sorts before "-", a repeated adjective, and
    # a pair spelt two ways ("a-b" + "c" and "a" + "b-c") that the set merges.
    adjs = ["old", "old-fashioned", "ad hoc", "ad", "blue", "a", "a-b", "a-b-c", "blue", "zany"]
    nouns = ["c", "b-c", "c-d", "apple", "fashioned", "zoo", "contact lens", "b-c-apple"]
    expected = sorted(set(f"{adj}-{noun}" for adj in adjs for noun in nouns))
    words = niah.SortedWords(adjs, nouns)
    assert len(words) == len(expected)
    assert [words[i] for i in range(len(words))] == expected
    with pytest.raises(IndexError):
        words[len(words)]


def test_samples_fill_the_length_and_hold_their_answer():
    generator = niah.Generator(lambda text: count_words(text), LENGTH)
    samples = generator.generate_samples(4)
    assert len(samples) == 4
    sentence = count_words(niah.NOISE)
    for s in samples:
        text = s["input"] + s["answer_prefix"]
        assert s["length"] == count_words(text) + niah.TOKENS_TO_GENERATE <= LENGTH
        # RULER's fit: the largest haystack found, less at most one step of
        # `incremental` (5 sentences below 4096 tokens) where a key is longer.
        assert LENGTH - s["length"] < 6 * sentence + 10
        assert s["input"].startswith("A special magic number is hidden within the following text.")
        needles = NEEDLE.findall(s["input"])
        assert len(needles) == 1
        key, value = needles[0]
        assert s["outputs"] == [value]
        assert s["index"] == s["input"].find(value) > 0
        assert s["input"].endswith(f"What is the special magic number for {key} mentioned in "
                                   "the provided text?")
        assert s["answer_prefix"] == (f" The special magic number for {key} mentioned in the "
                                      "provided text is")
        body = s["input"].split("\n")[1:-1]
        assert body.count(niah.NOISE) == len(body) - 1 == s["num_haystack"]


def test_samples_are_seeded():
    def make(seed, n):
        return niah.Generator(lambda text: count_words(text), LENGTH,
                              random_seed=seed).generate_samples(n)
    first = make(42, 3)
    assert first == make(42, 3)
    assert first[:2] == make(42, 2)
    assert [s["outputs"] for s in first] != [s["outputs"] for s in make(7, 3)]
    assert len({s["outputs"][0] for s in first}) == 3


def test_the_cell_as_a_task_sample():
    sample = tasks.make_sample("ruler_niah_single_1", "last", 2, LENGTH, None, count_sample_words)
    raw = niah.Generator(lambda text: count_sample_words(
        tasks.Sample("", "last", 0, text[:text.rfind(" The speci")],
                     text[text.rfind(" The speci"):].strip(), [], "all", 0)),
        LENGTH).generate_samples(3)[-1]
    assert sample.prompt == raw["input"]
    assert sample.answer_prefix == raw["answer_prefix"].strip()
    assert sample.references == raw["outputs"] and sample.references[0] in sample.prompt
    assert (sample.task, sample.placement, sample.seed, sample.metric) == (
        "ruler_niah_single_1", "last", 2, "all")
    assert count_sample_words(sample) + sample.max_new_tokens <= LENGTH
    assert 0 < sample.depths[0] < 1
    with pytest.raises(ValueError, match="placement 'first'"):
        tasks.make_sample("ruler_niah_single_1", "first", 0, LENGTH, None, count_sample_words)
    with pytest.raises(ValueError, match="seed -1"):
        cell.make_sample("ruler_niah_single_1", "last", -1, LENGTH, count_sample_words)


def test_a_length_too_short_for_the_smallest_haystack_is_an_error():
    with pytest.raises(ValueError, match="cannot hold"):
        niah.Generator(lambda text: count_words(text), 200).generate_samples(1)


@pytest.mark.parametrize("output", ["is 1234567.", "The number is 12345", "1234567 and 7654321",
                                    "", "nothing"])
def test_the_samples_score_is_rulers_string_match_all(output):
    sample = tasks.Sample("ruler_niah_single_1", "last", 0, "", "", ["1234567", "7654321"],
                          "all", 128)
    assert sample.score(output) == pytest.approx(
        niah.string_match_all([output], [sample.references]) / 100)
