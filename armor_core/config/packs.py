"""The reward domains ARMOR's own reward packs provide, by distribution, in one table: a run that names
one of them without its pack installed fails at start saying what to install
(``pip install armor-rewards-math``), not only that the name is unknown.

armor-rl itself scores its built-in tasks' default sources (``arithmetic``, ``format``, ``length``);
the ``facts`` task's ``multiple_choice`` and ``short_answer`` rows need armor-rewards-qa.
"""

from __future__ import annotations

__all__ = ["DOMAIN_PACKS", "missing_pack"]

#: reward domain -> the distribution that registers it (kept equal to the packs by tests/core/config/test_packs.py)
DOMAIN_PACKS: dict[str, str] = {
    "math": "armor-rewards-math",
    "gsm8k": "armor-rewards-math",
    "multiple_choice": "armor-rewards-qa",
    "short_answer": "armor-rewards-qa",
    "refusal": "armor-rewards-safety",
    "safety": "armor-rewards-safety",
    "code": "armor-rewards-code",
}


def missing_pack(domain: str, where: str) -> str | None:
    """The one-line error for ``domain``, named at ``where``, when a reward pack provides it; else None."""
    dist = DOMAIN_PACKS.get(domain)
    if dist is None:
        return None
    return (
        f"{where}: reward domain {domain!r} is provided by the reward pack {dist}, which is not installed: "
        f"pip install {dist}"
    )
