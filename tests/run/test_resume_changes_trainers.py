"""Both trainers hand --allow-change to the resume check (run.loop.RunLoop): on the tiny model, a
changed seed is refused by Trainer.run(resume=True) before any checkpoint is looked at, and allowed
it goes on to the restore (here: nothing to restore, said so)."""

import pytest

from dart_jax.rl.trainer import Trainer
from dart_jax.run import run_dir
from dart_jax.run.run_dir import ChangedSettings, RunDirError
from rl.test_trainer import _config


def test_grpo_trainer_refuses_a_changed_seed_unless_allowed(tiny_smollm_dir, tmp_path):
    c = _config(tiny_smollm_dir, tmp_path / "run", steps=1)
    c.eval.n = 0
    run_dir.write_config(str(tmp_path / "run"), c)  # the record of a run written with seed 0
    c.train.seed = 7
    trainer = Trainer(c)
    with pytest.raises(ChangedSettings, match=r"this run changes: train.seed: 0 → 7\. .*--allow-change=train.seed"):
        trainer.run(resume=True)
    with pytest.raises(RunDirError, match="nothing to resume"):
        trainer.run(resume=True, allow_change=("train.seed",))


def test_sft_trainer_refuses_a_changed_seed_unless_allowed(tiny_smollm_dir, tmp_path):
    from configs import sft_quickstart
    from dart_jax.sft import demos as D
    from dart_jax.sft.trainer import SFTTrainer
    from sft.test_sft import _demo
    D.write_demos(str(tmp_path / "d.jsonl"), [_demo(i, a) for i, a in enumerate(["red", "blue", "1912", "Oslo"])])
    c = sft_quickstart.get_config()
    c.model.path = tiny_smollm_dir
    c.sft.data = [dict(builder="file", path=str(tmp_path / "d.jsonl"))]
    c.sft.update(dict(val_size=1, batch_size=2, micro_batch=1, epochs=1, protocol_check=0, eval_every=100))
    c.output.update(dict(dir=str(tmp_path / "sft"), progress=False, tensorboard=False))
    c.optim.schedule = "constant"  # the lr does not follow the SFT length, so more epochs are only how far it goes
    run_dir.write_config(str(tmp_path / "sft"), c)
    c.sft.seed = 3
    c.sft.epochs = 2  # how far it goes: not refused
    trainer = SFTTrainer(c)
    with pytest.raises(ChangedSettings, match=r"this run changes: sft.seed: 0 → 3\. "):
        trainer.run(resume=True)
    with pytest.raises(RunDirError, match="nothing to resume"):
        trainer.run(resume=True, allow_change="sft.seed")
