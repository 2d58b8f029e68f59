# Copyright (c) 2024, NVIDIA CORPORATION.  All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License
#
# Modified for libpqcache: vendored from NVIDIA/RULER
# c3f5e3b4f87f97e048793bb510a3a6b19a46bf3a, scripts/data/synthetic/niah.py,
# with the niah entry of scripts/data/synthetic/constants.py, the "base"
# entry of scripts/data/template.py, the niah_single_1 arguments of
# scripts/synthetic.yaml and string_match_all of
# scripts/eval/synthetic/constants.py. The changes are listed in README.md
# beside this file.

"""RULER's needle-in-a-haystack generator, as needed for the niah_single_1
cell: one word key, one 7-digit number, the repeated "noise" haystack."""

import bisect
import random
from typing import Callable, Dict, List, Sequence

import wonderwords

# scripts/data/synthetic/constants.py, TASKS['niah'].
TEMPLATE = """Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic {type_needle_v} for {query} mentioned in the provided text?"""
ANSWER_PREFIX = """ The special magic {type_needle_v} for {query} mentioned in the provided text are"""
TOKENS_TO_GENERATE = 128

# scripts/synthetic.yaml.
NIAH_SINGLE_1 = {"type_haystack": "noise", "type_needle_k": "words", "type_needle_v": "numbers",
                 "num_needle_k": 1, "num_needle_v": 1, "num_needle_q": 1}

RANDOM_SEED = 42  # prepare.py's --random_seed default

needle = "One of the special magic {type_needle_v} for {key} is: {value}."
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


class SortedWords(Sequence):
    """sorted(set(f"{adj}-{noun}" for adj in adjs for noun in nouns)), the
    list niah.py draws keys from, without building its 6.2 million strings
    (17 s and 0.9 GB): the words sharing one "{adj}-" prefix are a run of
    the sorted nouns, and runs only interleave where one prefix extends
    another ("old-" and "old-fashioned-"), whose words are sorted together."""

    def __init__(self, adjs: Sequence[str], nouns: Sequence[str]):
        self.nouns = sorted(set(nouns))
        groups: List[List[str]] = []
        for prefix in sorted({f"{adj}-" for adj in adjs}):
            # Words starting with a prefix form one range in sorted order,
            # so a prefix that extends the group's first joins that group.
            if groups and prefix.startswith(groups[-1][0]):
                groups[-1].append(prefix)
            else:
                groups.append([prefix])
        self.runs = [g[0] if len(g) == 1 else sorted({p + n for p in g for n in self.nouns})
                     for g in groups]
        self.starts = [0]
        for run in self.runs:
            self.starts.append(self.starts[-1] + (len(self.nouns) if isinstance(run, str)
                                                  else len(run)))

    def __len__(self) -> int:
        return self.starts[-1]

    def __getitem__(self, index: int) -> str:
        if not 0 <= index < len(self):
            raise IndexError(f"word index {index} outside 0..{len(self) - 1}")
        r = bisect.bisect_right(self.starts, index) - 1
        run, offset = self.runs[r], index - self.starts[r]
        return run + self.nouns[offset] if isinstance(run, str) else run[offset]


_WORDS = None


def words() -> SortedWords:
    global _WORDS
    if _WORDS is None:
        nouns = wonderwords.random_word._get_words_from_text_file("nounlist.txt")
        adjs = wonderwords.random_word._get_words_from_text_file("adjectivelist.txt")
        _WORDS = SortedWords(adjs, nouns)
    return _WORDS


def string_match_all(preds, refs):
    score = sum([sum([1.0 if r.lower() in pred.lower() else 0.0 for r in ref]) / len(ref) for pred, ref in zip(preds, refs)]) / len(preds) * 100
    return round(score, 2)


class Generator:
    """niah.py's functions with its command-line `args` and the global
    `random` as fields: `count_tokens(text)` replaces its TOKENIZER
    (len(TOKENIZER.text_to_tokens(text)))."""

    def __init__(self, count_tokens: Callable[[str], int], max_seq_length: int,
                 random_seed: int = RANDOM_SEED, config: Dict = NIAH_SINGLE_1,
                 tokens_to_generate: int = TOKENS_TO_GENERATE, remove_newline_tab: bool = False):
        if config["type_haystack"] != "noise":
            raise NotImplementedError(f"type_haystack {config['type_haystack']!r}: only 'noise' "
                                      "is vendored (the essays are a download)")
        self.count_tokens = count_tokens
        self.max_seq_length = max_seq_length
        self.random_seed = random_seed
        self.tokens_to_generate = tokens_to_generate
        self.remove_newline_tab = remove_newline_tab
        self.args = dict(config)
        self.args["num_needle_k"] = max(self.args["num_needle_k"], self.args["num_needle_q"])
        # prepare.py: the model template ("base") and the answer prefix.
        self.template = "{task_template}".format(task_template=TEMPLATE) + ANSWER_PREFIX
        self.random = random.Random(random_seed)
        self.haystack = NOISE

    def generate_random_number(self, num_digits=7):
        lower_bound = 10**(num_digits - 1)
        upper_bound = 10**num_digits - 1
        return str(self.random.randint(lower_bound, upper_bound))

    def generate_random_word(self):
        word = self.random.choice(words())
        return word

    def generate_random(self, type_needle: str):
        if type_needle == 'numbers':
            return self.generate_random_number()
        elif type_needle == 'words':
            return self.generate_random_word()
        else:
            raise NotImplementedError(f'{type_needle} is not implemented.')

    def generate_input_output(self, num_haystack):
        args = self.args
        keys, values, needles = [], [], []
        for _ in range(args["num_needle_k"]):
            keys.append(self.generate_random(args["type_needle_k"]))
            value = []
            for _ in range(args["num_needle_v"]):
                value.append(self.generate_random(args["type_needle_v"]))
                needles.append(needle.format(
                    type_needle_v=args["type_needle_v"],
                    key=keys[-1],
                    value=value[-1],
                ))
            values.append(value)

        random.Random(self.random_seed).shuffle(needles)

        # Context: the noise haystack.
        sentences = [self.haystack] * num_haystack
        indexes = sorted(self.random.sample(range(num_haystack), len(needles)), reverse=True)
        for index, element in zip(indexes, needles):
            sentences.insert(index, element)
        context = "\n".join(sentences)

        ## Query and Answer
        indices = self.random.sample(range(args["num_needle_k"]), args["num_needle_q"])
        queries = [keys[i] for i in indices]
        answers = [a for i in indices for a in values[i]]
        query = ', '.join(queries[:-1]) + ', and ' + queries[-1] if len(queries) > 1 else queries[0]

        template = self.template
        type_needle_v = args["type_needle_v"]
        if args["num_needle_q"] * args["num_needle_v"] == 1:
            template = template.replace('Some', 'A')
            template = template.replace('are all', 'is')
            template = template.replace('are', 'is')
            template = template.replace('answers', 'answer')
            type_needle_v = type_needle_v[:-1] # remove "s"

        input_text = template.format(
            type_needle_v=type_needle_v,
            context=context,
            query=query,
        )

        return input_text, answers

    def generate_samples(self, num_samples: int, incremental: int = 500):
        write_jsons = []
        tokens_to_generate = self.tokens_to_generate
        max_seq_length = self.max_seq_length

        incremental = 25  # the noise haystack's
        if self.max_seq_length < 4096:
            incremental = 5

        # Estimate tokens per question to determine reasonable upper bound
        sample_input_text, _ = self.generate_input_output(incremental)
        sample_tokens = self.count_tokens(sample_input_text)
        tokens_per_haystack = sample_tokens / incremental

        # Let's do 3x to allow for some slack since we can get unlucky due to sampling.
        estimated_max_questions = int((max_seq_length / tokens_per_haystack) * 3)

        # Binary search for optimal haystack size
        lower_bound = incremental
        upper_bound = max(estimated_max_questions, incremental * 2)  # Ensure upper_bound is reasonable

        optimal_num_haystack = None

        while lower_bound <= upper_bound:
            mid = (lower_bound + upper_bound) // 2
            input_text, answer = self.generate_input_output(mid)
            total_tokens = self.count_tokens(input_text) + tokens_to_generate

            if total_tokens <= max_seq_length:
                # This size works, can we go larger?
                optimal_num_haystack = mid
                lower_bound = mid + 1
            else:
                # Too large, need to go smaller
                upper_bound = mid - 1

        num_haystack = optimal_num_haystack if optimal_num_haystack is not None else incremental

        # Generate samples
        for index in range(num_samples):
            used_haystack = num_haystack
            while(True):
                try:
                    input_text, answer  = self.generate_input_output(used_haystack)
                    length = self.count_tokens(input_text) + tokens_to_generate
                    assert length <= max_seq_length, f"{length} exceeds max_seq_length."
                    break
                except AssertionError:
                    if used_haystack > incremental:
                        used_haystack -= incremental
                    else:
                        raise ValueError(f"{max_seq_length} tokens cannot hold {incremental} "
                                         "haystack sentences and the answer")

            if self.remove_newline_tab:
                input_text = ' '.join(input_text.replace('\n', ' ').replace('\t', ' ').strip().split())
            answer_prefix_index = input_text.rfind(ANSWER_PREFIX[:10]) # use first 10 char of answer prefix to locate it
            answer_prefix = input_text[answer_prefix_index:]
            input_text = input_text[:answer_prefix_index]
            # find answer position in text
            index = input_text.find(answer[0])
            formatted_output = {
                'index': index,
                "input": input_text,
                "outputs": answer,
                "length": length,
                'answer_prefix': answer_prefix,
                'num_haystack': used_haystack,
            }
            write_jsons.append(formatted_output)

        return write_jsons
