"""The supervised trainers the CLI calls: ``sft`` (``armor sft``: response-only loss on prompt/response pairs or
multi-turn traces, ``sft_traces``; held-out accuracy by exact match or a reward domain, ``sft_reward``) and
``reward_model`` (``armor rm train``: Bradley-Terry on preference pairs, LoRA, data-parallel ranks). ``jsonl``
reads the commands' JSONL files; ``steps`` holds what both trainers are built from (batches, padding, evaluation
mode, the clipped optimizer step, the directory written). They sit beside ``loop`` in the layers: they use the
workers' schedule and collectives, the models and the reward pool, never the RL loop.
"""
