"""The loss terms and weights the actor adds beside the policy-loss plugin: the KL loss (``kl_loss``), the
distillation loss (``distill_loss``), the rollout-correction importance weights (``rollout_correction``)."""
