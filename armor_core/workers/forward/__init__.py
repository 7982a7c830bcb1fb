"""The forward passes' math: response log-probs (``logprobs``) in a padded, packed or grouped layout
(``layouts``, ``prompt_groups``), and the chunked LM head (``lm_head``)."""
