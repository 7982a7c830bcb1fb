"""Public, human-labelled sets of model responses that the refusal classifier is measured on.

Each source reads from a local copy (a bare git clone made by ``fetch``, or a folder holding the
files) and yields ``LabelledResponse`` rows with a stable ``tune`` / ``held_out`` split by a hash of
the prompt, so one prompt's responses are all on one side. Nothing here is shipped: the responses
fall under their providers' terms. Where a source labels harm rather than refusal, the mapping is
stated below and in the README.

=========  ===================================================  ============================  =======
source     what it is                                           refused =                     licence
=========  ===================================================  ============================  =======
xstest     XSTest v2 completions of five models (Röttger et     full or partial refusal       CC-BY-4.0
           al. 2024), paul-rottger/exaggerated-safety            (``final_label``)             prompts
gptfuzz    GPT-3.5 answers to jailbreak templates, labelled     label 0 (not jailbroken)      MIT
           jailbroken or not (Yu et al. 2023),
           sherdencooper/GPTFuzz ``datasets/responses_labeled``
rbr_gold   OpenAI's RBR gold set: completions to multi-turn     neither ``fully_complies``    MIT
           conversations with human proposition labels (Mu et   nor ``partially_complies``
           al. 2024), openai/safety-rbr-code-and-data
jailjudge  JAILJUDGE-mini (Liu et al. 2024) via                 label 0 (not jailbroken)      MIT
           ThuCCSLab/JailbreakEval ``data/JAILJUDGEmini.csv``
=========  ===================================================  ============================  =======

In ``gptfuzz`` and ``jailjudge`` "not jailbroken" is mostly a refusal, but also an answer that
stays harmless (a persona that only says it is ready, an off-topic continuation): on those sets
precision (a harmful answer scored as a refusal) is the number that matters for reward hacking,
and recall is bounded by how many harmless non-refusals the set holds.
"""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from armor_rewards_safety import xstest

__all__ = ["SOURCES", "LabelledResponse", "Source", "read_source"]

_CJK = re.compile(r"[\u3400-\u9fff]")
MIRRORS = Path("/work/.mirror")  # where `fetch` puts bare clones; --data overrides


@dataclass(frozen=True)
class LabelledResponse:
    source: str
    group: str  # the model or sub-set within the source
    id: str
    prompt: str
    response: str
    refused: bool
    split: str

    @property
    def lang(self) -> str:
        return "zh" if len(_CJK.findall(self.response)) * 3 > len(re.findall(r"[A-Za-z]", self.response)) else "en"


@dataclass(frozen=True)
class Source:
    name: str
    default_data: str
    commit: str  # the commit the README's numbers were made with
    read: Callable[[Path, str], Iterator[LabelledResponse]]


def split_of(key: str) -> str:
    """``held_out`` for about 30% of prompts, ``tune`` for the rest (``xstest.split_of``, any key)."""
    return xstest.split_of(key)


def _git_file(data: Path, commit: str, path: str) -> str:
    """``path`` from a folder (``data/path`` or ``data/<basename>``) or from a bare clone at ``commit``."""
    for candidate in (data / path, data / Path(path).name):
        if candidate.is_file():
            return candidate.read_text(encoding="utf-8")
    done = subprocess.run(["git", f"--git-dir={data}", "show", f"{commit}:{path}"], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(
            f"cannot read {path} from {data}: neither a file there nor in git at {commit} "
            f"({done.stderr.strip()}); pass --data: a folder holding it or a clone of the source's repository"
        )
    return done.stdout


def _xstest(data: Path, commit: str) -> Iterator[LabelledResponse]:
    for model in xstest.MODELS:
        for row in xstest.read_completions(data, model):
            yield LabelledResponse(
                "xstest", model, row["id"], row["prompt"], row["completion"], xstest.refused(row), split_of(row["id"])
            )


def _jailbreak_csv(name: str, paths: tuple[str, ...], prompt_key: str, response_key: str):
    def read(data: Path, commit: str) -> Iterator[LabelledResponse]:
        for path in paths:
            rows = csv.DictReader(io.StringIO(_git_file(data, commit, path)))
            for i, row in enumerate(rows):
                label = row["label"].strip()
                if label not in ("0", "1"):
                    raise SystemExit(f"{path} row {i + 2}: label {label!r}, expected 0 or 1")
                prompt = row[prompt_key]
                yield LabelledResponse(
                    name, Path(path).stem, f"{Path(path).stem}:{i}", prompt, row[response_key], label == "0",
                    split_of(prompt),
                )  # fmt: skip

    return read


def _rbr_gold(data: Path, commit: str) -> Iterator[LabelledResponse]:
    for part in ("train", "test"):
        for i, line in enumerate(_git_file(data, commit, f"data/rbr_gold_data/{part}.jsonl").splitlines()):
            row = json.loads(line)
            props = row["propositions"]
            prompt = "\n".join(m["content"] for m in row["prompt"] if m["role"] == "user")
            complies = props.get("fully_complies") or props.get("partially_complies")
            yield LabelledResponse(
                "rbr_gold", row["response_type"], f"{part}:{i}", prompt, row["completion"][-1]["content"],
                not complies, split_of(prompt),
            )  # fmt: skip


SOURCES = {
    s.name: s
    for s in (
        Source("xstest", xstest.DEFAULT_DATA, xstest.COMMIT, _xstest),
        Source(
            "gptfuzz",
            str(MIRRORS / "sherdencooper+GPTFuzz/repo"),
            "1eddeb565740ae311b5f4950492b011a6f866fe7",
            _jailbreak_csv(
                "gptfuzz",
                ("datasets/responses_labeled/train.csv", "datasets/responses_labeled/evaluate.csv"),
                "question",
                "Response",
            ),
        ),
        Source(
            "rbr_gold",
            str(MIRRORS / "openai+safety-rbr-code-and-data/repo"),
            "7f489fa6b38d72468235f275c23bf3f0c849e5ca",
            _rbr_gold,
        ),
        Source(
            "jailjudge",
            str(MIRRORS / "ThuCCSLab+JailbreakEval/repo"),
            "c1419728c039adc8c75e85b72a15a845b0999bf7",
            _jailbreak_csv("jailjudge", ("data/JAILJUDGEmini.csv",), "question", "answer"),
        ),
    )
}


def read_source(name: str, data: str | None = None) -> list[LabelledResponse]:
    """Every labelled row of source ``name``, read from ``data`` (default: the source's usual local copy)."""
    if name not in SOURCES:
        raise SystemExit(f"unknown source {name!r}; sources: {', '.join(SOURCES)}")
    source = SOURCES[name]
    return list(source.read(Path(data or source.default_data), source.commit))
