"""The quality evaluation: writes docs/quality.md and its plots.

    python3 -m pqeval.evaluate [--quick] [--out docs]

1. Attention traces (tools/pqeval/replay.py): per layer and head, recall of
   the exact top-k set, attention-mass recall and relative output error, for
   every selector at 1/5 and 1/10, and for PQ configurations (m x b, K-Means
   iterations).
2. Perplexity of a held-out continuation decoded with selective attention in
   every layer (tools/pqeval/e2e.py), full attention first.
3. Needle in a haystack, question last and question first, full attention
   first.

--quick runs a short version on the committed trace only (no model needed).
The budget is the library's: sink tokens + top-k of the middle tokens (the
fraction) + the local window; the tables give the tokens actually attended.
Drop methods (H2O, SnapKV, PyramidKV, SCOPE) get the paper's compensation:
1/128 more of the middle tokens, the communication offload methods spend.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from pqeval import replay, trace as trace_io

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "data" / "smollm2_sotu_2k.pqtrace"
SELECTORS = ["exact", "pq", "sparq", "infllm", "quest", "h2o", "snapkv", "pyramidkv", "scope",
             "window", "random"]
DROP = {"h2o", "snapkv", "pyramidkv", "scope"}
COMPENSATION = 1.0 / 128
PQ_CONFIGS = [(2, 6), (4, 8), (2, 8), (4, 4), (8, 2)]
ITERATIONS = [1, 3, 10, 25, 0]  # 0 = adaptive
TEXTS = ["1964_lyndon_b_johnson_d.txt", "1980_jimmy_carter_d.txt", "1986_ronald_reagan_r.txt"]


def budget(selector: str, fraction: float) -> float:
    return fraction + (COMPENSATION if selector in DROP else 0.0)


def trace_tables(t: trace_io.Trace, steps: Optional[int], lines: List[str]) -> Dict:
    results = {}
    lines += ["| selector | budget | exact top-k recall | attention-mass recall | output error "
              "| tokens per kv head | bytes read per step |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for fraction in (0.2, 0.1):
        for name in SELECTORS:
            r = replay.replay(t, name, budget(name, fraction), steps=steps)
            results[(name, fraction)] = r
            lines.append(f"| {name} | 1/{round(1 / fraction)} | {r.mean('recall'):.3f} | "
                         f"{r.mean('mass'):.3f} | {r.mean('error'):.4f} | "
                         f"{r.mean('selected'):.0f} | {r.mean('select_bytes'):.0f} |")
    return results


def pq_config_table(t: trace_io.Trace, steps: Optional[int], lines: List[str]) -> None:
    lines += ["", "PQ configurations at 1/5 (m subspaces x b bits; K-Means iterations, "
              "0 = adaptive):", "",
              "| m x b | iterations | exact top-k recall | attention-mass recall | output error |"
              " bytes read per step |", "|---|---:|---:|---:|---:|---:|"]
    for m, b in PQ_CONFIGS:
        r = replay.replay(t, "pq", 0.2, steps=steps, pq_subspaces=m, pq_bits=b)
        lines.append(f"| {m}x{b} | adaptive | {r.mean('recall'):.3f} | {r.mean('mass'):.3f} | "
                     f"{r.mean('error'):.4f} | {r.mean('select_bytes'):.0f} |")
    for it in ITERATIONS:
        r = replay.replay(t, "pq", 0.2, steps=steps, kmeans_iterations=it)
        label = "adaptive" if it == 0 else str(it)
        lines.append(f"| 2x6 | {label} | {r.mean('recall'):.3f} | {r.mean('mass'):.3f} | "
                     f"{r.mean('error'):.4f} | {r.mean('select_bytes'):.0f} |")


def plot_trace(results: Dict, path: Path) -> Optional[str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for ax, metric, title in zip(axes, ("mass", "recall"),
                                 ("attention-mass recall", "exact top-k recall")):
        x = np.arange(len(SELECTORS))
        for i, fraction in enumerate((0.2, 0.1)):
            ax.bar(x + (i - 0.5) * 0.38, [results[(s, fraction)].mean(metric) for s in SELECTORS],
                   0.38, label=f"1/{round(1 / fraction)}")
        ax.set_xticks(x, SELECTORS, rotation=45, ha="right")
        ax.set_ylim(0, 1.02)
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def model_sections(lines: List[str], out: Path, context: int, continuation: int,
                   needle_lengths: List[int], depths: List[float], summary: Dict) -> None:
    from pqeval import capture, e2e

    model = capture.load_model()
    tok = model.tokenizer
    sotu = Path("/work/shared/data/sotu")
    data = REPO / "tests" / "data"
    text_path = next(p for p in [data / TEXTS[0], sotu / TEXTS[0]] if p.exists())
    tokens = tok.encode(text_path.read_text(encoding="utf-8"))[: context + continuation]
    lines += ["", f"## Perplexity ({text_path.name}: {context}-token context, "
              f"{len(tokens) - context} teacher-forced decode steps)", "",
              "| selector | 1/5 | 1/10 |", "|---|---:|---:|"]
    pre = e2e.prefill_once(model, tokens[:context])
    full = e2e.perplexity(model, tokens, context, None, prefilled=pre)
    summary["ppl"] = {"full": full}
    lines.append(f"| full attention | {full:.3f} | {full:.3f} |")
    for name in SELECTORS:
        row = []
        for fraction in (0.2, 0.1):
            ppl = e2e.perplexity(model, tokens, context, name, budget(name, fraction),
                                 prefilled=pre)
            summary["ppl"][(name, fraction)] = ppl
            row.append(f"{ppl:.3f} ({(ppl / full - 1) * 100:+.2f}%)")
        lines.append(f"| {name} | {row[0]} | {row[1]} |")
        print(lines[-1], flush=True)

    hay_path = next(p for p in [data / TEXTS[1], sotu / TEXTS[1]] if p.exists())
    haystack = hay_path.read_text(encoding="utf-8")
    for question_first in (False, True):
        where = "first" if question_first else "last"
        lines += ["", f"## Needle in a haystack, question {where} ({hay_path.name}; "
                  f"lengths {needle_lengths}, depths {depths})", "",
                  "| selector | 1/5 | 1/10 |", "|---|---:|---:|"]
        cases = [e2e.needle_case(tok, haystack, n, d, str(10000 + 7919 * i % 89999), question_first)
                 for n in needle_lengths for i, d in enumerate(depths)]
        prefilled = [e2e.prefill_once(model, c.tokens, extra=16) for c in cases]
        ok = sum(e2e.answer(model, c, None, prefilled=p) for c, p in zip(cases, prefilled))
        summary["needle", where, "full"] = ok
        lines.append(f"| full attention | {ok}/{len(cases)} | {ok}/{len(cases)} |")
        for name in SELECTORS:
            row = []
            for fraction in (0.2, 0.1):
                hits = sum(e2e.answer(model, c, name, budget(name, fraction), prefilled=p)
                           for c, p in zip(cases, prefilled))
                summary["needle", where, name, fraction] = hits
                row.append(f"{hits}/{len(cases)}")
            lines.append(f"| {name} | {row[0]} | {row[1]} |")
            print(lines[-1], flush=True)


def aims(results: Dict, summary: Dict, lines: List[str]) -> None:
    """The issue's targets, checked against this run's figures."""
    pq5, pq10 = results[("pq", 0.2)], results[("pq", 0.1)]
    lines += ["", "## Against the aims", "", "| aim | measured | met |", "|---|---|---|"]

    def row(aim: str, measured: str, ok: bool) -> None:
        lines.append(f"| {aim} | {measured} | {'yes' if ok else 'no'} |")

    row("attention-mass recall >= 0.95 at 1/5", f"{pq5.mean('mass'):.3f}",
        pq5.mean("mass") >= 0.95)
    for fraction in (0.2, 0.1):
        others = [s for s in SELECTORS if s not in ("pq", "exact")]
        best = max(others, key=lambda s: results[(s, fraction)].mean("mass"))
        row(f"PQ closer to the oracle than every other selector at 1/{round(1 / fraction)} "
            "(attention mass)",
            f"PQ {results[('pq', fraction)].mean('mass'):.3f}, best other {best} "
            f"{results[(best, fraction)].mean('mass'):.3f}",
            results[("pq", fraction)].mean("mass") >= results[(best, fraction)].mean("mass"))
    if "ppl" in summary:
        full = summary["ppl"]["full"]
        for fraction, limit in ((0.2, 0.5), (0.1, 1.5)):
            ppl = summary["ppl"][("pq", fraction)]
            delta = (ppl / full - 1) * 100
            row(f"perplexity within {limit}% of full attention at 1/{round(1 / fraction)}",
                f"{delta:+.2f}% ({ppl:.3f} vs {full:.3f})", delta <= limit)
        for where in ("last", "first"):
            if ("needle", where, "full") in summary:
                full_ok = summary["needle", where, "full"]
                got = summary["needle", where, "pq", 0.2]
                row(f"needle accuracy equal to full attention at 1/5, question {where}",
                    f"{got} vs {full_ok}", got >= full_ok)


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the committed trace only, short")
    ap.add_argument("--trace", default=None, help="a trace to evaluate (default: capture one)")
    ap.add_argument("--out", default=str(REPO / "docs"))
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--continuation", type=int, default=256)
    ap.add_argument("--needle-lengths", default="2048,4096")
    ap.add_argument("--depths", default="0,0.25,0.5,0.75,1")
    ap.add_argument("--trace-layers", default="0,3,6,9,12,15,18,21,24,27,29")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    lines = ["# libpqcache quality on a real model", "",
             "Written by `python3 -m pqeval.evaluate` (tools/pqeval/evaluate.py); measured "
             "figures only.", ""]
    if args.quick or args.trace:
        path = Path(args.trace) if args.trace else FIXTURE
        t = trace_io.read(path)
    else:
        from pqeval import capture
        model = capture.load_model()
        text = (Path("/work/shared/data/sotu") / TEXTS[2]).read_text(encoding="utf-8")
        tokens = model.tokenizer.encode(text)[: args.context]
        t = capture.capture(model, tokens, [int(x) for x in args.trace_layers.split(",")], 512,
                            TEXTS[2])
        del model
    steps = 64 if args.quick else None
    lines += [f"## Attention traces ({t.model}, {t.text}, {t.tokens} tokens, layers {t.layers}, "
              f"{'the first 64' if steps else 'all'} decode positions after the prompt)", "",
              "Averaged over layers, kv heads, query heads and decode steps. Budget: 4 sinks + "
              "top-k of the middle tokens + 128 local tokens; drop methods get 1/128 more "
              "(compensation).", ""]
    results = trace_tables(t, steps, lines)
    png = plot_trace(results, out / ("quality-quick-trace.png" if args.quick else "quality-trace.png"))
    if png:
        lines += ["", f"![selectors on the trace]({png})"]
    pq_config_table(t, steps, lines)
    summary: Dict = {}
    if not args.quick:
        model_sections(lines, out, args.context, args.continuation,
                       needle_lengths=[int(x) for x in args.needle_lengths.split(",")],
                       depths=[float(x) for x in args.depths.split(",")], summary=summary)
    aims(results, summary, lines)
    lines += ["", f"Evaluation time: {time.perf_counter() - start:.0f} s."]
    target = out / ("quality-quick.md" if args.quick else "quality.md")
    target.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"\nwrote {target}")


if __name__ == "__main__":
    main()
