"""Models and tokenizers from local directories (``loading``) and LoRA adapters on them (``lora``).

Public: a rollout backend may import ``armor_core.models.lora`` to receive merged LoRA weights.
"""
