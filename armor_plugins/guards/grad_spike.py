"""``grad_spike``: adaptive gradient clipping from the running statistics of the gradient norm.

At stage ``grad`` (in each actor worker, before ``optimizer.step``) the guard keeps a running mean
and variance of ``grad_norm`` (:class:`~armor_core.stability.helpers.RunningMoments`: exact over
the first ``window`` steps, an EMA after). After ``warmup`` norms, a norm whose z-score
``(g - mean) / std`` exceeds ``z_threshold`` is a spike: the verdict is ``scale`` with
``scale = (mean + clip_z * std) / g``, so the applied gradient has norm ``mean + clip_z * std``.

This is the z-score clipping of ZClip (Kumar et al. 2025, "ZClip: Adaptive Spike Mitigation for
LLM Pre-Training"), which clips to ``mean + z_thres * std`` and feeds the *clipped* norm back into
its EMA. We do the same: a spike enters the statistics as the norm it was clipped to, so one spike
cannot inflate the mean and variance and hide the next one, while a genuine, lasting rise in the
norm still moves the mean up by ``alpha * clip_z * std`` per step and is followed.

The fixed ``actor.grad_clip`` still applies first (``grad_norm`` is the norm before that clip,
as ``clip_grad_norm_`` returns it); this guard catches spikes relative to the recent level, which a
fixed threshold chosen at step 0 cannot. A non-finite (or negative) norm is left to ``non_finite``
(proceed, and the statistics are not touched).
"""

from __future__ import annotations

from typing import Any, Mapping

from armor_core import Verdict, hookimpl
from armor_core.hookspecs import RegisterStabilityGuard
from armor_core.stability.helpers import RunningMoments, check_param, finite_stat

__all__ = ["GradSpikeGuard"]

NAME = "grad_spike"


class GradSpikeGuard:
    """Scale down gradients whose norm is a z-score outlier.

    :param window: effective length of the running statistics (EMA weight ``1/window`` once more
        than ``window`` norms were seen; before that, the plain mean/variance of all of them).
    :param warmup: norms observed before the guard may act; the first steps of a run have the
        least typical norms and no statistics yet.
    :param z_threshold: a norm more than this many standard deviations above the mean is a spike.
        ZClip uses 2.5; 3.0 leaves ordinary heavy-tailed fluctuation alone.
    :param clip_z: the norm a spike is scaled to, ``mean + clip_z * std``; default ``z_threshold``,
        so the clipped norm is continuous in ``g`` at the threshold.
    :param min_rel_std: the standard deviation used is at least ``min_rel_std * mean``: after a
        stretch of nearly equal norms the measured std is ~0 and a 0.1 % rise would be "infinite z".
    """

    actions = {"grad": ("scale",)}

    def __init__(
        self,
        window: int = 50,
        warmup: int = 10,
        z_threshold: float = 3.0,
        clip_z: float | None = None,
        min_rel_std: float = 0.05,
    ) -> None:
        check_param(NAME, "window", window, ge=1)
        check_param(NAME, "warmup", warmup, ge=1)
        check_param(NAME, "z_threshold", z_threshold, gt=0)
        if clip_z is not None:  # above z_threshold a "clipped" spike would be scaled up
            check_param(NAME, "clip_z", clip_z, ge=0, le=z_threshold)
        check_param(NAME, "min_rel_std", min_rel_std, ge=0)
        self.window = int(window)
        self.warmup = int(warmup)
        self.z_threshold = float(z_threshold)
        self.clip_z = float(z_threshold if clip_z is None else clip_z)
        self.min_rel_std = float(min_rel_std)
        self.moments = RunningMoments(self.window)
        self.spikes = 0

    def _std(self) -> float:
        # 1e-12 keeps z finite when the mean is 0 too (all-zero gradients)
        return max(self.moments.std, self.min_rel_std * abs(self.moments.mean), 1e-12)

    def observe(self, stage: str, stats: Mapping[str, float], step: int) -> Verdict:
        if stage != "grad":
            return Verdict.proceed()
        g = finite_stat(stats, "grad_norm")
        if g is None or g < 0:  # not a norm: leave it to non_finite, keep it out of the statistics
            return Verdict.proceed()
        if self.moments.n < self.warmup:
            self.moments.update(g)
            return Verdict.proceed()
        mean, std = self.moments.mean, self._std()
        z = (g - mean) / std
        if not z > self.z_threshold:
            self.moments.update(g)
            return Verdict.proceed()
        target = max(mean + self.clip_z * std, 0.0)
        self.moments.update(target)
        self.spikes += 1
        # g > mean + z_threshold * std >= target, so 0 <= scale < 1
        return Verdict(
            "scale",
            f"grad_norm {g:.4g} is {z:.1f} std above its running mean {mean:.4g} (std {std:.4g}); scaled to "
            f"{target:.4g}",
            signal=z,
            threshold=self.z_threshold,
            scale=target / g,
        )

    def state_dict(self) -> dict[str, Any]:
        return {"moments": self.moments.state_dict(), "spikes": self.spikes}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.moments.load_state_dict(state.get("moments", {}))
        self.spikes = int(state.get("spikes", 0))


@hookimpl
def armor_register_stability_guards(register: RegisterStabilityGuard) -> None:
    register(NAME, GradSpikeGuard)
