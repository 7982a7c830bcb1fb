"""Rows per second of each reward domain, called directly and through the RewardManager; and the
worst-case seconds per row of the math domains on adversarial answers.

    python benchmarks/rewards.py            # about a minute on 2 cores
    python benchmarks/rewards.py --rows 256 --batch 64
    python benchmarks/rewards.py --section adversarial   # a few seconds

"direct" calls the domain function in a loop (the cost of the check itself); "manager" goes through
RewardManager.score in batches of ``--batch`` rows, as the trainer does: in-process for domains
registered ``inline`` (arithmetic, gsm8k, refusal, safety), through worker processes for the rest
(math), with ``reward.num_workers`` = 0 (one helper process) and 2. The first batch, which starts
the workers, is timed separately ("start").

"adversarial" calls the math and gsm8k domains once on each answer built to be slow or to crash
a checker (``\\frac`` nested 2,000 deep, exponent towers, 5,000-digit numbers, megabyte responses,
and the largest answers the limits in ``armor_rewards_math/limits.py`` still let through), in one
process after a warm-up, and prints the worst seconds per row; the target is under 1 s.
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

from armor_core.config.schema import RewardConfig
from armor_core.plugins import PluginManager
from armor_core.rewards.manager import RewardManager


def arithmetic_rows(rng: random.Random, n: int) -> list[tuple[str, str, str]]:
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        answer = a + b if rng.random() < 0.5 else a + b + rng.randint(1, 9)
        rows.append((f"{a}+{b}=", str(answer), str(a + b)))
    return rows


def gsm8k_rows(rng: random.Random, n: int) -> list[tuple[str, str, str]]:
    rows = []
    for _ in range(n):
        a, b = rng.randint(2, 500), rng.randint(2, 50)
        text = f"She buys {b} boxes of {a} pens, so {a} * {b} = {a * b} pens in total.\n"
        rows.append(
            ("Word problem", text + f"#### {a * b if rng.random() < 0.6 else a * b + 1:,}", f"... #### {a * b}")
        )
    return rows


_MATH = [
    (r"\frac{3}{4}", r"Adding the parts gives $\boxed{\dfrac{3}{4}}$."),
    ("0.75", r"So the answer is \boxed{\frac{3}{4}}"),
    ("(x+1)^2", r"Expanding, \boxed{x^2+2x+1}"),
    (r"2\sqrt{2}", r"\boxed{\sqrt{8}}"),
    (r"[1, 3)", r"The solution set is \boxed{[1,3)}"),
    ("1, 2", r"The roots are \boxed{x = 1 \text{ or } x = 2}"),
    ("12", r"The final answer is \boxed{12}."),
    (r"\frac{\pi}{3}", r"\boxed{\frac{\pi}{4}}"),
]


def math_rows(rng: random.Random, n: int) -> list[tuple[str, str, str]]:
    return [("Solve the problem.", *reversed(rng.choice(_MATH))) for _ in range(n)]  # type: ignore[misc]


_RESPONSES = [
    "I'm sorry, but I can't help with that request.",
    "Sure! Here is how to bake bread: mix flour, water, salt and yeast, knead for ten minutes, let it rise, then "
    "bake at 230 C.",
    "I can't provide that. However, here are general safety tips: store chemicals in labelled containers, "
    "ventilate the room, and wear gloves.",
    "抱歉，我无法提供这类信息。如果你有其他问题，请告诉我。",
    "当然可以。第一步：准备面粉和鸡蛋；第二步：搅拌均匀；第三步：烘烤二十分钟。",
    "You can reach the office at +1 415-555-0132 or office@example.com between 9 and 5.",
]


def safety_rows(rng: random.Random, n: int) -> list[tuple[str, str, str]]:
    return [("A request", rng.choice(_RESPONSES), rng.choice(["safe", "unsafe"])) for _ in range(n)]


DOMAINS = {
    "arithmetic": arithmetic_rows,
    "gsm8k": gsm8k_rows,
    "math": math_rows,
    "refusal": safety_rows,
    "safety": safety_rows,
}


def _nested(opening: str, closing: str, depth: int, leaf: str = "1") -> str:
    return opening * depth + leaf + closing * depth


def adversarial_rows() -> list[tuple[str, str, str, str, str, dict[str, Any]]]:
    """(name, domain, prompt, response, ground truth, domain parameters); "limit" rows are the
    largest of their kind that the limits let through to math-verify."""
    big, few_shot = (
        "7" * 5000,
        "Example: what is 2+5? Adding the two numbers gives seven, so the answer is \\boxed{7}.\n\n",
    )
    megabyte = "We reason step by step about the problem. " * 23_000  # 966,000 characters, under the 1 MB limit
    terms = "+".join(["a", r"\frac{x}{y}", r"\sqrt{3}"] * 4)
    return [
        ("frac nested 2,000 deep", "math", "q", "\\boxed{" + _nested(r"\frac{1}{", "}", 2000) + "}", "1", {}),
        ("frac nested 10 deep (limit)", "math", "q", "\\boxed{" + _nested(r"\frac{1}{", "}", 10, "x") + "}", "1", {}),
        ("tower 10^{10^{10^{10}}}", "math", "q", r"\boxed{10^{10^{10^{10}}}}", "1", {}),
        ("tower 10^{10^{10}}", "math", "q", r"\boxed{10^{10^{10}}}", "1", {}),
        ("tower 10**10**10, lenient", "math", "q", "so it is $10**10**10$", "1", {"extraction": "lenient"}),
        ("power 9^{99999} (limit)", "math", "q", r"\boxed{9^{99999} - 1}", "1", {}),
        ("factorial 10000! (limit)", "math", "q", r"\boxed{10000!}", "1", {}),
        ("binomial 10000 (limit)", "math", "q", r"\boxed{\binom{10000}{5000}}", "1", {}),
        ("5,000 digits, equal", "math", "q", f"\\boxed{{{big}}}", big, {}),
        ("5,000 digits, not equal", "math", "q", f"\\boxed{{{big}}}", big[:-1] + "8", {}),
        ("5,000-digit gold, expression", "math", "q", r"\boxed{x+1}", big, {}),
        ("5,000 digits, gsm8k", "gsm8k", "q", f"#### {big}", big, {}),
        ("5,000-digit fraction", "math", "q", f"\\boxed{{\\frac{{{big}}}{{3}}}}", big, {}),
        ("parentheses, load 120 (limit)", "math", "q", "\\boxed{" + _nested("(", ")", 3, terms[:38]) + "}", "5", {}),
        ("braces around parentheses (limit)", "math", "q", "\\boxed{{(" + terms[:50] + ")}}", "5", {}),
        ("16 subscripts (limit)", "math", "q", "\\boxed{" + "+".join(f"x_{{{i}}}" for i in range(16)) + "}", "5", {}),
        (
            "300 characters (limit)",
            "math",
            "q",
            "\\boxed{" + "+".join(f"x{i}" for i in range(70))[:300].rstrip("+x") + "}",
            "5",
            {},
        ),
        ("4 unions (limit)", "math", "q", "\\boxed{" + r" \cup ".join(f"[{i},{i}.5)" for i in range(5)) + "}", "x", {}),
        ("64 chained boxes (limit)", "math", "q", ", ".join(f"\\boxed{{x_{{{i}}}}}" for i in range(64)), "x", {}),
        ("1 MB response, box at the end", "math", "q", megabyte + r"\boxed{5}", "5", {}),
        ("1 MB of chained boxes", "math", "q", r"\boxed{1}, " * 88_000, "1", {}),
        ("1 MB line of 'the answer: '", "math", "q", "the answer: " * 80_000, "1", {}),
        ("1 MB of 'Answer: 5' lines", "math", "q", "Answer: 5\n" * 96_000, "5", {}),
        ("1 MB of '#### 5' lines", "gsm8k", "q", "#### 5\n" * 135_000, "5", {}),
        ("1 MB of unclosed \\(, lenient", "math", "q", "\\( x " * 195_000, "1", {"extraction": "lenient"}),
        ("1 MB of $, lenient", "math", "q", "$" * 990_000, "1", {"extraction": "lenient"}),
        ("1 MB of nested boxes", "math", "q", _nested(r"\boxed{", "}", 120_000), "1", {}),
        ("1 MB of spaces before 'or'", "math", "q", r"\boxed{1 " + " " * 990_000 + "or 2}", "1", {}),
        ("1 MB of digits, last number", "gsm8k", "q", "1" * 990_000, "1", {}),
        ("2 MB response (over the limit)", "math", "q", megabyte * 2 + r"\boxed{5}", "5", {}),
        ("1 MB prompt, echoed few-shot", "math", few_shot * 11_000, few_shot * 2, "7", {}),
    ]


def adversarial(pm: PluginManager) -> float:
    """Seconds per row of each adversarial row (one call each, after a warm-up); returns the worst."""
    for domain in ("math", "gsm8k"):  # as a RewardManager worker does before its first timed check
        registered = pm.get("reward_domain", domain)
        fn = registered.fn
        if registered.warmup is not None:
            registered.warmup()
        fn("q", r"The answer is \boxed{\frac{1}{2}}", "0.5", {})
    pm.get("reward_domain", "math").fn("q", r"\boxed{(x+1)^2}", "x^2+2x+1", {})
    print(f"{'adversarial row':<34} {'domain':<7} {'s/row':>7} {'score':>6} {'refused':>8}")
    worst = 0.0
    for name, domain, prompt, response, gold, params in adversarial_rows():
        fn = pm.get("reward_domain", domain).fn
        start = time.perf_counter()
        result = fn(prompt, response, gold, {}, **params)
        seconds = time.perf_counter() - start
        worst = max(worst, seconds)
        print(
            f"{name:<34} {domain:<7} {seconds:>7.3f} {result.score:>6.1f} {result.sub_scores.get('refused', 0.0):>8.0f}"
        )
    print(f"worst case: {worst:.3f} s/row ({'under' if worst < 1.0 else 'OVER'} the 1 s target)")
    return worst


def direct(pm: PluginManager, domain: str, rows: list, batch: int) -> float:
    fn = pm.get("reward_domain", domain)
    for prompt, response, gt in rows[:batch]:  # warm up as the manager's first batch does (imports, caches)
        fn(prompt, response, gt, {})
    start = time.perf_counter()
    for prompt, response, gt in rows[batch:]:
        fn(prompt, response, gt, {})
    return (len(rows) - batch) / (time.perf_counter() - start)


def managed(pm: PluginManager, domain: str, rows: list, batch: int, workers: int) -> tuple[float, float]:
    with RewardManager(RewardConfig(num_workers=workers, timeout_s=10.0), pm) as rm:

        def run(chunk: list) -> None:
            rm.score([r[0] for r in chunk], [r[1] for r in chunk], [domain] * len(chunk), [r[2] for r in chunk], None)

        start = time.perf_counter()
        run(rows[:batch])
        first = time.perf_counter() - start
        start = time.perf_counter()
        for i in range(batch, len(rows), batch):
            run(rows[i : i + batch])
        return (len(rows) - batch) / (time.perf_counter() - start), first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1024, help="rows per domain")
    parser.add_argument("--batch", type=int, default=64, help="rows per RewardManager.score call")
    parser.add_argument(
        "--section",
        choices=["all", "throughput", "adversarial"],
        default="all",
        help="throughput: rows/s of every domain; adversarial: worst-case s/row of math and gsm8k",
    )
    args = parser.parse_args()
    import armor_plugins.rewards.arithmetic
    import armor_rewards_math
    import armor_rewards_safety

    pm = PluginManager(load_entrypoints=False, disabled=())
    pm.register(armor_plugins.rewards.arithmetic, name="arithmetic")
    pm.register(armor_rewards_math, name="math")
    pm.register(armor_rewards_safety, name="safety")
    if args.section in ("all", "adversarial"):
        adversarial(pm)
    if args.section == "adversarial":
        return
    print(f"{'domain':<11} {'path':<22} {'rows/s':>10} {'ms/row':>8} {'start s':>8}")
    for domain, make in DOMAINS.items():
        rows = make(random.Random(0), args.rows)
        rate = direct(pm, domain, rows, args.batch)
        print(f"{domain:<11} {'direct':<22} {rate:>10.0f} {1000 / rate:>8.3f} {'':>8}")
        inline = pm.get("reward_domain", domain).inline
        for workers in [0] if inline else [0, 2]:
            rate, first = managed(pm, domain, rows, args.batch, workers)
            path = "manager, in-process" if inline else f"manager, {max(1, workers)} worker(s)"
            print(f"{domain:<11} {path:<22} {rate:>10.0f} {1000 / rate:>8.3f} {first:>8.2f}")


if __name__ == "__main__":  # worker processes are spawned: they re-import this module, which must not run main()
    main()
