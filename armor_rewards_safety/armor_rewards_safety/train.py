"""Train the learned refusal model (``learned.RefusalModel``) on the ``tune`` split of XSTest.

    python -m armor_rewards_safety.train                    # rewrites armor_rewards_safety/models/refusal_en.json
    python -m armor_rewards_safety.train --out mine.json    # then: reward.domain_kwargs.refusal.learned_model=mine.json
    python -m armor_rewards_safety.train --cv 5             # also print 5-fold cross-validation on the tune split
    python -m armor_rewards_safety.train --models gpt4,mistralguard,mistralinstruct   # train on some models' responses

The data (``xstest.py``) is read from a local copy and never shipped; the model file holds only
weights of words and word pairs that occur in at least ``--min-rows`` tuning responses. Held-out
rows are never read here. The fit is an L2-regularised logistic regression by Newton's method; each
Newton step is solved in the n x n dual (Woodbury identity), since there are more n-grams than
rows. Same data, same file: features and vocabulary are sorted and weights rounded to 4 decimals.
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
from armor_rewards_safety.xstest import COMMIT, DEFAULT_DATA, MODELS, read_completions, refused, scores, split_of

__all__ = ["fit_logistic", "train"]

# Chosen by 5-fold cross-validation on the tune split (--cv): accuracy moved by under 0.005 for
# l2 in [0.0003, 0.003], min_rows in [3, 10] and thresholds 0.4-0.5, so the plain 0.5 is kept.
L2 = 0.003
MIN_ROWS = 5
THRESHOLD = 0.5
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


def _examples(rows: list[dict[str, str]], rules: RuleSet) -> list[tuple[dict[str, float], set[str]]]:
    """Each row's features, from the rules' verdict alone (no model), as the model sees them at inference."""
    return [features(normalize(row["completion"]), classify_refusal(row["completion"], rules)) for row in rows]


def train(rows: list[dict[str, str]], rules: RuleSet, *, l2: float = L2, min_rows: int = MIN_ROWS) -> dict:
    """The model file's content (``learned.FORMAT``) fitted to XSTest-style ``rows`` (completion, final_label)."""
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
    y = np.array([refused(r) for r in rows], dtype=float)
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
            "data": f"XSTest v2 model completions, github.com/paul-rottger/exaggerated-safety@{COMMIT}",
            "split": "tune",
            "rows": len(rows),
            "refused": int(y.sum()),
            "l2": l2,
            "min_rows": min_rows,
            "command": "python -m armor_rewards_safety.train",
        },
    }


def _fold(prompt_id: str, k: int) -> int:
    return int(hashlib.sha256(f"fold:{prompt_id}".encode()).hexdigest(), 16) % k


def cross_validate(rows: list[dict[str, str]], rules: RuleSet, k: int) -> dict[str, list[tuple[bool, bool]]]:
    """(human refused, predicted refused) per model, each row predicted by a model trained on the other folds."""
    out: dict[str, list[tuple[bool, bool]]] = {}
    for fold in range(k):
        model = RefusalModel.from_dict(train([r for r in rows if _fold(r["id"], k) != fold], rules))
        for r in (r for r in rows if _fold(r["id"], k) == fold):
            pair = (refused(r), classify_refusal(r["completion"], rules, model=model).label != "compliance")
            for key in (r["model"], "all"):
                out.setdefault(key, []).append(pair)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--data",
        default=DEFAULT_DATA,
        help="folder of xstest_v2_completions_<model>.csv, or a bare git clone of paul-rottger/exaggerated-safety",
    )
    ap.add_argument("--out", default=str(BUILTIN), help="where to write the model (default: the built-in model file)")
    ap.add_argument(
        "--models",
        default=",".join(MODELS),
        help=f"comma-separated XSTest models whose responses to train on (default: all of {', '.join(MODELS)})",
    )
    ap.add_argument(
        "--cv",
        type=int,
        default=0,
        metavar="K",
        help="also print K-fold cross-validation on the tune split (by prompt)",
    )
    args = ap.parse_args()
    unknown = sorted(set(args.models.split(",")) - set(MODELS))
    if unknown:
        raise SystemExit(f"--models: unknown {unknown}; XSTest has {', '.join(MODELS)}")
    rules = load_rules()
    rows = [
        dict(r, model=m)
        for m in args.models.split(",")
        for r in read_completions(args.data, m)
        if split_of(r["id"]) == "tune"
    ]
    data = train(rows, rules)
    data["trained_on"]["models"] = args.models.split(",")
    Path(args.out).write_text(json.dumps(data, indent=0, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {args.out}: {len(data['ngrams'])} n-gram weights from {len(rows)} tune rows")
    if args.cv:
        print(f"| {args.cv}-fold CV on tune | rows | accuracy | recall | precision |\n|---|---|---|---|---|")
        for key, pairs in sorted(cross_validate(rows, rules, args.cv).items(), key=lambda kv: (kv[0] == "all", kv[0])):
            acc, rec, prec, n = scores(pairs)
            print(f"| {key} | {n} | {acc:.3f} | {rec:.3f} | {prec:.3f} |")


if __name__ == "__main__":
    main()
