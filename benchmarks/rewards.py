"""Rows per second of each reward domain, called directly and through the RewardManager.

    python benchmarks/rewards.py            # about a minute on 2 cores
    python benchmarks/rewards.py --rows 256 --batch 64

"direct" calls the domain function in a loop (the cost of the check itself); "manager" goes through
RewardManager.score in batches of ``--batch`` rows, as the trainer does: in-process for domains
marked ``armor_inline`` (arithmetic, gsm8k, refusal, safety), through worker processes for the rest
(math), with ``reward.num_workers`` = 0 (one helper process) and 2. The first batch, which starts
the workers, is timed separately ("start").
"""

from __future__ import annotations

import argparse
import random
import time

from armor_core.config import RewardConfig
from armor_core.plugins import PluginManager
from armor_core.rewards import RewardManager


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
        rows.append(("Word problem", text + f"#### {a * b if rng.random() < 0.6 else a * b + 1:,}", f"... #### {a * b}"))
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
    "Sure! Here is how to bake bread: mix flour, water, salt and yeast, knead for ten minutes, let it rise, then bake at 230 C.",
    "I can't provide that. However, here are general safety tips: store chemicals in labelled containers, ventilate the room, and wear gloves.",
    "抱歉，我无法提供这类信息。如果你有其他问题，请告诉我。",
    "当然可以。第一步：准备面粉和鸡蛋；第二步：搅拌均匀；第三步：烘烤二十分钟。",
    "You can reach the office at +1 415-555-0132 or office@example.com between 9 and 5.",
]


def safety_rows(rng: random.Random, n: int) -> list[tuple[str, str, str]]:
    return [("A request", rng.choice(_RESPONSES), rng.choice(["safe", "unsafe"])) for _ in range(n)]


DOMAINS = {"arithmetic": arithmetic_rows, "gsm8k": gsm8k_rows, "math": math_rows, "refusal": safety_rows, "safety": safety_rows}


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
    args = parser.parse_args()
    import armor_rewards_math
    import armor_rewards_safety

    pm = PluginManager(load_entrypoints=False, disabled=())
    pm.register(armor_rewards_math, name="math")
    pm.register(armor_rewards_safety, name="safety")
    print(f"{'domain':<11} {'path':<22} {'rows/s':>10} {'ms/row':>8} {'start s':>8}")
    for domain, make in DOMAINS.items():
        rows = make(random.Random(0), args.rows)
        rate = direct(pm, domain, rows, args.batch)
        print(f"{domain:<11} {'direct':<22} {rate:>10.0f} {1000 / rate:>8.3f} {'':>8}")
        inline = getattr(pm.get("reward_domain", domain).fn, "armor_inline", False)
        for workers in ([0] if inline else [0, 2]):
            rate, first = managed(pm, domain, rows, args.batch, workers)
            path = "manager, in-process" if inline else f"manager, {max(1, workers)} worker(s)"
            print(f"{domain:<11} {path:<22} {rate:>10.0f} {1000 / rate:>8.3f} {first:>8.2f}")


if __name__ == "__main__":  # worker processes are spawned: they re-import this module, which must not run main()
    main()
