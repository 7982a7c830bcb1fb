"""Built-in reward domains: ``format`` (structure) and ``length``, which need no ground truth, and
``arithmetic``, the built-in task's exact integer answers, so that armor-rl scores its own default run."""
