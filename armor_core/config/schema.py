"""The run configuration: typed dataclasses, every field with help text, loaded with omegaconf.

``load_config(path, overrides)`` merges, in order: the defaults below, the YAML file, then
``key.sub=value`` overrides. Everything a user can get wrong is checked here, before any process
starts: unknown keys (with the nearest valid key), wrong types, values out of range, NaN and
infinity in any numeric field (NaN anywhere, also inside keyword dicts), lists of the wrong length
or item type, and plugin names no installed plugin provides (with the available names).

Field names follow verl where verl has one (``algorithm.adv_estimator``, ``actor.clip_ratio_low``,
``rollout.n``), so its users read an ARMOR config without a glossary.

Long module: the sections' dataclasses are the config's one declaration, with help text on every field (what
``armor run --help-config`` and the docs print); split, the fields of one run would be read across files.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, InterpolationResolutionError, OmegaConfBaseException, ValidationError

from armor_core.config.fields import first_problem
from armor_core.config.written import remember
from armor_core.errors import ConfigError

__all__ = ["ArmorConfig", "ConfigError", "load_config", "to_yaml", "help_for"]


def f(default: Any = dataclasses.MISSING, help: str = "", *, factory: Any = None, **check: Any) -> Any:
    """A config field with help text and optional checks: ranges (``ge``, ``gt``, ``le``, ``lt``),
    ``choices``; for a list, ``length``, ``item`` (the items' type: ``float`` takes ints too) and
    ``item_range`` (a dict of ranges every item must satisfy)."""
    meta = {"help": help, **check}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class ModelConfig:
    path: str = f(
        "builtin:arithmetic-tiny",
        "Local Hugging Face causal-LM directory, or builtin:NAME for a model shipped with ARMOR: "
        "builtin:arithmetic-tiny, builtin:code-ops-tiny, builtin:cross-domain-tiny, builtin:moe-tiny (DeepSeek-V3's "
        "mixture-of-experts architecture) and builtin:spell-backward-tiny (recipe:reasoning_gym) have no chat template "
        "(prompts are plain text; a multi-turn observation is its text between newlines); "
        "builtin:tools-tiny has an append-only chat template (chat-message prompts, tool results as "
        "<|tool|>...<|assistant|>), as recipe:tools uses it. Nothing is downloaded.",
    )
    tokenizer_path: str | None = f(None, "Tokenizer directory when it differs from model.path.")
    trust_remote_code: bool = f(
        False,
        "Allow running Python code from the model directory (its config.json's auto_map) to load it. Off: such "
        "a directory loads with transformers' own classes when its model_type has them, else it is refused.",
    )
    dtype: str = f(
        "float32",
        "Compute dtype. bfloat16 is mixed precision: float32 master weights and optimizer state, bfloat16 matmuls "
        "(autocast; FSDP2's MixedPrecisionPolicy with float32 gradient reductions), log-probs and losses in "
        "float32. float16 would need loss scaling, which ARMOR does not do: use bfloat16.",
        choices=["float32", "bfloat16"],
    )
    gradient_checkpointing: bool = f(False, "Recompute activations in backward to save memory.")
    lora_rank: int = f(
        0,
        "LoRA rank of the actor's adapters (peft); 0 trains every weight. With LoRA only the adapters train and "
        "sit in the optimizer, the reference policy is the model with its adapters switched off (no second copy), "
        "and checkpoints hold the adapter.",
        ge=0,
    )
    lora_alpha: float = f(16.0, "LoRA scaling numerator: adapters add (lora_alpha / lora_rank) * B A.", gt=0.0)
    lora_dropout: float = f(0.0, "Dropout on the adapters' input during training.", ge=0.0, lt=1.0)
    lora_target_modules: Any = f(
        "all-linear",
        "Modules that get adapters: 'all-linear' (every linear layer of the decoder, not the output head) or a "
        "list of module names, e.g. [q_proj, v_proj].",
    )


@dataclass
class DataConfig:
    task: str | None = f(
        "arithmetic",
        "Built-in task (a registered `task` plugin: arithmetic, facts, reasoning_gym, or mix for several at once) "
        "used when train_files is empty.",
    )
    task_kwargs: dict = f(help="Extra keyword arguments for the task's generator.", factory=dict)
    train_size: int = f(4096, "Rows generated for the train split of a built-in task.", ge=1)
    val_size: int = f(500, "Rows generated for the held-out split of a built-in task (never seen in training).", ge=1)
    train_files: list = f(
        help="JSONL or Parquet files of rows {prompt, data_source, ground_truth, ...}.", factory=list, item=str
    )
    val_files: list = f(help="Held-out JSONL or Parquet files for validation.", factory=list, item=str)
    train_batch_size: int = f(16, "Prompts per step (each is sampled rollout.n times).", ge=1)
    max_prompt_length: int = f(64, "Prompt tokens allowed; see truncation.", ge=1)
    truncation: str = f(
        "drop",
        "What to do with a longer prompt: drop it (counted) or cut its left part, or error.",
        choices=["drop", "left", "error"],
    )
    shuffle: bool = f(True, "Shuffle the training rows each epoch (seeded by trainer.seed).")
    skip_invalid: bool = f(False, "Skip and count malformed rows instead of stopping with an error.")
    prompt_key: str = f("prompt", "Row field that holds the prompt (text or a list of chat messages).")
    apply_chat_template_kwargs: dict = f(
        help="Keyword arguments for the tokenizer's chat template when prompts are chat messages, e.g. "
        "{enable_thinking: false} for Qwen3.",
        factory=dict,
    )


@dataclass
class MultiTurnConfig:
    enable: bool = f(
        False,
        "Multi-turn rollouts: each response is an episode of assistant turns and environment observations "
        "(tool results); observation tokens are masked out of every loss.",
    )
    environment: str = f("tools", "The environment (a registered `environment` plugin) built per episode from its row.")
    environment_kwargs: dict = f(
        help="Keyword arguments for the environment, e.g. {tools: ['my_pkg.tools:lookup']} for `tools`.", factory=dict
    )
    max_turns: int = f(4, "Assistant turns per episode at most.", ge=1)
    max_response_tokens: int = f(
        64,
        "Token budget of a whole episode (sampled and observation tokens); each turn samples at most "
        "rollout.max_new_tokens of it.",
        ge=1,
    )
    max_observation_tokens: int = f(
        64,
        "Longer observations are cut to this many tokens, with a visible '...[truncated]' marker. Counted as "
        "appended: the chat template's role markers and wrapping around the content are included "
        "(e.g. <|im_end|>, <|im_start|>user and <tool_response> tags, about 10 tokens with Qwen's template); "
        "counted as env/observations_truncated.",
        ge=1,
    )
    max_tool_calls_per_turn: int = f(
        4,
        "Tool calls run per assistant turn at most (passed to environments that take it); the rest get an error.",
        ge=1,
    )
    parser: str = f("hermes", "How tool calls are read from a turn (passed to environments that take it).")
    step_timeout_s: float = f(
        60.0, "An environment's reset or step that takes longer ends its episode (counted as env_timeout).", gt=0.0
    )
    reward_on: str = f(
        "final",
        "What the reward domains score: the final assistant turn, or the whole transcript (observations included).",
        choices=["final", "transcript"],
    )


@dataclass
class RolloutConfig:
    backend: str = f("hf", "Rollout backend (a registered `rollout_backend` plugin): hf or vllm.")
    n: int = f(8, "Samples per prompt (the GRPO group size).", ge=1)
    temperature: float = f(1.0, "Sampling temperature.", ge=0.0)
    top_p: float = f(1.0, "Nucleus sampling mass.", gt=0.0, le=1.0)
    top_k: int = f(0, "Top-k sampling; 0 disables it.", ge=0)
    sampling_replay: bool = f(
        True,
        "With top_p < 1 or top_k > 0: the rollout records the set of tokens it sampled each token from, and the "
        "trainer computes every log-prob it compares with the rollout's over that set (renormalised), so the "
        "importance ratio carries no kept-mass bias. false: the trainer scores over the whole vocabulary "
        "(rollout/logprob_diff_mean then shows the gap). See docs/off-policy.md.",
    )
    replay_max_kept: int = f(
        256,
        "With sampling_replay and top_p < 1 (or top_k > 0; always on vllm): the most tokens a kept set may hold; "
        "sampling keeps at most this many (top_k is this when unset, and may not be larger), which bounds the "
        "recorded sets' size (rows x response tokens x this many int32 ids).",
        ge=1,
    )
    routing_replay: bool = f(
        False,
        "Mixture-of-experts policies: the rollout records the experts every token was routed to and the actor's "
        "forwards (old log-probs, the update) route it to the same ones, with weights from the router's own logits "
        "(R3), so a router tie broken differently by the trainer no longer changes a token's log-prob. hf backend, "
        "single-turn. See docs/off-policy.md.",
    )
    per_sample_seeds: bool = f(
        True,
        "Each training sample draws its tokens from a seed of its own, mixed from trainer.seed, the epoch, the row and "
        "its sample index, so a row's samples are the same whatever the micro-batch size, rollout worker count or "
        "mode (multi-turn turns and dynamic sampling included). false: one generator per worker for the whole batch "
        "(the sampling of ARMOR before 2026-12-07). See docs/off-policy.md.",
    )
    max_new_tokens: int = f(8, "Maximum response tokens.", ge=1)
    micro_batch_size: int = f(256, "Prompts per generate call.", ge=1)
    backend_kwargs: dict = f(help="Extra keyword arguments for the rollout backend.", factory=dict)
    mode: str = f(
        "sync",
        "sync: the actor workers generate (colocated) and train in turn. async: rollout.num_workers rollout "
        "workers of their own generate ahead while the actor trains, with weights at most rollout.max_staleness "
        "updates old (pair with algorithm.rollout_correction).",
        choices=["sync", "async"],
    )
    num_workers: int = f(
        1, "Rollout workers in async mode (each pinned to cores of its own); prompts are split over them.", ge=1
    )
    max_staleness: int = f(
        1,
        "Async mode: a batch is trained on only if the policy that generated it is at most this many updates old; "
        "this many batches are generated ahead. 0 generates each batch with the newest weights (no overlap).",
        ge=0,
    )
    verify_sync: bool = f(
        True,
        "After every weight sync to a rollout engine with weights of its own (vllm, FSDP2, async workers), check "
        "that it holds what was sent (sums of a strided sample of every tensor, in the engine's dtype); a mismatch "
        "stops the run naming the tensors. Its cost is perf/verify_sync_s.",
    )
    sync_bucket_mb: int = f(
        512,
        "A weight sync to an engine with weights of its own (vllm, an hf copy) sends the policy in buckets of at most "
        "this many MB (a larger tensor alone); under FSDP2 each bucket is gathered from the shards and freed once "
        "sent, so a rank holds one bucket of full tensors, never the whole model.",
        ge=1,
    )
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)


@dataclass
class ActorConfig:
    lr: float = f(5e-5, "Learning rate (AdamW).", gt=0.0)
    weight_decay: float = f(0.0, "AdamW weight decay.", ge=0.0)
    betas: list = f(
        help="AdamW betas: [beta1, beta2], each in [0, 1).",
        factory=lambda: [0.9, 0.999],
        length=2,
        item=float,
        item_range={"ge": 0.0, "lt": 1.0},
    )
    warmup_steps: int = f(0, "Linear learning-rate warm-up steps.", ge=0)
    lr_schedule: str = f("constant", "Learning-rate schedule after warm-up.", choices=["constant", "cosine", "linear"])
    grad_clip: float = f(1.0, "Clip the global gradient norm to this value; 0 disables it.", ge=0.0)
    ppo_epochs: int = f(1, "Passes over each batch.", ge=1)
    ppo_mini_batch_size: int = f(
        16, "Prompts per optimizer step (x rollout.n rows); equal to train_batch_size means one update per batch.", ge=1
    )
    micro_batch_size: int = f(
        64, "Rows per forward/backward on one worker (gradient accumulation); see max_tokens_per_micro_batch.", ge=1
    )
    max_tokens_per_micro_batch: int | None = f(
        None,
        "Form micro-batches by real token count (prompt + response) instead of rows: consecutive rows while their "
        "tokens fit in this budget (verl's dynamic batch size); micro_batch_size is then not used. Applies to the "
        "update and the log-prob passes. The loss and gradients are those of any other split (the aggregation "
        "divides by global counts). Must hold the longest possible row: data.max_prompt_length + "
        "rollout.max_new_tokens.",
        ge=1,
    )
    logprob_chunk_tokens: int = f(
        512,
        "Tokens per block through the LM head when computing log-probs and entropy: the (tokens x vocabulary) "
        "logits are never held whole, forward or backward (each block is recomputed in backward). 0 takes the "
        "model's full logits (the plain path).",
        ge=0,
    )
    offload: bool = f(
        False,
        "FSDP2 CPU offload (GPU runs, actor.strategy=fsdp2): parameter, gradient and optimizer-state shards live "
        "in CPU memory and are copied to the GPU around each use; the optimizer steps on the CPU.",
    )
    policy_loss: str = f("ppo_clip", "Policy loss (a registered `policy_loss` plugin).")
    policy_loss_kwargs: dict = f(help="Extra keyword arguments for the policy loss.", factory=dict)
    clip_ratio_low: float = f(0.2, "PPO clip range below 1 (eps_low).", ge=0.0)
    clip_ratio_high: float = f(
        0.2, "PPO clip range above 1 (eps_high); > clip_ratio_low is DAPO's clip-higher.", ge=0.0
    )
    clip_ratio_c: float = f(3.0, "Dual-clip bound for negative advantages (must be > 1).", gt=1.0)
    loss_agg_mode: str = f("token-mean", "Loss aggregation (a registered `loss_aggregation` plugin).")
    loss_norm_constant: float | None = f(
        None, "Constant normaliser for seq-mean-token-sum-norm; default: rollout.max_new_tokens.", gt=0.0
    )
    entropy_coeff: float = f(0.0, "Entropy bonus coefficient.", ge=0.0)
    skip_zero_advantage: bool = f(
        True,
        "Do not forward rows whose advantages are all 0 (e.g. GRPO groups that all scored the same) when that "
        "cannot change the gradient: no entropy bonus, no KL loss, a policy loss that is 0 at advantage 0. Their "
        "share of actor/entropy is estimated from the rollout log-probs.",
    )
    use_kl_loss: bool = f(False, "Add KL(policy || reference) to the loss (GRPO style).")
    kl_loss_coef: float = f(0.001, "Coefficient of the KL loss.", ge=0.0)
    kl_loss_type: str = f("k3", "KL estimator for the KL loss (a registered `kl_estimator` plugin).")
    num_workers: int = f(
        1, "Data-parallel actor processes (one update over all of them equals one process on the same batch).", ge=1
    )
    strategy: str = f(
        "ddp",
        "Data-parallel strategy of the actor and critic groups: ddp (every rank holds the whole model) or fsdp2 "
        "(fully_shard per decoder layer: parameters, gradients and optimizer state sharded). gloo on CPU, NCCL on "
        "GPU.",
        choices=["ddp", "fsdp2"],
    )
    fsdp_generation: str = f(
        "shards",
        "Under fsdp2 on several ranks, what the hf rollout generates from. shards: the sharded policy itself, every "
        "rank in step (each forward gathers one layer at a time; a rank whose rows are done runs on until all are), "
        "so no rank holds the whole model. copy: a full float32 copy per rank, refreshed after every update (no "
        "gathers while decoding, one model of memory more per rank). LoRA, multi-turn and async rollouts and other "
        "backends use the copy.",
        choices=["shards", "copy"],
    )
    checkpoint_format: str = f(
        "auto",
        "How the actor and critic write model and optimizer state into a checkpoint. full: gathered to rank 0, the "
        "model as a Hugging Face directory (checkpoints/step_N/model). sharded: torch.distributed.checkpoint, each "
        "rank writing its own shards in parallel, nothing gathered (actor_shards/, critic_shards/; `armor export` "
        "turns one into a Hugging Face directory). Either resumes on any number of ranks. auto: sharded under "
        "fsdp2 with more than one rank, full otherwise. A LoRA run always writes its adapter (full).",
        choices=["auto", "full", "sharded"],
    )


@dataclass
class CriticConfig:
    lr: float = f(1e-4, "Critic learning rate.", gt=0.0)
    cliprange_value: float = f(0.5, "Value clipping range around the old values.", ge=0.0)
    grad_clip: float = f(1.0, "Critic gradient-norm clip; 0 disables it.", ge=0.0)
    ppo_epochs: int = f(1, "Critic passes over each batch.", ge=1)
    micro_batch_size: int = f(64, "Rows per critic forward/backward.", ge=1)
    max_tokens_per_micro_batch: int | None = f(
        None,
        "Critic micro-batches by real token count, as actor.max_tokens_per_micro_batch; default: the actor's.",
        ge=1,
    )
    num_workers: int | None = f(
        None, "Data-parallel critic processes (strategy: actor.strategy); default: actor.num_workers.", ge=1
    )


@dataclass
class DistillConfig:
    teacher: str | None = f(
        None,
        "On-policy distillation: a teacher model (a local Hugging Face causal-LM directory or builtin:NAME, the "
        "student's tokenizer) scores the student's sampled responses on a worker group of its own; None: off.",
    )
    mode: str = f(
        "reverse_kl",
        "reverse_kl: per token log p_student(y_t) - log p_teacher(y_t) on the sampled tokens, as a reward or a loss "
        "(distill.via). topk_forward_kl: a loss term sum_k p_T (log p_T - log p_S) over the teacher's top-k tokens "
        "at each response position (the teacher's renormalised over the k: distill.renormalize).",
        choices=["reverse_kl", "topk_forward_kl"],
    )
    k: int = f(8, "topk_forward_kl: the teacher's most likely tokens per position the loss sums over.", ge=1)
    coef: float = f(1.0, "Weight of the distillation signal (the reward's or the loss term's).", ge=0.0)
    via: str = f(
        "reward",
        "reverse_kl only: reward adds -coef * the per-token estimate to the token-level rewards before the "
        "advantages (as the KL-in-reward penalty); loss adds coef * its score-function term to the actor's loss "
        "(each token's estimate is its own advantage, no credit to earlier tokens). topk_forward_kl is always a loss.",
        choices=["reward", "loss"],
    )
    with_rewards: bool = f(
        True,
        "Keep the reward domains' scores in the token-level rewards beside the distillation signal; false: the "
        "advantage comes from the distillation signal alone (the domains still score rows, for the metrics).",
    )
    renormalize: bool = f(
        True,
        "topk_forward_kl: renormalise the teacher's top-k probabilities to sum to 1 over the k (the student's stay "
        "its full-vocabulary log-probs, so mass it leaves outside the k is penalised); false: the raw terms, the "
        "part of the full forward KL on those k ids.",
    )
    teacher_temperature: float | None = f(
        None,
        "Temperature of the teacher's log-probs; None: rollout.temperature, the student's. Below it, the student "
        "is pulled towards a sharper teacher (its modes).",
        gt=0.0,
    )
    num_workers: int = f(
        1, "Teacher workers (each pinned to cores and devices of its own); rows split over them.", ge=1
    )
    micro_batch_size: int = f(64, "Rows per teacher forward.", ge=1)


@dataclass
class AlgorithmConfig:
    adv_estimator: str = f("grpo", "Advantage estimator (a registered `advantage_estimator` plugin).")
    adv_kwargs: dict = f(help="Extra keyword arguments for the advantage estimator.", factory=dict)
    gamma: float = f(1.0, "Discount factor (GAE, REINFORCE++).", ge=0.0, le=1.0)
    lam: float = f(1.0, "GAE lambda.", ge=0.0, le=1.0)
    norm_adv_by_std: bool = f(True, "GRPO: divide by the group's standard deviation (False is Dr. GRPO).")
    use_kl_in_reward: bool = f(False, "Fold a KL penalty into the token-level reward (PPO style).")
    kl_penalty: str = f("k1", "KL estimator for the in-reward penalty (a registered `kl_estimator` plugin).")
    kl_ctrl_type: str = f(
        "fixed", "KL coefficient controller for the in-reward penalty.", choices=["fixed", "adaptive"]
    )
    kl_coef: float = f(0.001, "Initial KL coefficient of the in-reward penalty.", ge=0.0)
    kl_target: float = f(0.1, "Target KL of the adaptive controller.", gt=0.0)
    kl_horizon: int = f(10000, "Horizon of the adaptive controller.", ge=1)
    rollout_correction: str = f(
        "none",
        "Importance weights between the policy that generated the rows (rollout log-probs) and the trained one "
        "(old log-probs) on the per-token policy loss: tis_token / tis_seq truncate the token's / sequence's ratio "
        "at the cap, mask_token / mask_seq keep it up to the cap and drop the token / sequence beyond.",
        choices=["none", "tis_token", "tis_seq", "mask_token", "mask_seq"],
    )
    filter_groups: bool = f(
        False,
        "Dynamic sampling (DAPO): drop the groups whose scores all agree (no learning signal) and generate further "
        "batches until data.train_batch_size informative groups are collected, up to max_gen_batches; then train "
        "on what there is (warned, counted in dynamic_sampling/short_batch).",
    )
    max_gen_batches: int = f(
        4, "Most batches of data.train_batch_size prompts generated for one step under filter_groups.", ge=1
    )
    rollout_correction_cap: float = f(
        2.0, "The largest importance weight (tis_*) or ratio kept (mask_*) of algorithm.rollout_correction.", gt=0.0
    )
    distill: DistillConfig = field(default_factory=DistillConfig)


@dataclass
class RewardConfig:
    domain_map: dict = f(
        help="Map data_source -> reward domain name or {domain: weight}; unmapped sources use the domain of the "
        "same name.",
        factory=dict,
    )
    custom: list = f(
        help="Reward functions from files, verl's signature unchanged: [{path, name (compute_score), data_sources, "
        "domain (the file's stem), batched (false), kwargs, requires_ground_truth (true)}]; each is a domain that "
        "scores its data_sources in the reward pool (see armor_core/rewards/custom.py).",
        factory=list,
    )
    remote: Any = f(
        None,
        "A reward service over HTTP, OpenRLHF's remote reward model API: {url, data_sources, domain (remote), "
        "timeout_s (30), max_concurrency (4), batch_size (32), retries (3), backoff_s (1), headers, "
        "requires_ground_truth (false)}, or a list of them (see armor_core/rewards/remote.py).",
    )
    model: Any = f(
        None,
        "A classifier reward model (a local sequence-classification directory, e.g. from armor rm train): {path, "
        "data_sources, domain (rm), batch_size (32), max_length (2048), dtype (auto: bfloat16 on a GPU that has it, "
        "else float32), threads (1), normalize (false | true | {mean, std}), rule (a rule domain scored beside it at "
        "weight 0: reward/model_minus_rule), placement (pool | worker: a Ray worker of its own, isolated like the "
        "actor's), requires_ground_truth (false)}, or a list of them (see armor_core/rewards/model.py).",
    )
    judge: Any = f(
        None,
        "A generative judge: {model (a local causal LM) or url (an OpenAI-compatible endpoint; model_name, "
        "api_key_env), template (fields {prompt} {response} {ground_truth} {rubric}), parser (label | score), "
        "labels ({yes: 1, no: 0}), score_range, scale, max_new_tokens (32), temperature (0), data_sources, domain "
        "(judge), batch_size, timeout_s, retries, backoff_s, max_concurrency, placement (pool | worker, a local "
        "model's)}, or a list of them (see "
        "armor_core/rewards/judge.py).",
    )
    failure_score: float = f(0.0, "Score given when a domain raises or times out on a row.")
    timeout_s: float = f(10.0, "Hard time limit for scoring one row.", gt=0.0)
    num_workers: int = f(
        0,
        "Processes for reward domains that may hang (math); 0 starts one helper process on first use. Inline "
        "domains (arithmetic, gsm8k, refusal, safety) always score in the driver.",
        ge=0,
    )
    domain_kwargs: dict = f(help="Per-domain keyword arguments: {domain: {key: value}}.", factory=dict)
    max_failure_fraction: float = f(
        0.5,
        "Stop the run with an error when a domain fails (raises, times out, or scores outside its score_range) on "
        "more than this fraction of its rows over the last reward.failure_window scored batches; checkpoints "
        "already written are kept. 1 never stops.",
        ge=0.0,
        le=1.0,
    )
    failure_window: int = f(
        5,
        "Scored batches (one per training step, more under algorithm.filter_groups; a validation pass is one) over "
        "which reward.max_failure_fraction is measured, from the first batch on.",
        ge=1,
    )


@dataclass
class GuardConfig:
    enable: bool = f(True, "Run the StabilityGuard.")
    guards: list = f(
        help="Ordered guards: [{name, params}], or a bare name for a guard with its defaults. A list given here "
        "replaces the default stack, non_finite (skip a non-finite gradient, loss or reward) and trust_region (undo a "
        "step that moved the policy too far, in nats per token, and lower the learning rate), with expert_collapse "
        "added for a mixture-of-experts model (roll back when the experts' load entropy collapses).",
        factory=lambda: [{"name": "non_finite", "params": {}}, {"name": "trust_region", "params": {}}],
    )
    rollback_every: int = f(
        10,
        "Keep a rollback point at the first step and then every N steps whenever a configured guard may ask for a "
        "rollback (a guard's `actions` list it at stage reward, advantage, update or validation, or the guard "
        "declares no `actions`), so a rollback needs no trainer.save_freq: it restores the newest rollback point or "
        "checkpoint older than the verdict's `since`. Two points are kept. 0 keeps none: a rollback then needs a "
        "checkpoint.",
        ge=0,
    )
    rollback_store: str = f(
        "auto",
        "Where rollback points are kept: memory (each actor and critic rank copies its own weights, optimizer "
        "state, schedule and RNG to host memory, its shards under FSDP2), disk (<run_dir>/rollback/, written "
        "as a checkpoint is, never resumed from, removed when a run starts), or auto: memory when a point of one "
        "rank (trained weights and their optimizer state) is at most 2 GiB, else disk.",
        choices=["auto", "memory", "disk"],
    )


@dataclass
class EngineConfig:
    address: str | None = f(None, "Ray cluster to join ('auto' or host:port); default starts a local cluster.")
    connect_timeout_s: float = f(
        30.0, "Seconds to wait for the Ray cluster at engine.address to answer before giving up.", gt=0.0
    )
    num_cpus: int | None = f(None, "CPUs for a local Ray cluster; default: all.", ge=1)
    omp_wait_policy: str = f(
        "auto",
        "How the workers' OpenMP threads wait for work: active (spin; fastest on cores of their own), passive "
        "(sleep; far faster when another process shares the cores), or auto: passive if other processes keep a core "
        "busy when the run starts, else active.",
        choices=["auto", "active", "passive"],
    )
    cpus_per_worker: float | None = f(
        None,
        "Cores for each worker process (its torch thread count); default: this node's cores split evenly among the "
        "workers.",
        gt=0.0,
    )
    isolate: bool = f(
        True,
        "ProcessIsolator: pin each worker to cores (and GPUs) of its own and check no two share one (local clusters).",
    )
    gpus_per_worker: float = f(0.0, "GPUs reserved for each worker process.", ge=0.0)
    driver_threads: int = f(
        1,
        "Torch threads in the driver process (the trainer loop: rewards, advantages, metrics). Its tensors are "
        "small; more threads would spin on cores the workers own, slowing them (as verl's driver, a 1-CPU Ray "
        "actor, runs with one).",
        ge=1,
    )
    direct_channel: bool = f(
        True,
        "Send the driver's calls to each worker over a socket of its own instead of Ray's task path (between "
        "steps, a round trip with a 128-row batch each way took 2.0 ms instead of 4.6 ms on a 2-core CPU machine: "
        "benchmarks/dataproto_transfer.py). Ray still places, starts, watches and stops the workers.",
    )


@dataclass
class TrainerConfig:
    total_steps: int = f(250, "Training steps.", ge=0)
    total_epochs: int | None = f(None, "Stop after this many passes over the data, if reached first.", ge=1)
    # 32 bits: numpy's legacy global generator takes no more, and seed * 1000003 + step must fit torch's 64
    seed: int = f(1, "Seed for data order, sampling and initialisation.", ge=0, lt=2**32)
    run_dir: str = f("runs/default", "Where metrics, checkpoints and summaries are written.")
    save_freq: int = f(0, "Checkpoint every N steps; 0 saves only at the end.", ge=0)
    async_save: bool = f(
        False,
        "A sharded checkpoint's shards (actor.checkpoint_format) are written in the background: each rank copies its "
        "shards to host memory, the run goes on while a thread writes them, and the checkpoint becomes the latest "
        "(manifest, rename) once they are written, at the end of the next step at the latest, which waits for them "
        "if need be (timing_s/save_wait). Costs one host copy of a rank's shards while they are written. A full-form "
        "checkpoint, and the run's last, are written in the foreground.",
    )
    keep_checkpoints: int = f(2, "Checkpoints kept on disk (oldest removed first).", ge=1)
    resume: str = f(
        "never",
        "auto: a run whose run_dir holds an intact checkpoint continues from the latest one, as with --resume (the "
        "same check of the config against the run's config.json, the same fallback past a damaged newest "
        "checkpoint), and a run_dir without one starts at step 0; so a job killed by preemption and started again "
        "with the same command goes on where it stopped. Needs save_freq > 0. never: only --resume continues a run, "
        "and a run_dir holding checkpoints is refused without it.",
        choices=["never", "auto"],
    )
    allow_legacy_pt_state: bool = f(
        False,
        "With --resume: also read a checkpoint's worker states from torch .pt files (checkpoints written before ARMOR "
        "saved them as safetensors + JSON), with torch.load(weights_only=True), which unpickles tensors and containers "
        "only. Off, such a checkpoint is refused: nothing is unpickled unless asked for here.",
    )
    val_freq: int = f(50, "Validate every N steps; 0 validates only before and after training.", ge=0)
    val_before_train: bool = f(True, "Validate before the first step (the 'before' of the summary).")
    val_sampled: bool = f(False, "Also report sampled (temperature) accuracy in validation, besides greedy.")
    val_n: int = f(
        1,
        "Samples per held-out prompt at rollout.temperature; above 1, validation also reports mean@n, best@n (pass@n) "
        "and maj@n (majority vote) per data_source.",
        ge=1,
    )
    loggers: list = f(
        help="Metric trackers (registered `metric_tracker` plugins): console, jsonl, tensorboard; wandb and mlflow "
        "with their extras (pip install 'armor-rl[wandb]' / 'armor-rl[mlflow]').",
        factory=lambda: ["console", "jsonl", "tensorboard"],
        item=str,
    )
    project_name: str = f("armor", "Project the run is logged under: the wandb project, the MLflow experiment.")
    experiment_name: str = f("", "Run name in wandb and MLflow; empty: the run directory's name.")
    mlflow_tracking_uri: str = f(
        "",
        "Where the mlflow tracker logs (a server URL, database or directory); empty: MLFLOW_TRACKING_URI if set, "
        "else a file store in <run_dir>/mlruns.",
    )
    device: str = f("cpu", "Device for workers: cpu or cuda.", choices=["cpu", "cuda"])
    deterministic: bool = f(True, "Use deterministic torch kernels (same seed, same metrics).")
    overlap_generation: bool = f(
        True,
        "Generate the next step's rollout in the same worker call as this step's update: one round trip to the "
        "workers a step instead of two, and no idle worker while the driver reads the update's result. The workers "
        "run the same work in the same order, so results are unchanged; a rollback regenerates. Not done before a "
        "validation, a checkpoint, or the last step.",
    )
    faults: list = f(
        help="Fault injection for stability tests, a list of {kind, steps, value}. steps: the 1-based steps it "
        "strikes, a list ([3, 7]) or an inclusive range ({from: 3, to: 7}). Kinds and their value: nan_grad "
        "(a NaN in one gradient element; value: the rank, default every rank), lr_scale (the learning rate of "
        "those updates times value, required; actor/lr shows the rate used), flip_reward (score -> 1 - score; "
        "value: the fraction of rows flipped, in (0, 1], default all), random_reward (uniform scores), inf_reward "
        "(one row's score +Inf) (these two take no value), "
        "stale_rollout (samples from the weights of value updates ago, default 4), kill_worker (SIGKILL to the "
        "actor worker of rank value, default 0), lost_sync (the weight sync to an engine with weights of its own "
        "drops a tensor; no value). Details: armor_core/stability/faults.py.",
        factory=list,
    )


@dataclass
class ArmorConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)


# -- loading ------------------------------------------------------------------------------------


def _all_keys(cls: type = ArmorConfig, prefix: str = "") -> list[str]:
    keys = []
    for fld in dataclasses.fields(cls):
        key = f"{prefix}{fld.name}"
        keys.append(key)
        factory = fld.default_factory
        if isinstance(factory, type) and dataclasses.is_dataclass(factory):
            keys.extend(_all_keys(factory, key + "."))
    return keys


def _nearest(key: str) -> str:
    keys = _all_keys()
    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
    if not close:  # try the last component against every leaf name (e.g. 'lr' typed as 'actor.learning_rate')
        leaf = key.rsplit(".", 1)[-1]
        by_leaf = {k.rsplit(".", 1)[-1]: k for k in keys}
        close = [by_leaf[m] for m in difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.6)]
    return f" Did you mean '{close[0]}'?" if close else ""


def _friendly(e: OmegaConfBaseException, source: str) -> ConfigError:
    key = getattr(e, "full_key", None) or ""
    if isinstance(e, ConfigKeyError):
        return ConfigError(
            f"{source}: unknown config key '{key}'.{_nearest(key)} See `armor run --print-config` for every key."
        )
    if isinstance(e, ValidationError):
        msg = str(e).split("\n")[0]
        return ConfigError(f"{source}: invalid value for '{key}': {msg}")
    if isinstance(e, InterpolationResolutionError):
        return ConfigError(
            f"{source}: {key}: {str(e).splitlines()[0]}; a ${{...}} value must name another key (no cycle) or a set "
            "environment variable"
        )
    return ConfigError(f"{source}: {str(e).splitlines()[0]}")


def _check_ranges(cfg: ArmorConfig) -> None:
    problem = first_problem(cfg, ArmorConfig)
    if problem:
        raise ConfigError(problem)


def _check_semantics(cfg: ArmorConfig) -> None:
    """Checks that involve more than one field."""
    _check_sizes(cfg)
    _check_routing_replay(cfg)
    if cfg.algorithm.filter_groups and cfg.rollout.n < 2:
        raise ConfigError(
            f"algorithm.filter_groups=true needs groups: rollout.n={cfg.rollout.n} samples per prompt always agree "
            "with themselves; set rollout.n >= 2"
        )
    a = cfg.algorithm
    if not a.distill.teacher and not a.distill.with_rewards:
        raise ConfigError(
            "algorithm.distill.with_rewards=false drops the reward domains' scores for the teacher's signal, but "
            "algorithm.distill.teacher is not set, so the run would train on nothing; set algorithm.distill.teacher "
            "to a model directory (or builtin:NAME), or with_rewards back to true"
        )
    if a.rollout_correction.startswith("mask_") and a.rollout_correction_cap < 1:
        # an unchanged policy has ratio 1: a mask cap below 1 drops (nearly) every token and the run trains nothing
        raise ConfigError(
            f"algorithm.rollout_correction_cap={a.rollout_correction_cap} with algorithm.rollout_correction="
            f"{a.rollout_correction}: a mask mode drops each token (or sequence) whose ratio exceeds the cap, and "
            "the ratio of an unchanged policy is 1, so every token would be dropped; set the cap to 1 or more "
            "(default 2.0)"
        )
    targets = cfg.model.lora_target_modules
    if not (
        targets == "all-linear"
        or (isinstance(targets, (list, tuple)) and targets and all(isinstance(t, str) and t for t in targets))
    ):
        raise ConfigError(
            f"model.lora_target_modules={targets!r}: expected 'all-linear' or a non-empty list of module names, "
            "e.g. [q_proj, v_proj]"
        )
    repeated = sorted({str(x) for x in cfg.trainer.loggers if list(cfg.trainer.loggers).count(x) > 1})
    if repeated:
        raise ConfigError(
            f"trainer.loggers={list(cfg.trainer.loggers)} names {', '.join(repeated)} more than once; each tracker "
            "would write every row again. Name each tracker once"
        )
    _check_auto_resume(cfg)
    if not cfg.data.train_files and not cfg.data.task:
        raise ConfigError("no training data: set data.train_files (JSONL/Parquet) or data.task (a built-in task)")
    from armor_core.stability.faults import parse_faults

    try:
        parse_faults(cfg.trainer.faults)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    for i, g in enumerate(cfg.guard.guards):
        if isinstance(g, str) and g:  # a bare name: the guard with its defaults
            g = cfg.guard.guards[i] = {"name": g, "params": {}}
        if not isinstance(g, (dict, DictConfig)) or "name" not in g:
            raise ConfigError(
                f"guard.guards[{i}]={g!r}: each guard is a name (non_finite) or {{name: ..., params: {{...}}}}"
            )
        extra = set(g) - {"name", "params"}
        if extra:
            raise ConfigError(f"guard.guards[{i}] has unknown keys {sorted(extra)}; allowed: name, params")


def _check_routing_replay(cfg: ArmorConfig) -> None:
    """Routing replay is recorded by the hf backend, one turn at a time."""
    r = cfg.rollout
    if r.routing_replay and (r.backend != "hf" or r.multi_turn.enable):
        where = f"rollout.backend={r.backend}" if r.backend != "hf" else "rollout.multi_turn.enable=true"
        raise ConfigError(
            f"rollout.routing_replay=true with {where}: the experts each token was routed to are recorded by the hf "
            "backend on single-turn rollouts only; use rollout.backend=hf without multi_turn, or routing_replay=false"
        )


def _check_auto_resume(cfg: ArmorConfig) -> None:
    """``trainer.resume=auto`` is for runs that write checkpoints as they go."""
    if cfg.trainer.resume == "auto" and not cfg.trainer.save_freq:
        raise ConfigError(
            "trainer.resume=auto continues a restarted run from its latest checkpoint, but trainer.save_freq=0 writes "
            "one only at the end: a run stopped before it would start over from step 0 every time. Set "
            "trainer.save_freq to how many steps a restart may lose, or trainer.resume=never"
        )


def _check_sizes(cfg: ArmorConfig) -> None:
    """Batch sizes that must divide, token budgets that must hold a row, and where offload can run."""
    if cfg.actor.ppo_mini_batch_size > cfg.data.train_batch_size:
        raise ConfigError(
            f"actor.ppo_mini_batch_size={cfg.actor.ppo_mini_batch_size} exceeds "
            f"data.train_batch_size={cfg.data.train_batch_size}"
        )
    if cfg.data.train_batch_size % cfg.actor.ppo_mini_batch_size:
        raise ConfigError(
            f"data.train_batch_size={cfg.data.train_batch_size} must be a multiple of "
            f"actor.ppo_mini_batch_size={cfg.actor.ppo_mini_batch_size}"
        )
    longest = cfg.data.max_prompt_length + cfg.rollout.max_new_tokens
    for key, budget in (
        ("actor.max_tokens_per_micro_batch", cfg.actor.max_tokens_per_micro_batch),
        ("critic.max_tokens_per_micro_batch", cfg.critic.max_tokens_per_micro_batch),
    ):
        if budget is not None and budget < longest:
            raise ConfigError(
                f"{key}={budget} cannot hold one row: a row can have up to data.max_prompt_length + "
                f"rollout.max_new_tokens = {cfg.data.max_prompt_length} + {cfg.rollout.max_new_tokens} = {longest} "
                f"tokens; set it to at least {longest}"
            )
    if cfg.actor.checkpoint_format == "sharded" and cfg.model.lora_rank:
        raise ConfigError(
            f"actor.checkpoint_format=sharded with model.lora_rank={cfg.model.lora_rank}: a LoRA run checkpoints its "
            "adapter (small, in peft's format), never the frozen base; set actor.checkpoint_format=auto or full"
        )
    if cfg.actor.offload and (cfg.trainer.device != "cuda" or cfg.actor.strategy != "fsdp2"):
        raise ConfigError(
            f"actor.offload=true needs trainer.device=cuda and actor.strategy=fsdp2 (got {cfg.trainer.device!r} and "
            f"{cfg.actor.strategy!r}): it keeps FSDP2's shards in CPU memory between their uses on a GPU; on a CPU "
            "run they are in CPU memory already, and gloo cannot reduce-scatter the offloaded gradients. Set "
            "actor.offload=false"
        )


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> ArmorConfig:
    """Defaults, then the YAML at ``path`` (a file, or ``recipe:NAME`` for one shipped in
    ``armor_core/config/recipes``), then ``key=value`` overrides; validated; plugins not checked."""
    schema = OmegaConf.structured(ArmorConfig)
    merged = schema
    try:
        if path is not None:
            from armor_core.config.recipes import RECIPE_PREFIX, recipe_path

            p = recipe_path(str(path)) if str(path).startswith(RECIPE_PREFIX) else Path(path)
            if not p.is_file():
                raise ConfigError(f"config file {str(p)!r} does not exist")
            try:
                loaded = OmegaConf.load(p)
            except Exception as e:
                raise ConfigError(f"{p}: not valid YAML: {e}") from e
            if not isinstance(loaded, DictConfig):
                raise ConfigError(
                    f"{p}: the top level must be a mapping of sections (model:, data:, ...), got "
                    f"{type(loaded).__name__}"
                )
            merged = OmegaConf.merge(merged, loaded)
        for item in overrides:
            if "=" not in item:
                raise ConfigError(f"override {item!r} is not key=value (for example actor.lr=1e-5)")
            try:
                merged = OmegaConf.merge(merged, OmegaConf.from_dotlist([item]))
            except yaml.YAMLError as e:  # e.g. {name:x}: YAML wants a space after the colon
                raise ConfigError(
                    f"override {item!r}: the value is not valid YAML ({' '.join(str(e).split())}); in a mapping put "
                    "a space after each colon, e.g. guard.guards='[{name: grad_spike, params: {window: 20}}]'"
                ) from None
    except OmegaConfBaseException as e:
        raise _friendly(e, str(path) if path and not overrides else "config") from e
    try:  # interpolations resolve here: a cycle (a=${a}) or an unset ${oc.env:...} is the user's to fix
        cfg: ArmorConfig = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except OmegaConfBaseException as e:
        raise _friendly(e, str(path) if path and not overrides else "config") from None
    assert isinstance(merged, DictConfig)  # merged from DictConfigs
    remember(cfg, merged)  # trackers log ${...} values as written: a resolved ${oc.env:KEY} is a secret
    _check_ranges(cfg)
    _check_semantics(cfg)
    return cfg


def to_yaml(cfg: ArmorConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_dict(cfg: ArmorConfig) -> dict:
    return OmegaConf.to_container(OmegaConf.structured(cfg))  # type: ignore[return-value]


def from_dict(d: dict) -> ArmorConfig:
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ArmorConfig), d))  # type: ignore[return-value]


def help_for(cls: type = ArmorConfig, prefix: str = "") -> list[tuple[str, str, Any]]:
    """(key, help, default) for every leaf field, for `armor run --help-config` and the docs test."""
    rows = []
    for fld in dataclasses.fields(cls):
        key = f"{prefix}{fld.name}"
        if fld.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(fld.default_factory):
            rows.extend(help_for(fld.default_factory, key + "."))
        else:
            factory = fld.default_factory
            default = fld.default if factory is dataclasses.MISSING else factory()
            rows.append((key, fld.metadata.get("help", ""), default))
    return rows
