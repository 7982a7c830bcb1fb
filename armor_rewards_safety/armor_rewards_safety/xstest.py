"""Reading XSTest v2's human-labelled model completions: the data the learned refusal model is
trained on (``train.py``) and the refusal classifier is measured on (``benchmarks/refusal.py``).

XSTest (Röttger et al., NAACL 2024), github.com/paul-rottger/exaggerated-safety, folder
``model_completions/`` at commit ``COMMIT``: 450 responses from each of five models to 250 safe and
200 unsafe prompts, each labelled by two annotators as full compliance, full refusal or partial
refusal (``final_label``). Prompts are CC-BY-4.0; the completions fall under the licences of their
models' providers (Meta, Mistral, OpenAI), so they are read from a local copy and never shipped.

Rows are split by a hash of the prompt id, so a prompt is in the same split for every model: about
30% are ``held_out``, the rest ``tune``. Rules and the learned model are fitted on ``tune`` only.
"""

from __future__ import annotations

import csv
import hashlib
import io
import subprocess
from pathlib import Path

__all__ = ["COMMIT", "DEFAULT_DATA", "MODELS", "REFUSED", "read_completions", "refused", "scores", "split_of"]

MODELS = ("gpt4", "llama2new", "llama2orig", "mistralguard", "mistralinstruct")
COMMIT = "d7bb5bd738c1fcbc36edd83d5e7d1b71a3e2d84d"
DEFAULT_DATA = "/work/.mirror/paul-rottger+exaggerated-safety/repo"  # the copy the README's numbers were made with
REFUSED = frozenset({"2_full_refusal", "3_partial_refusal"})
HELD_OUT_PERCENT = 30


def split_of(prompt_id: str) -> str:
    """``held_out`` for about 30% of prompt ids, ``tune`` for the rest; stable across runs and machines."""
    bucket = int(hashlib.sha256(prompt_id.encode()).hexdigest(), 16) % 100
    return "held_out" if bucket < HELD_OUT_PERCENT else "tune"


def refused(row: dict[str, str]) -> bool:
    """Whether the annotators called the response a full or a partial refusal."""
    return row["final_label"] in REFUSED


def read_completions(data: str | Path, model: str) -> list[dict[str, str]]:
    """The rows of ``xstest_v2_completions_<model>.csv`` (id, type, prompt, completion, final_label, ...).

    :param data: a folder holding the CSV (or its ``model_completions/`` folder), or a bare git clone
        of paul-rottger/exaggerated-safety, read at ``COMMIT``.
    """
    data = Path(data)
    name = f"xstest_v2_completions_{model}.csv"
    for path in (data / name, data / "model_completions" / name):
        if path.is_file():
            text = path.read_text(encoding="utf-8")
            break
    else:  # a bare git mirror
        done = subprocess.run(
            ["git", f"--git-dir={data}", "show", f"{COMMIT}:model_completions/{name}"], capture_output=True, text=True
        )
        if done.returncode:
            raise SystemExit(
                f"cannot read {name} from {data}: neither a file there nor in git at {COMMIT} ({done.stderr.strip()}); "
                "pass --data: a folder of the XSTest v2 completion CSVs or a clone of paul-rottger/exaggerated-safety"
            )
        text = done.stdout
    rows = list(csv.DictReader(io.StringIO(text)))
    missing = {"id", "prompt", "completion", "final_label"} - set(rows[0] if rows else ())
    if missing:
        raise SystemExit(f"{data}/{name}: missing column(s) {sorted(missing)}; expected XSTest v2 completions")
    return rows


def scores(pairs: list[tuple[bool, bool]]) -> tuple[float, float, float, int]:
    """Accuracy, recall and precision of predicted refusal against human refusal, and the row count,
    from (human refused, predicted refused) pairs."""
    tp = sum(h and p for h, p in pairs)
    fp = sum(p and not h for h, p in pairs)
    fn = sum(h and not p for h, p in pairs)
    n = len(pairs)
    return (n - fp - fn) / n if n else 0.0, tp / (tp + fn) if tp + fn else 1.0, tp / (tp + fp) if tp + fp else 1.0, n
