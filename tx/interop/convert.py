"""`tx convert --hf DIR --workdir OUT [--experiment NAME] [--set KEY=VALUE ...]`.

Writes a run directory that `tx eval`, `tx generate` and `tx train` read like one made by
`tx train`: OUT/config.json (a full ExperimentConfig: the imported `model.*` plus the
data / optim / train / decode settings of experiment NAME, or tx's defaults) and an Orbax
checkpoint at step 0 holding the imported params, a fresh optimizer state and RNG.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp

from tx.config.base import ConfigError, override, parse_overrides
from tx.config.experiment import ExperimentConfig
from tx.interop.load import load_hf
from tx.train import run_dir
from tx.train.checkpoint import Checkpointer
from tx.train.optimizer import make_optimizer
from tx.train.state import TrainState

# model.* keys that change how a network runs, not its parameters: kept from the base
# experiment (or --set), while every other model.* key comes from the checkpoint.
RUNTIME_MODEL_KEYS = ('dropout', 'attention_dropout', 'remat', 'dtype', 'attention_impl')
_DEFAULT_DATASET = {'decoder': 'stdlib', 'encoder': 'stdlib', 'encoder_decoder': 'multi30k'}


def converted_config(model_cfg, base: ExperimentConfig | None, overrides: dict,
                     name: str) -> ExperimentConfig:
  """The run's ExperimentConfig: `base` (or defaults) with the imported model."""
  bad = sorted(k for k in overrides
               if k.startswith('model.') and k[len('model.'):] not in RUNTIME_MODEL_KEYS)
  if bad:
    raise ConfigError(f'{bad[0]}: the architecture comes from the checkpoint; tx convert only '
                      f'takes model.{{{",".join(RUNTIME_MODEL_KEYS)}}} overrides')
  if base is None:
    base = ExperimentConfig(data=ExperimentConfig().data.replace(
        dataset=_DEFAULT_DATASET[model_cfg.family]))
    if model_cfg.position == 'learned':  # keep the default data windows inside the table
      base = base.replace(data=base.data.replace(
          seq_len=min(base.data.seq_len, model_cfg.max_len),
          target_len=min(base.data.target_len, model_cfg.max_len)))
  runtime = {k: getattr(base.model, k) for k in RUNTIME_MODEL_KEYS}
  cfg = ExperimentConfig(name=name, model=model_cfg.replace(**runtime), data=base.data,
                         optim=base.optim, train=base.train, task=base.task,
                         decode=base.decode, mesh=base.mesh)
  return override(cfg, overrides) if overrides else cfg


def convert(hf_dir, workdir, *, experiment: str | None = None,
            overrides: dict | None = None) -> Path:
  """Imports `hf_dir` and writes the run directory `workdir`; returns it."""
  model_cfg, params = load_hf(hf_dir)
  base = None
  if experiment is not None:
    from tx import registry  # pylint: disable=g-import-not-at-top
    base = registry.get(experiment)
  name = experiment or f'hf_{Path(hf_dir).expanduser().resolve().name}'
  cfg = converted_config(model_cfg, base, overrides or {}, name)
  workdir = run_dir.check_workdir(workdir, cfg.name)
  ckpt_dir = workdir / run_dir.CHECKPOINTS
  if ckpt_dir.exists() and any(ckpt_dir.iterdir()):
    raise ConfigError(f'--workdir: {ckpt_dir} already holds checkpoints; convert into a fresh '
                      'directory')
  optimizer, _ = make_optimizer(cfg.optim, total_steps=cfg.train.steps,
                                d_model=cfg.model.d_model)
  _, train_rng = jax.random.split(jax.random.key(cfg.train.seed))  # as tx.train.state does
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params,
                     opt_state=optimizer.init(params), rng=jax.random.key_data(train_rng),
                     skips=jnp.zeros((), jnp.int32))
  workdir.mkdir(parents=True, exist_ok=True)
  run_dir.write_json(workdir / run_dir.CONFIG, run_dir.config_dict(cfg))
  ckpt = Checkpointer(ckpt_dir, keep=cfg.train.keep_checkpoints, async_save=False)
  try:
    ckpt.save(0, state, meta={'best_eval': None, 'wall_time_s': 0.0,
                              'converted_from': str(Path(hf_dir).expanduser().resolve())})
  finally:
    ckpt.close()
  return workdir


def cli(args) -> int:
  """`tx convert`: prints where the run went and what the model is."""
  workdir = convert(args.hf, args.workdir, experiment=args.experiment,
                    overrides=parse_overrides(args.set))
  cfg = run_dir.load_run_config(workdir)
  m = cfg.model
  print(f'tx convert: {args.hf} -> {workdir} (experiment {cfg.name}: {m.family}, '
        f'{m.num_layers} layers, d_model {m.d_model}, vocab {m.vocab_size}, position '
        f'{m.position}); checkpoint at step 0')
  return 0
