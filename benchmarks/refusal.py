"""Accuracy of the ``refusal`` reward's classifier against human labels: XSTest v2 model completions.

    python benchmarks/refusal.py                      # a few seconds on one core
    python benchmarks/refusal.py --data DIR           # a folder holding xstest_v2_completions_<model>.csv
    python benchmarks/refusal.py --errors 20          # print tuning-split mistakes (never held-out ones)

Data: XSTest (Röttger et al., NAACL 2024), github.com/paul-rottger/exaggerated-safety, folder
``model_completions/`` at commit d7bb5bd738c1fcbc36edd83d5e7d1b71a3e2d84d: 450 responses from each of
five models (gpt4, llama2new, llama2orig, mistralguard, mistralinstruct) to 250 safe and 200 unsafe
prompts, each labelled by two annotators as full compliance, full refusal or partial refusal
(``final_label``). Prompts are CC-BY-4.0; the completions fall under the licences of their models'
providers (Meta, Mistral, OpenAI), so they are read from a local copy, not shipped with ARMOR.
``--data`` is either a folder of the CSVs or a bare git clone of that repository (read at the
commit above with ``git show``); the default is the mirror this benchmark was written against.

A response counts as a refusal if the humans called it a full or a partial refusal, and as
predicted refusal if ``classify_refusal`` says ``refusal`` or ``partial``. Rows are split by a hash
of the prompt id (the same prompt is in the same split for every model): about 30% are held out.
Rules were tuned on the ``tune`` split only; ``--errors`` prints only tuning-split mistakes.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import subprocess
from pathlib import Path

from armor_rewards_safety.refusal import classify_refusal
from armor_rewards_safety.ruleset import load_rules

MODELS = ("gpt4", "llama2new", "llama2orig", "mistralguard", "mistralinstruct")
COMMIT = "d7bb5bd738c1fcbc36edd83d5e7d1b71a3e2d84d"
DEFAULT_DATA = "/work/.mirror/paul-rottger+exaggerated-safety/repo"
REFUSED = {"2_full_refusal", "3_partial_refusal"}
HELD_OUT_PERCENT = 30


def split_of(prompt_id: str) -> str:
    """``held_out`` for about 30% of prompt ids, ``tune`` for the rest; stable across runs and machines."""
    bucket = int(hashlib.sha256(prompt_id.encode()).hexdigest(), 16) % 100
    return "held_out" if bucket < HELD_OUT_PERCENT else "tune"


def read_completions(data: Path, model: str) -> list[dict[str, str]]:
    name = f"xstest_v2_completions_{model}.csv"
    if (data / name).is_file():
        text = (data / name).read_text(encoding="utf-8")
    elif (data / "model_completions" / name).is_file():
        text = (data / "model_completions" / name).read_text(encoding="utf-8")
    else:  # a bare git mirror
        done = subprocess.run(["git", f"--git-dir={data}", "show", f"{COMMIT}:model_completions/{name}"], capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"cannot read {name} from {data}: neither a file there nor in git at {COMMIT} ({done.stderr.strip()})")
        text = done.stdout
    rows = list(csv.DictReader(io.StringIO(text)))
    missing = {"id", "completion", "final_label"} - set(rows[0] if rows else ())
    if missing:
        raise SystemExit(f"{data}/{name}: missing column(s) {sorted(missing)}; expected XSTest v2 completions")
    return rows


def scores(pairs: list[tuple[bool, bool]]) -> tuple[float, float, float, int]:
    """accuracy, recall, precision of predicted refusal against human refusal; and the row count."""
    tp = sum(h and p for h, p in pairs)
    fp = sum(p and not h for h, p in pairs)
    fn = sum(h and not p for h, p in pairs)
    n = len(pairs)
    return (n - fp - fn) / n if n else 0.0, tp / (tp + fn) if tp + fn else 1.0, tp / (tp + fp) if tp + fp else 1.0, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=DEFAULT_DATA, help="folder of xstest_v2_completions_<model>.csv, or a bare git clone of paul-rottger/exaggerated-safety")
    ap.add_argument("--errors", type=int, default=0, help="print up to this many tuning-split mistakes per model")
    args = ap.parse_args()
    rules = load_rules()
    results: dict[tuple[str, str], list[tuple[bool, bool]]] = {}
    for model in MODELS:
        shown = 0
        for row in read_completions(Path(args.data), model):
            split = split_of(row["id"])
            verdict = classify_refusal(row["completion"], rules)
            human, predicted = row["final_label"] in REFUSED, verdict.label != "compliance"
            for key in ((split, model), (split, "all")):
                results.setdefault(key, []).append((human, predicted))
            if split == "tune" and human != predicted and shown < args.errors:
                shown += 1
                print(f"--- {model} {row['id']} human={row['final_label']} ours={verdict.label} refusals={verdict.refusals} content={verdict.content_size}")
                print(row["completion"][:600].replace("\n", " | "))
    print(f"| split | model | rows | accuracy | recall | precision |\n|---|---|---|---|---|---|")
    for split in ("tune", "held_out"):
        for model in (*MODELS, "all"):
            acc, rec, prec, n = scores(results[(split, model)])
            print(f"| {split} | {model} | {n} | {acc:.3f} | {rec:.3f} | {prec:.3f} |")


if __name__ == "__main__":
    main()
