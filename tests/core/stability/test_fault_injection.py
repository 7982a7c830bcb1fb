"""``trainer.faults``: each kind's ``steps`` and ``value`` checked and documented, and an ``lr_scale`` fault shown in
``actor/lr`` as the rate the update really used."""

from __future__ import annotations

import pytest
import torch

from armor_core.stability import faults
from armor_core.stability.faults import FAULT_KINDS, VALUES, Faults, parse_faults


def test_steps_are_a_list_or_an_inclusive_range():
    (listed, ranged) = parse_faults(
        [{"kind": "nan_grad", "steps": [3, 7]}, {"kind": "flip_reward", "steps": {"from": 2, "to": 4}}]
    )
    assert listed.steps == {3, 7} and ranged.steps == {2, 3, 4}
    f = Faults([{"kind": "lr_scale", "steps": [5], "value": 10}])
    assert f.at("lr_scale", 5).value == 10.0 and f.at("lr_scale", 6) is None


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"kind": "lr_scale", "steps": [1]}, r"trainer.faults\[0\]: lr_scale needs a value, the factor"),
        ({"kind": "lr_scale", "steps": [1], "value": -2}, r"lr_scale's value is the factor .*, a number >= 0"),
        (
            {"kind": "flip_reward", "steps": [1], "value": 1.5},
            r"value=1.5: flip_reward's value is the fraction of rows",
        ),
        ({"kind": "inf_reward", "steps": [1], "value": 1}, r"inf_reward takes no value \(got 1\); leave it out"),
        ({"kind": "stale_rollout", "steps": [1], "value": 0}, r"how many updates old .*, a whole number >= 1"),
        ({"kind": "kill_worker", "steps": [1], "value": 0.5}, r"the rank of the actor worker .*, a whole number >= 0"),
        ({"kind": "nan_grad", "steps": [1], "value": "one"}, r"value='one': nan_grad's value is the rank"),
        ({"kind": "nan_grad", "steps": {"from": 1}}, r"steps=\{'from': 1\}: a range is \{from: first, to: last\}"),
        ({"kind": "nan_grad", "steps": 3}, r"steps=3: a list of steps \(\[3, 7\]\) or a range"),
    ],
)
def test_a_value_or_steps_the_kind_cannot_use_is_refused_by_name(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_faults([spec])


def test_flip_reward_flips_all_rows_or_the_fraction_given_the_same_rows_on_a_replay():
    scores = torch.tensor([1.0, 0.0] * 500)
    assert torch.equal(Faults([{"kind": "flip_reward", "steps": [3]}]).rewards(scores, 3), 1 - scores)
    noisy = Faults([{"kind": "flip_reward", "steps": {"from": 1, "to": 9}, "value": 0.3}])
    out = noisy.rewards(scores, 3)
    flipped = (out != scores).float().mean().item()
    assert 0.25 < flipped < 0.35  # 1000 rows, about 30% (the binomial's sd is 1.4 points)
    assert torch.equal(noisy.rewards(scores, 3), out) and not torch.equal(noisy.rewards(scores, 4), out)
    assert torch.equal(noisy.rewards(scores, 10), scores)  # outside its steps: untouched


def test_every_kind_is_documented_with_its_value():
    from armor_core.config.schema import TrainerConfig

    help_text = " ".join(TrainerConfig.__dataclass_fields__["faults"].metadata["help"].split())
    doc = " ".join(faults.__doc__.split())
    for kind in FAULT_KINDS:
        assert f"{kind} (" in help_text and f"``{kind}``" in doc, kind
    for kind in FAULT_KINDS:  # each kind's bullet says what its value is, or that it takes none
        bullet = doc.split(f"- ``{kind}``", 1)[1].split("- ``", 1)[0]
        says = "No ``value``" if kind not in VALUES else "``value``"
        assert says in bullet and (kind not in VALUES or "No ``value``" not in bullet), kind
    assert "{from: 3, to: 7}" in help_text and "list" in help_text


def test_an_lr_scale_fault_shows_in_actor_lr_as_the_rate_the_update_used():
    from armor_core.config.schema import load_config, to_dict
    from armor_core.dataproto.protocol import DataProto
    from armor_core.testing.batches import rollout_batch
    from armor_core.workers.actor.worker import ActorWorker

    cfg = load_config(
        None,
        [
            "data.train_batch_size=4",
            "actor.ppo_mini_batch_size=4",
            "rollout.n=1",
            "rollout.max_new_tokens=3",
            "data.max_prompt_length=4",
            "actor.lr=1e-3",
            "actor.warmup_steps=0",
            "engine.cpus_per_worker=1",
            "trainer.loggers=[]",
            "trainer.faults=[{kind: lr_scale, steps: [2], value: 100}]",
            "guard.enable=false",  # the default trust_region would undo the spike and lower the lr
        ],
    )
    worker = ActorWorker(to_dict(cfg), rank=0, world_size=1)
    ids, attn, pos, responses = rollout_batch([4, 3, 2, 4], [3, 2, 3, 1], P=4, R=3, vocab=19)
    batch = DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": attn,
            "position_ids": pos,
            "responses": responses,
            "response_mask": attn[:, 4:].clone(),
            "advantages": torch.randn(4, 3, generator=torch.Generator().manual_seed(0)),
        }
    )
    lrs = [worker.update_actor(batch, step=s)["actor/lr"] for s in (1, 2, 3)]
    assert lrs == pytest.approx([1e-3, 0.1, 1e-3])  # step 2 used 100x; the fault is undone for step 3
    assert worker.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)
