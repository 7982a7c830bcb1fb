"""Built-in reward domains that need no ground truth: ``format`` (structure) and ``length``."""
