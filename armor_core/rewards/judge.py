"""Rewards from a generative judge: ``reward.judge``, a language model asked about each response with a
prompt template from config, its answer read as a score or a label.

    reward:
      judge:
        - model: runs/judge-model            # a local causal LM, run in the reward pool's workers
          # or: url: http://host:8000/v1, model_name: qwen2.5-72b-instruct, api_key_env: JUDGE_API_KEY
          template: "Question: {prompt}\\nAnswer: {response}\\nReference: {ground_truth}\\nCorrect? yes or no:"
          parser: label                      # or score: the first number in the verdict
          labels: {yes: 1.0, no: 0.0}
          data_sources: [open_qa]

The template's fields are ``{prompt}``, ``{response}``, ``{ground_truth}`` and ``{rubric}`` (the row's
``extra.rubric``, else the entry's ``rubric``); any other field is an error at start. With a chat
template in the judge's tokenizer (local) or always (endpoint), the filled template is the user message.

Local (``model``): a batched domain in the reward pool's workers (``reward.timeout_s`` per batch, the
failure watch); the model loads once per worker (its ``warmup``) and generates ``max_new_tokens`` at
``temperature`` (0: greedy), ``batch_size`` rows a pass. ``placement: worker`` runs it on a Ray worker of its
own instead, with its own cores and GPUs (``armor_core.rewards.placement``), in bfloat16 on a GPU that has it.

Endpoint (``url``): an OpenAI-compatible ``POST {url}/chat/completions`` per row, ``max_concurrency`` in
flight, with the retries, back-off and time bounds of ``reward.remote`` (``armor_core.rewards.remote``: each
try ``timeout_s`` to the answer's last byte, a batch's rows ``total_bound`` in all); the
API key is read from the environment variable ``api_key_env`` when a request is made, never stored in the
config or logged.

Verdicts: ``label`` takes the earliest of ``labels``' keys found in the verdict (whole words, case
ignored) and scores its value; ``score`` takes the first number, which must lie in ``score_range``
(divided by its upper end when ``scale: true``). A verdict with neither fails its row, with the verdict
text in the error; the sub-score ``verdict_chars`` is the verdict's length.
"""

from __future__ import annotations

import os
import re
import string
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Mapping, Sequence, cast

from armor_core.config.schema import ConfigError
from armor_core.interfaces import RewardDomain, RewardResult
from armor_core.rewards.batch import OneRowFromBatch
from armor_core.rewards.entries import Entries
from armor_core.rewards.model import PLACEMENTS, resolve_dtype
from armor_core.rewards.placement import placed
from armor_core.rewards.remote import RemoteRewardError, post_json, total_bound

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["EndpointJudge", "LocalJudge", "Verdicts", "judge_models", "load_judges"]

_FIELDS = {"prompt", "response", "ground_truth", "rubric"}
_DEFAULTS = {
    "domain": "judge",
    "data_sources": [],
    "template": None,
    "parser": "label",
    "labels": {"yes": 1.0, "no": 0.0},
    "score_range": [0.0, 10.0],
    "scale": False,
    "rubric": "",
    "max_new_tokens": 32,
    "temperature": 0.0,
    "batch_size": 16,
    "threads": 1,
    "placement": "pool",
    "model_name": None,
    "api_key_env": None,
    "timeout_s": 60.0,
    "retries": 3,
    "backoff_s": 1.0,
    "max_concurrency": 4,
    "requires_ground_truth": False,
}
_ALL_DEFAULTS = {"model": None, "url": None, **_DEFAULTS}  # a local judge's model, or an endpoint's url
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_LOADED: dict[
    tuple, tuple[PreTrainedModel, PreTrainedTokenizerBase]
] = {}  # per process: (model directory, device) -> (model, tokenizer)


class Verdicts:
    """The template that asks and the parser that reads; shared by both judges, pickled by its settings."""

    def __init__(self, template: str, parser: str, labels: Mapping[str, float], score_range: Sequence[float],
                 scale: bool, rubric: str) -> None:  # fmt: skip
        self.template, self.parser, self.labels = template, parser, {str(k): float(v) for k, v in labels.items()}
        self.low, self.high, self.scale, self.rubric = float(score_range[0]), float(score_range[1]), scale, rubric
        self._words = re.compile(r"\b(" + "|".join(map(re.escape, self.labels)) + r")\b", re.IGNORECASE)

    def ask(self, prompt: str, response: str, ground_truth: Any, extra: Mapping[str, Any]) -> str:
        rubric = (extra or {}).get("rubric", self.rubric)
        gt = "" if ground_truth is None else str(ground_truth)
        return self.template.format(prompt=prompt, response=response, ground_truth=gt, rubric=rubric)

    def read(self, verdict: str) -> RewardResult:
        subs = {"verdict_chars": float(len(verdict))}
        if self.parser == "label":
            found = self._words.search(verdict)
            if found is None:
                raise ValueError(f"the judge's verdict names none of {sorted(self.labels)}: {verdict[:200]!r}")
            value = next(v for k, v in self.labels.items() if k.lower() == found.group(1).lower())
            return RewardResult(value, subs)
        found = _NUMBER.search(verdict)
        if found is None:
            raise ValueError(f"the judge's verdict holds no number: {verdict[:200]!r}")
        value = float(found.group())
        if not self.low <= value <= self.high:
            bounds = f"[{self.low:g}, {self.high:g}]"
            raise ValueError(f"the judge's score {value:g} lies outside {bounds}: {verdict[:200]!r}")
        return RewardResult(value / self.high if self.scale else value, subs)


class _Judge(OneRowFromBatch):
    """What both judges share: the template fills each row, ``judge`` turns the filled templates into results."""

    verdicts: Verdicts

    def judge(self, asks: Sequence[str]) -> list[RewardResult | Exception]:
        raise NotImplementedError

    def score_batch(
        self,
        prompts: Sequence[str],
        responses: Sequence[str],
        ground_truths: Sequence[Any],
        extras: Sequence[Mapping[str, Any]],
    ) -> list[RewardResult | Exception]:
        return self.judge([self.verdicts.ask(*row) for row in zip(prompts, responses, ground_truths, extras)])


class LocalJudge(_Judge):
    """A local causal LM as judge: the ``batch_fn`` of its domain, run in a reward worker."""

    def __init__(self, path: str, verdicts: Verdicts, *, max_new_tokens: int, temperature: float, batch_size: int,
                 threads: int) -> None:  # fmt: skip
        self.path, self.verdicts, self.max_new_tokens = path, verdicts, max_new_tokens
        self.temperature, self.batch_size, self.threads = temperature, batch_size, threads
        self.device = "cpu"  # a reward-model worker with a GPU sets "cuda" before it loads

    def __repr__(self) -> str:
        return f"LocalJudge({self.path})"

    def load(self) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
        key = (self.path, self.device)
        if key not in _LOADED:
            import torch

            from armor_core.models.loading import load_model, load_tokenizer

            torch.set_num_threads(self.threads)
            model = load_model(self.path, resolve_dtype("auto", self.device))
            # transformers annotates PreTrainedModel.to through a decorator pyright reads as taking the model itself
            model = model.to(self.device)  # pyright: ignore[reportArgumentType]
            _LOADED[key] = (model.eval(), load_tokenizer(self.path))
        return _LOADED[key]

    def generate(self, texts: Sequence[str]) -> list[str]:
        """The judge's verdict for each filled template (left-padded batches, the new tokens decoded)."""
        import torch

        model, tokenizer = self.load()
        if getattr(tokenizer, "chat_template", None):
            chat = [[{"role": "user", "content": t}] for t in texts]
            # tokenize=False: each conversation renders to one string
            texts = [
                cast(str, tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True)) for c in chat
            ]
        out: list[str] = []
        sample = self.temperature > 0
        with torch.no_grad():
            for start in range(0, len(texts), self.batch_size):
                enc = tokenizer(list(texts[start : start + self.batch_size]), return_tensors="pt", padding=True)
                enc = enc.to(model.device)
                # a causal LM's generate (GenerationMixin), which the PreTrainedModel annotation lacks
                ids = model.generate(  # pyright: ignore[reportCallIssue]
                    **enc,
                    max_new_tokens=self.max_new_tokens,
                    do_sample=sample,
                    temperature=self.temperature if sample else None,
                    top_k=None,
                    top_p=None,
                    pad_token_id=tokenizer.pad_token_id,
                )
                out += tokenizer.batch_decode(ids[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        return out

    def judge(self, asks: Sequence[str]) -> list[RewardResult | Exception]:
        return [_read(self.verdicts, v) for v in self.generate(asks)]


class EndpointJudge(_Judge):
    """An OpenAI-compatible chat endpoint as judge: the ``batch_fn`` of an inline domain (it waits on the
    network, and its client bounds its own time)."""

    def __init__(self, url: str, verdicts: Verdicts, *, model_name: str | None, api_key_env: str | None,
                 max_new_tokens: int, temperature: float, timeout_s: float, retries: int, backoff_s: float,
                 max_concurrency: int) -> None:  # fmt: skip
        self.url = url.rstrip("/") + "/chat/completions"
        self.verdicts, self.model_name, self.api_key_env = verdicts, model_name, api_key_env
        self.max_new_tokens, self.temperature = max_new_tokens, temperature
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self.max_concurrency = max_concurrency

    def __repr__(self) -> str:
        return f"EndpointJudge({self.url})"

    def _verdict(self, ask: str, deadline: float) -> RewardResult | Exception:
        body = {
            "messages": [{"role": "user", "content": ask}],
            "temperature": self.temperature,
            "max_tokens": self.max_new_tokens,
        }
        if self.model_name:
            body["model"] = self.model_name
        key = os.environ.get(self.api_key_env, "") if self.api_key_env else ""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        try:
            reply = post_json(self.url, body, headers, self.timeout_s, self.retries, self.backoff_s, deadline)
            text = reply["choices"][0]["message"]["content"]
            if not isinstance(text, str):
                raise TypeError
        except RemoteRewardError as e:
            return e
        except (KeyError, IndexError, TypeError):
            return ValueError(f"{self.url} answered without choices[0].message.content: {str(reply)[:200]!r}")
        return _read(self.verdicts, text)

    def judge(self, asks: Sequence[str]) -> list[RewardResult | Exception]:
        deadline = time.monotonic() + total_bound(self.timeout_s, self.retries, self.backoff_s)  # the whole batch's
        with ThreadPoolExecutor(max_workers=max(1, min(self.max_concurrency, len(asks)))) as pool:
            return list(pool.map(self._verdict, asks, [deadline] * len(asks)))


def _read(verdicts: Verdicts, text: str) -> RewardResult | Exception:
    try:
        return verdicts.read(text)
    except ValueError as e:
        return e


def _check(entry: Mapping[str, Any], at: str) -> None:
    template = entry["template"]
    if not isinstance(template, str) or not template.strip():
        raise ConfigError(f"{at}.template: give the judge's prompt, with fields {{prompt}}, {{response}} ...")
    try:
        fields = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as e:
        raise ConfigError(f"{at}.template: {e} (a literal brace is written {{{{ or }}}})") from None
    unknown = sorted(fields - _FIELDS)
    if unknown:
        allowed = ", ".join(sorted(_FIELDS))
        raise ConfigError(f"{at}.template: unknown field(s) {', '.join(unknown)}; it may use {allowed}")
    if entry["parser"] not in ("label", "score"):
        raise ConfigError(f"{at}.parser={entry['parser']!r}: expected label or score")
    labels = entry["labels"]
    if entry["parser"] == "label" and (
        not isinstance(labels, Mapping) or not labels or not all(isinstance(v, (int, float)) for v in labels.values())
    ):
        raise ConfigError(f"{at}.labels={labels!r}: expected {{label: score}}, e.g. {{yes: 1.0, no: 0.0}}")
    low_high = entry["score_range"]
    if not isinstance(low_high, Sequence) or len(low_high) != 2 or not low_high[0] < low_high[1]:
        raise ConfigError(f"{at}.score_range={low_high!r}: expected [low, high] with low < high")
    Entries.whole(entry, at, ["max_new_tokens", "batch_size", "threads", "max_concurrency"])
    Entries.whole(entry, at, ["retries"], least=0)
    if not isinstance(entry["temperature"], (int, float)) or entry["temperature"] < 0:
        raise ConfigError(f"{at}.temperature={entry['temperature']!r}: expected 0 (greedy) or more")
    Entries.seconds(entry, at, ["timeout_s"])
    Entries.seconds(entry, at, ["backoff_s"], zero=True)


def judge_models(value: Any, where: str = "reward.judge") -> list[tuple[str, str]]:
    """``(config key, directory)`` of each local judge of ``reward.judge`` (an endpoint has none), for the checks
    ``armor run`` makes at start (``loop.preflight.check_reward_models``)."""
    entries = Entries(value, where, _ALL_DEFAULTS, [], [])
    return [(f"{at}.model", str(entry["model"])) for at, entry in entries if entry["model"] is not None]


def load_judges(value: Any, known: Sequence[str], where: str = "reward.judge") -> tuple[dict, dict]:
    """The domains of ``reward.judge`` (a mapping or a list): ``({domain: RewardDomain}, {data_source: domain})``.

    :raises ConfigError: naming the entry and the key."""
    from armor_core.models.loading import resolve_model_path

    entries = Entries(value, where, _ALL_DEFAULTS, [], known)
    for at, entry in entries:
        if (entry["model"] is None) == (entry["url"] is None):
            raise ConfigError(f"{at}: give exactly one of 'model' (a local directory) and 'url' (an endpoint)")
        if entry["placement"] not in PLACEMENTS or entry["url"] is not None and entry["placement"] != "pool":
            raise ConfigError(
                f"{at}.placement={entry['placement']!r}: expected pool or worker (a local model's; an endpoint "
                "is its own worker)"
            )
        _check(entry, at)
        verdicts = Verdicts(
            entry["template"], entry["parser"], entry["labels"], entry["score_range"], bool(entry["scale"]),
            str(entry["rubric"]),
        )  # fmt: skip
        needs_truth = bool(entry["requires_ground_truth"])
        if entry["model"] is not None:
            try:
                path = str(resolve_model_path(str(entry["model"])))
            except Exception as e:
                raise ConfigError(f"{at}.model: {e}") from None
            local = LocalJudge(
                path, verdicts, max_new_tokens=entry["max_new_tokens"], temperature=float(entry["temperature"]),
                batch_size=entry["batch_size"], threads=entry["threads"],
            )  # fmt: skip
            domain = placed(local, entry["placement"], needs_truth, f"the judge model at {path}", at)
        else:
            if not str(entry["url"]).startswith(("http://", "https://")):
                raise ConfigError(f"{at}.url={entry['url']!r}: expected an http:// or https:// address")
            judge = EndpointJudge(
                str(entry["url"]), verdicts, model_name=entry["model_name"], api_key_env=entry["api_key_env"],
                max_new_tokens=entry["max_new_tokens"], temperature=float(entry["temperature"]),
                timeout_s=float(entry["timeout_s"]), retries=int(entry["retries"]), backoff_s=float(entry["backoff_s"]),
                max_concurrency=entry["max_concurrency"],
            )  # fmt: skip
            domain = RewardDomain(
                fn=judge,
                batch_fn=judge.score_batch,
                inline=True,  # waits on the network; the client bounds its own time
                score_range=None,
                requires_ground_truth=needs_truth,
                description=f"the judge at {entry['url']}",
            )
        entries.add(at, entry, domain)
    return entries.domains, entries.routes
