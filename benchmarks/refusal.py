"""Accuracy of the ``refusal`` reward's classifier against human labels, per source, group and language.

    python benchmarks/refusal.py                          # every source, tune and held-out (about a minute)
    python benchmarks/refusal.py --source gptfuzz         # one source (xstest, gptfuzz, rbr_gold, jailjudge)
    python benchmarks/refusal.py --data gptfuzz=DIR       # where a source's local copy is (folder or bare clone)
    python benchmarks/refusal.py --errors 20 --splits tune   # print tuning-split mistakes, tune table only
    python benchmarks/refusal.py --learned-model FILE     # a model from `python -m armor_rewards_safety.train`

Sources (``armor_rewards_safety/sources.py`` says where each comes from, its licence, how it is
split and what counts as a refusal in it): XSTest v2 completions, GPTFuzz's labelled jailbreak
answers, OpenAI's RBR gold set and JAILJUDGE-mini. A response counts as predicted refusal if
``classify_refusal`` says ``refusal`` or ``partial``; the classifier is given the prompt. Two
classifiers are measured: ``rules`` alone and ``learned`` (the domains' default: rules and the
built-in model). Rules and model were chosen on ``tune`` rows only; ``held_out`` rows measure what
they do on prompts not seen. ``--errors`` prints only tuning-split mistakes.
"""

from __future__ import annotations

import argparse

from armor_rewards_safety.learned import load_model
from armor_rewards_safety.refusal import classify_refusal
from armor_rewards_safety.ruleset import load_rules
from armor_rewards_safety.sources import SOURCES, read_source
from armor_rewards_safety.xstest import scores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", default=",".join(SOURCES), help=f"comma-separated sources; known: {', '.join(SOURCES)}")
    ap.add_argument("--data", action="append", default=[], metavar="SOURCE=PATH", help="a source's local copy")
    ap.add_argument("--errors", type=int, default=0, help="print up to this many tuning-split mistakes per source")
    ap.add_argument(
        "--splits",
        default="tune,held_out",
        help="comma-separated splits to print: tune while choosing rules, so that held-out rows are measured "
        "only for a final candidate",
    )
    ap.add_argument("--learned-model", default="builtin", help="'builtin' or a file written by the train module")
    args = ap.parse_args()
    splits, sources = args.splits.split(","), args.source.split(",")
    if set(splits) - {"tune", "held_out"}:
        raise SystemExit(f"--splits {args.splits!r}: expected tune, held_out or both, comma-separated")
    unknown = sorted(set(sources) - set(SOURCES))
    if unknown:
        raise SystemExit(f"--source: unknown {unknown}; known: {', '.join(SOURCES)}")
    data = dict(d.split("=", 1) for d in args.data)
    rules, model = load_rules(), load_model(args.learned_model)
    results: dict[tuple[str, str, str, str], list[tuple[bool, bool]]] = {}
    for source in sources:
        shown = 0
        for row in read_source(source, data.get(source)):
            if row.split not in splits:
                continue
            for clf, m in (("rules", None), ("learned", model)):
                verdict = classify_refusal(row.response, rules, model=m, prompt=row.prompt)
                for group in (row.group, "all"):
                    for lang in (row.lang, "all"):
                        results.setdefault((row.split, source, group, lang, clf), []).append(
                            (row.refused, verdict.refuses)
                        )
            if row.split == "tune" and row.refused != verdict.refuses and shown < args.errors:
                shown += 1
                print(f"--- {source} {row.id} human_refused={row.refused} ours={verdict.label} {verdict.refusals}")
                print(row.response[:600].replace("\n", " | "))
    print(
        "| split | source | group | lang | rows | rules: accuracy | recall | precision "
        "| learned: accuracy | recall | precision |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for split, source, group, lang, clf in sorted(results, key=lambda k: (k[0], k[1], k[2] == "all", k[2], k[3])):
        if clf != "rules" or (group != "all" and lang != "all"):
            continue
        cells = [f"{x:.3f}" for c in ("rules", "learned") for x in scores(results[(split, source, group, lang, c)])[:3]]
        n = len(results[(split, source, group, lang, clf)])
        print(f"| {split} | {source} | {group} | {lang} | {n} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
