"""How often the ``multiple_choice`` and ``short_answer`` rewards read a response as a person would:
a hand-written set of English and Chinese responses with known answers.

    python benchmarks/qa_extraction.py               # well under a second
    python benchmarks/qa_extraction.py --errors 20   # print tuning-split mistakes (never held-out ones)

Data: ``armor_rewards_qa/tests/cases/extraction_mc.jsonl`` and ``extraction_short.jsonl``, written
for this benchmark before the readers were, in the styles models answer in (answer statements,
bare letters, option texts, explanations before and after, self-corrections, hedges, full-width
characters, numbers with units). Each multiple-choice row says what a person reads as the chosen
answer (``expect``: a letter, a list of letters, ``"hedged"`` or null for no answer); each
short-answer row whether a person would mark it right given the accepted answers (``correct``)
and whether it hedges (``hedged``). No public set of model outputs with answer labels and a licence
allowing reuse was found quickly; this one is ARMOR's own.

Rows are split by a hash of their id: about 35% are held out. The readers were tuned on the
``tune`` split only, and ``--errors`` prints only its mistakes. Both splits were written before the
readers and their styles were in view while the rules were designed, so ``held_out`` is held out
from tuning but not from the designer's eye; ``extraction_*_fresh.jsonl`` (split ``fresh``, new
questions and phrasings) was written after the readers were frozen and measured once, untuned.

Columns: "extraction" is the share of rows whose reading matches the person's (multiple choice:
the same letters, or both hedged, or both no answer; short answer: the same right/wrong and
hedged/not); "score" the share whose reward (1 or 0) is the one the person's reading gives.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from armor_rewards_qa.domains import judge_choice, short_answer_reward

CASES = Path(__file__).resolve().parents[1] / "armor_rewards_qa" / "tests" / "cases"
HELD_OUT_PERCENT = 35


def split_of(row_id: str) -> str:
    """``held_out`` for about 35% of row ids, ``tune`` for the rest; stable across runs and machines."""
    return "held_out" if int(hashlib.sha256(row_id.encode()).hexdigest(), 16) % 100 < HELD_OUT_PERCENT else "tune"


def read_rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (CASES / name).read_text(encoding="utf-8").splitlines() if line.strip()]


def judge_mc(row: dict) -> tuple[bool, bool, str]:
    """(reading as expected, score as expected, what was read) for one multiple-choice row."""
    v = judge_choice(
        row["prompt"], row["response"], row["ground_truth"], {"options": row["options"]} if "options" in row else {}
    )
    read = "hedged" if v.hedged else (sorted(v.choice.letters) or None)
    expect = row["expect"]
    expected_read = expect if expect in (None, "hedged") else sorted([expect] if isinstance(expect, str) else expect)
    return read == expected_read, v.correct == (expected_read == sorted(v.gold)), str(read)


def judge_short(row: dict) -> tuple[bool, bool, str]:
    """(reading as expected, score as expected, what was read) for one short-answer row."""
    result = short_answer_reward(row["prompt"], row["response"], row["ground_truth"], {}, **row["params"])
    correct, hedged = bool(result.sub_scores["correct"]), bool(result.sub_scores["hedged"])
    return (
        correct == bool(row["correct"]) and hedged == bool(row["hedged"]),
        correct == bool(row["correct"]),
        f"correct={int(correct)} hedged={int(hedged)} f1={result.sub_scores['f1']:.2f}",
    )


SETS = (
    ("multiple_choice", "extraction_mc.jsonl", False),
    ("multiple_choice", "extraction_mc_fresh.jsonl", True),
    ("short_answer", "extraction_short.jsonl", False),
    ("short_answer", "extraction_short_fresh.jsonl", True),
)
JUDGES = {"multiple_choice": judge_mc, "short_answer": judge_short}


def evaluate() -> dict[tuple[str, str, str], list[tuple[bool, bool]]]:
    """``{(domain, split, lang): [(reading ok, score ok), ...]}`` over every set, with ``lang`` ``all`` too."""
    results: dict[tuple[str, str, str], list[tuple[bool, bool]]] = {}
    for domain, name, fresh in SETS:
        for row in read_rows(name):
            ok = JUDGES[domain](row)[:2]
            for lang in (row["lang"], "all"):
                results.setdefault((domain, "fresh" if fresh else split_of(row["id"]), lang), []).append(ok)
    return results


def table(results: dict[tuple[str, str, str], list[tuple[bool, bool]]]) -> str:
    lines = ["| domain | split | lang | rows | extraction | score |", "|---|---|---|---|---|---|"]
    for domain in ("multiple_choice", "short_answer"):
        for split in ("tune", "held_out", "fresh"):
            for lang in ("en", "zh", "all"):
                rows = results.get((domain, split, lang), [])
                if rows:
                    n = len(rows)
                    lines.append(
                        f"| {domain} | {split} | {lang} | {n} | {sum(r[0] for r in rows) / n:.3f} | "
                        f"{sum(r[1] for r in rows) / n:.3f} |"
                    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--errors", type=int, default=0, help="print up to this many tuning-split mistakes per domain")
    args = ap.parse_args()
    for domain, name, fresh in SETS:
        shown = 0
        for row in read_rows(name):
            if fresh or shown >= args.errors or split_of(row["id"]) != "tune":
                continue
            ok, _, read = JUDGES[domain](row)
            if not ok:
                shown += 1
                want = row.get("expect", f"correct={row.get('correct')} hedged={row.get('hedged')}")
                print(f"--- {row['id']} expected {want}, read {read}\n    {row['response']!r}")
    print(table(evaluate()))


if __name__ == "__main__":
    main()
