"""Accuracy of the ``refusal`` reward's classifier against human labels: XSTest v2 model completions.

    python benchmarks/refusal.py                      # under a minute on one core
    python benchmarks/refusal.py --data DIR           # a folder holding xstest_v2_completions_<model>.csv
    python benchmarks/refusal.py --errors 20 --splits tune   # print tuning-split mistakes (never held-out ones), tune
    table only
    python benchmarks/refusal.py --learned-model FILE # a model written by `python -m armor_rewards_safety.train --out
    FILE`

Data: XSTest (``armor_rewards_safety/xstest.py`` says where it comes from, its licences, and how rows
are split): 450 responses from each of five models, labelled by two annotators as full compliance,
full refusal or partial refusal. A response counts as a refusal if the humans called it a full or a
partial refusal, and as predicted refusal if ``classify_refusal`` says ``refusal`` or ``partial``.

Two classifiers are measured: ``rules`` (the phrase rules alone) and ``learned`` (the default of the
``refusal`` and ``safety`` domains: the rules, and the learned model for what they call compliance).
Rules and model were fitted on the ``tune`` split only, so its rows measure the fit; ``held_out``
rows measure what the classifier does on prompts it has not seen. ``--errors`` prints only
tuning-split mistakes.
"""

from __future__ import annotations

import argparse

from armor_rewards_safety.learned import load_model
from armor_rewards_safety.refusal import classify_refusal
from armor_rewards_safety.ruleset import load_rules
from armor_rewards_safety.xstest import DEFAULT_DATA, MODELS, read_completions, refused, scores, split_of


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--data",
        default=DEFAULT_DATA,
        help="folder of xstest_v2_completions_<model>.csv, or a bare git clone of paul-rottger/exaggerated-safety",
    )
    ap.add_argument(
        "--errors",
        type=int,
        default=0,
        help="print up to this many tuning-split mistakes of the learned classifier per model",
    )
    ap.add_argument(
        "--splits",
        default="tune,held_out",
        help="comma-separated splits to print in the table: tune while choosing rules, "
        "so that held-out rows are measured only for a final candidate",
    )
    ap.add_argument(
        "--learned-model",
        default="builtin",
        help="the learned model to measure: 'builtin' or a file written by armor_rewards_safety.train",
    )
    args = ap.parse_args()
    splits = args.splits.split(",")
    if set(splits) - {"tune", "held_out"}:
        raise SystemExit(f"--splits {args.splits!r}: expected tune, held_out or both, comma-separated")
    rules, model = load_rules(), load_model(args.learned_model)
    results: dict[tuple[str, str, str], list[tuple[bool, bool]]] = {}
    for name in MODELS:
        shown = 0
        for row in read_completions(args.data, name):
            split, human = split_of(row["id"]), refused(row)
            if split not in splits:
                continue
            for clf, m in (("rules", None), ("learned", model)):
                verdict = classify_refusal(row["completion"], rules, model=m)
                for key in ((split, name, clf), (split, "all", clf)):
                    results.setdefault(key, []).append((human, verdict.label != "compliance"))
            if split == "tune" and human != (verdict.label != "compliance") and shown < args.errors:
                shown += 1
                print(
                    f"--- {name} {row['id']} human={row['final_label']} ours={verdict.label} "
                    f"refusals={verdict.refusals} content={verdict.content_size} p={verdict.probability}"
                )
                print(row["completion"][:600].replace("\n", " | "))
    print("| split | model | rows | rules: accuracy | recall | precision | learned: accuracy | recall | precision |")
    print("|---|---|---|---|---|---|---|---|---|")
    for split in splits:
        for name in (*MODELS, "all"):
            cells = [f"{x:.3f}" for clf in ("rules", "learned") for x in scores(results[(split, name, clf)])[:3]]
            print(f"| {split} | {name} | {len(results[(split, name, 'rules')])} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
