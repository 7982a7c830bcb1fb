"""Train the learned refusal model (``learned.RefusalModel``) on the ``tune`` split of public sources.

    python -m armor_rewards_safety.train                    # rewrites armor_rewards_safety/models/refusal_en.json
    python -m armor_rewards_safety.train --out mine.json    # then: reward.domain_kwargs.refusal.learned_model=mine.json
    python -m armor_rewards_safety.train --cv 5             # also print 5-fold cross-validation on the tune split
    python -m armor_rewards_safety.train --sources xstest --voice-sources xstest,gptfuzz,rbr_gold

Two weight sets go into one file: the whole-response weights (``--sources``, default XSTest) and
``voices`` (``--voice-sources``), which judge one voice or paragraph of a response. The data
(``sources.py``) is read from local copies and never shipped; the file holds only weights of words
and word pairs that occur in at least ``MIN_ROWS`` tuning responses. Held-out rows are never read
here. The fit is an L2-regularised logistic regression by Newton's method; each Newton step is
solved in the n x n dual (Woodbury identity), since there are more n-grams than rows, so at most
``MAX_PER_SOURCE`` rows of a source are used. Same data, same file: features and vocabulary are
sorted and weights rounded to 4 decimals.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections import Counter
from pathlib import Path

import numpy as np

from armor_rewards_safety.learned import BUILTIN, FORMAT, RefusalModel, features
from armor_rewards_safety.refusal import classify_refusal
from armor_rewards_safety.ruleset import RuleSet, load_rules, normalize
from armor_rewards_safety.sources import SOURCES, LabelledResponse, read_source
from armor_rewards_safety.xstest import scores

__all__ = ["fit_logistic", "train"]

# Chosen by 5-fold cross-validation on the tune split (--cv): accuracy moved by under 0.005 for
# l2 in [0.0003, 0.003], min_rows in [3, 10] and thresholds 0.4-0.5, so the plain 0.5 is kept.
L2 = 0.003
MIN_ROWS = 5
THRESHOLD = 0.5
MAX_PER_SOURCE = 1500
# The built-in model learns from XSTest alone. Adding the gptfuzz and rbr_gold tune rows raised those
# sources' held-out numbers but turned 17 of the pack's hand-written answers ("I can't believe how simple
# this is: ...") into refusals and cost XSTest's held-out recall 0.05: those sets call many harmless
# answers "not jailbroken" or "not complying", which the model learns as refusal wording.
TRAIN_SOURCES = ("xstest",)
# Judging one voice of a jailbroken response ("does this persona answer or only lecture?") is what the
# jailbreak sets label best, and there the hand-written answers are never judged alone.
VOICE_SOURCES = ("xstest", "gptfuzz", "rbr_gold")
BIAS_SCALE = 10.0  # the bias column is scaled so that its L2 penalty is 1/100 of a weight's


def fit_logistic(X: np.ndarray, y: np.ndarray, l2: float, iters: int = 50) -> tuple[np.ndarray, float]:
    """Weights and bias minimising mean log-loss + ``l2`` * |w|^2 / 2 over rows ``X`` (n, d), labels ``y`` in {0, 1}."""
    n = len(X)
    Xb = np.hstack([X, np.full((n, 1), BIAS_SCALE)])
    lam = l2 * n
    K = Xb @ Xb.T
    w = np.zeros(Xb.shape[1])
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-(Xb @ w)))
        grad = Xb.T @ (p - y) + lam * w
        curvature = np.maximum(p * (1 - p), 1e-10)
        # (Xb' S Xb + lam I)^-1 grad = (grad - Xb' (S^-1 + Xb Xb' / lam)^-1 Xb grad / lam) / lam
        step = (grad - Xb.T @ np.linalg.solve(np.diag(1 / curvature) + K / lam, Xb @ grad / lam)) / lam
        w -= step
        if np.abs(step).max() < 1e-7:
            break
    return w[:-1], float(w[-1] * BIAS_SCALE)


def _examples(rows: list[LabelledResponse], rules: RuleSet) -> list[tuple[dict[str, float], set[str]]]:
    """Each row's features, from the rules' verdict alone (no model), as the model sees them at inference."""
    return [features(rules.mask(normalize(row.response)), classify_refusal(row.response, rules)) for row in rows]


def train(rows: list[LabelledResponse], rules: RuleSet, *, l2: float = L2, min_rows: int = MIN_ROWS) -> dict:
    """The model file's content (``learned.FORMAT``) fitted to labelled ``rows`` (``sources.LabelledResponse``)."""
    examples = _examples(rows, rules)
    counts = Counter(g for _, grams in examples for g in grams)
    signal_names = sorted({k for sig, _ in examples for k in sig})
    gram_names = sorted(g for g, c in counts.items() if c >= min_rows)
    # signal and n-gram names may coincide (the word "apology"): separate columns
    column = {
        (kind, name): j
        for j, (kind, name) in enumerate([("s", k) for k in signal_names] + [("g", g) for g in gram_names])
    }
    X = np.zeros((len(rows), len(column)))
    for i, (sig, grams) in enumerate(examples):
        for key, value in sig.items():
            X[i, column["s", key]] = value
        for g in grams:
            if ("g", g) in column:
                X[i, column["g", g]] = 1.0
    y = np.array([r.refused for r in rows], dtype=float)
    w, b = fit_logistic(X, y, l2)

    def weight(kind: str, name: str) -> float:
        return round(float(w[column[kind, name]]), 4)

    return {
        "format": FORMAT,
        "threshold": THRESHOLD,
        "bias": round(b, 4),
        "signals": {k: weight("s", k) for k in signal_names},
        "ngrams": {g: weight("g", g) for g in gram_names if weight("g", g)},
        "trained_on": {
            "data": sorted(
                {f"{r.source}@{SOURCES[r.source].commit}" if r.source in SOURCES else r.source for r in rows}
            ),
            "split": "tune",
            "rows": len(rows),
            "refused": int(y.sum()),
            "l2": l2,
            "min_rows": min_rows,
            "command": "python -m armor_rewards_safety.train",
        },
    }


def _fold(key: str, k: int) -> int:
    return int(hashlib.sha256(f"fold:{key}".encode()).hexdigest(), 16) % k


def cross_validate(rows: list[LabelledResponse], rules: RuleSet, k: int) -> dict[str, list[tuple[bool, bool]]]:
    """(human refused, predicted refused) per source and group, each row predicted by a model trained on the
    other folds (folds by prompt, so one prompt's responses are in one fold)."""
    out: dict[str, list[tuple[bool, bool]]] = {}
    for fold in range(k):
        model = RefusalModel.from_dict(train([r for r in rows if _fold(r.prompt, k) != fold], rules))
        for r in (r for r in rows if _fold(r.prompt, k) == fold):
            predicted = classify_refusal(r.response, rules, model=model, prompt=r.prompt).refuses
            for key in (f"{r.source}/{r.group}", r.source, "all"):
                out.setdefault(key, []).append((r.refused, predicted))
    return out


def training_rows(sources: list[str], data: dict[str, str]) -> list[LabelledResponse]:
    """The tune rows of ``sources`` that the model may learn from: not Llama 2's (its licence forbids
    improving other models with its outputs), and at most ``MAX_PER_SOURCE`` per source, chosen by a
    hash, so that the n x n Newton solve stays small."""
    rows = []
    for name in sources:
        tune = [r for r in read_source(name, data.get(name)) if r.split == "tune" and not r.group.startswith("llama2")]
        tune.sort(key=lambda r: hashlib.sha256(f"pick:{r.source}:{r.id}".encode()).hexdigest())
        rows.extend(tune[:MAX_PER_SOURCE])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument(
        "--sources",
        default=",".join(TRAIN_SOURCES),
        help=f"comma-separated sources to learn from (tune split only; default {','.join(TRAIN_SOURCES)}); "
        f"known: {', '.join(SOURCES)}",
    )
    ap.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="SOURCE=PATH",
        help="where a source's local copy is (a folder or a bare git clone); default: the source's usual place",
    )
    ap.add_argument(
        "--voice-sources",
        default=",".join(VOICE_SOURCES),
        help="comma-separated sources for the weights that judge one voice or paragraph of a response "
        f"(default {','.join(VOICE_SOURCES)}; empty: the same weights as the whole response)",
    )
    ap.add_argument("--out", default=str(BUILTIN), help="where to write the model (default: the built-in model file)")
    ap.add_argument(
        "--cv",
        type=int,
        default=0,
        metavar="K",
        help="also print K-fold cross-validation on the tune split (by prompt)",
    )
    args = ap.parse_args()
    sources = args.sources.split(",")
    unknown = sorted((set(sources) | set(filter(None, args.voice_sources.split(",")))) - set(SOURCES))
    if unknown:
        raise SystemExit(f"--sources: unknown {unknown}; known: {', '.join(SOURCES)}")
    data = dict(d.split("=", 1) for d in args.data)
    rules = load_rules()
    rows = training_rows(sources, data)
    model = train(rows, rules)
    if args.voice_sources:
        voice_rows = training_rows(args.voice_sources.split(","), data)
        model["voices"] = train(voice_rows, rules)
    Path(args.out).write_text(json.dumps(model, indent=0, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {args.out}: {len(model['ngrams'])} n-gram weights from {len(rows)} tune rows")
    if args.cv:
        print(f"| {args.cv}-fold CV on tune | rows | accuracy | recall | precision |\n|---|---|---|---|---|")
        for key, pairs in sorted(cross_validate(rows, rules, args.cv).items(), key=lambda kv: (kv[0] == "all", kv[0])):
            acc, rec, prec, n = scores(pairs)
            print(f"| {key} | {n} | {acc:.3f} | {rec:.3f} | {prec:.3f} |")


if __name__ == "__main__":
    main()
