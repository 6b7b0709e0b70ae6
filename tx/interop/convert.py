"""`tx convert --hf DIR --workdir OUT [--experiment NAME] [--set KEY=VALUE ...]`.

Writes a run directory that `tx eval`, `tx generate` and `tx train` read like one made by
`tx train`: OUT/config.json (a full ExperimentConfig: the imported `model.*` plus the
data / optim / train / decode settings of experiment NAME, or tx's defaults) and an Orbax
checkpoint at step 0 holding the imported params, a fresh optimizer state and RNG.

The checkpoint's tokenizer. When DIR holds a `tokenizer.json` (a Hugging Face fast
tokenizer), it is copied byte for byte to OUT/tokenizer/ with `tokenizer_config.json` and
`special_tokens_map.json` if present, tx's header OUT/tokenizer/tx_tokenizer.json records
its special ids (from those files, else DIR/config.json), and the run gets
`data.tokenizer=hf data.tokenizer_path=OUT/tokenizer/tx_tokenizer.json` (unless `--set
data.tokenizer=...` chooses otherwise; config.json stores it relative to OUT, so the run
directory can be moved or copied whole). A checkpoint with only a slow tokenizer's files
(vocab.json + merges.txt, spiece.model, tokenizer.model, vocab.txt) gets them converted to a
tokenizer.json by transformers' AutoTokenizer first (tx/interop/slow_tokenizer.py). Then,
with no further flags:

    tx convert --hf ckpt/gpt2 --workdir runs/gpt2
    tx generate --workdir runs/gpt2 --prompt "Hello, my name is" --set decode.max_len=20
    tx generate --workdir runs/gpt2 --input prompts.txt \\
        --set decode.strategy=sample decode.top_p=0.9

and for `tx eval` (causal LMs) give the run a text dataset when converting; its documents
are joined with the checkpoint's EOS into windows of data.seq_len tokens:

    tx convert --hf ckpt/gpt2 --workdir runs/gpt2 \
        --set data.dataset=text data.files=corpus.txt data.seq_len=256 train.batch_size=8
    tx eval --workdir runs/gpt2 [--split validation] [--batches 10] [--extrapolation none]

Special ids stay the checkpoint's (see tx/data/tokenizers/hf.py): generation stops at its
EOS and starts prompts with the specials its post-processor puts first (LLaMA's <s>); where
its id 0 is an ordinary token (GPT-2's "!") prompts and windows carry explicit validity, so
tx matches transformers token for token (tests/interop/test_tokenizer.py). With the hf
tokenizer `tx eval` / `tx train` read causal-LM rows (windows, or packed documents framed
by its BOS / EOS), MLM rows (BERT: framed [CLS] ... [SEP], the checkpoint's [MASK], its
specials never masked; its pad id must be 0) and T5's seq2seq rows (source + </s>; decoder
inputs start at config.json's decoder_start_token_id, 0, marked real by segment ids;
tests/interop/test_t5_tokenizer.py); `tx generate` translates with T5 the same way.

Without a tokenizer.json (nor slow tokenizer files) the run keeps the base experiment's
tokenizer; convert says so,
and `tx generate` / `tx eval` stop with one line (vocabulary mismatch) telling you to put
the checkpoint's tokenizer.json in DIR and convert again.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp

from tx import registry
from tx.config.base import ConfigError, override, parse_overrides
from tx.config.experiment import ExperimentConfig
from tx.data.tokenizers.hf import CONFIG_FILES, HEADER_FILE, HF_FILE, HfTokenizer
from tx.interop.load import load_hf
from tx.interop.slow_tokenizer import convert_slow_tokenizer, slow_files
from tx.train import run_dir, run_lock
from tx.train.checkpoint import Checkpointer
from tx.train.optimizer import run_optimizer
from tx.train.state import TrainState

# model.* keys that change how a network runs, not its parameters: kept from the base
# experiment (or --set), while every other model.* key comes from the checkpoint.
RUNTIME_MODEL_KEYS = ('dropout', 'attention_dropout', 'remat', 'dtype', 'attention_impl',
                      'attention_causal_blocks')
_DEFAULT_DATASET = {'decoder': 'stdlib', 'encoder': 'stdlib', 'encoder_decoder': 'multi30k'}
TOKENIZER_DIR = 'tokenizer'  # OUT/tokenizer/: the checkpoint's tokenizer files + tx's header


def converted_config(model_cfg, base: ExperimentConfig | None, overrides: dict,
                     name: str) -> ExperimentConfig:
  """The run's ExperimentConfig: `base` (or defaults) with the imported model."""
  bad = sorted(k for k in overrides
               if k.startswith('model.') and k[len('model.'):] not in RUNTIME_MODEL_KEYS)
  if bad:
    raise ConfigError(f'{bad[0]}: the architecture comes from the checkpoint; tx convert only '
                      f'takes model.{{{",".join(RUNTIME_MODEL_KEYS)}}} overrides')
  if base is None:
    defaults = ExperimentConfig()
    data = defaults.data.replace(dataset=_DEFAULT_DATASET[model_cfg.family])
    if model_cfg.position == 'learned':  # keep the default data windows inside the table
      data = data.replace(seq_len=min(data.seq_len, model_cfg.max_len),
                          target_len=min(data.target_len, model_cfg.max_len))
    # the imported family with tx's default runtime keys (a T5 needs its parallel dataset)
    base = ExperimentConfig(model=model_cfg.replace(
        **{k: getattr(defaults.model, k) for k in RUNTIME_MODEL_KEYS}), data=data)
  runtime = {k: getattr(base.model, k) for k in RUNTIME_MODEL_KEYS}
  cfg = ExperimentConfig(name=name, model=model_cfg.replace(**runtime), data=base.data,
                         optim=base.optim, train=base.train, task=base.task,
                         decode=base.decode, mesh=base.mesh)
  return override(cfg, overrides) if overrides else cfg


def tokenizer_folder(hf_dir: Path, scratch: Path) -> Path | None:
  """Where the checkpoint's fast tokenizer is: `hf_dir` when it holds a tokenizer.json,
  `scratch` after converting its slow tokenizer files there (see slow_tokenizer.py), or
  None when it has neither."""
  if (hf_dir / HF_FILE).is_file():
    return hf_dir
  if slow_files(hf_dir) is not None:
    return convert_slow_tokenizer(hf_dir, scratch)
  return None


def checkpoint_tokenizer(folder: Path, model_cfg, hf_dir: Path) -> HfTokenizer:
  """The tokenizer.json in `folder` with its special ids, checked against the model
  (errors name the checkpoint's own files, not a scratch folder of a conversion)."""
  tokenizer = HfTokenizer.from_files(folder)
  if tokenizer.vocab_size > model_cfg.vocab_size:
    files = HF_FILE if folder == hf_dir else ' + '.join(slow_files(hf_dir) or ())
    raise ConfigError(f'{hf_dir}/{files}: {tokenizer.vocab_size} token ids but the model '
                      f'only {model_cfg.vocab_size}: it is not this checkpoint\'s tokenizer')
  return tokenizer


def convert(hf_dir, workdir, *, experiment: str | None = None,
            overrides: dict | None = None) -> Path:
  """Imports `hf_dir` and writes the run directory `workdir`; returns it.

  With a tokenizer.json in `hf_dir`, or slow tokenizer files transformers converts to one
  (and no data.tokenizer override), the run gets data.tokenizer=hf, reading OUT/tokenizer/
  (tokenizer.json, the tokenizer configs beside it, and tx's header recording the special
  ids).
  """
  model_cfg, params = load_hf(hf_dir)
  hf_dir = Path(hf_dir).expanduser().resolve()
  overrides = dict(overrides or {})
  with tempfile.TemporaryDirectory() as scratch:
    folder = None if 'data.tokenizer' in overrides else tokenizer_folder(hf_dir, Path(scratch))
    tokenizer = None if folder is None else checkpoint_tokenizer(folder, model_cfg, hf_dir)
    return _write_run(hf_dir, workdir, model_cfg, params, experiment, overrides, tokenizer,
                      folder)


def _write_run(hf_dir, workdir, model_cfg, params, experiment, overrides, tokenizer, folder):
  """convert()'s second half: config.json, OUT/tokenizer/ (from `folder`) and the step-0
  checkpoint, written only after every check has passed."""
  header = Path(workdir).expanduser().resolve() / TOKENIZER_DIR / HEADER_FILE
  if tokenizer is not None:
    overrides.update({'data.tokenizer': 'hf', 'data.tokenizer_path': str(header)})
  base = None
  if experiment is not None:
    base = registry.get(experiment)
  name = experiment or f'hf_{hf_dir.name}'
  cfg = converted_config(model_cfg, base, overrides, name)
  workdir = run_dir.check_workdir(workdir, cfg.name)
  ckpt_dir = workdir / run_dir.CHECKPOINTS
  if ckpt_dir.exists() and any(ckpt_dir.iterdir()):
    raise ConfigError(f'--workdir: {ckpt_dir} already holds checkpoints; convert into a fresh '
                      'directory')
  optimizer, _ = run_optimizer(cfg)
  _, train_rng = jax.random.split(jax.random.key(cfg.train.seed))  # as tx.train.state does
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params,
                     opt_state=optimizer.init(params), rng=jax.random.key_data(train_rng),
                     skips=jnp.zeros((), jnp.int32))
  workdir.mkdir(parents=True, exist_ok=True)
  with run_lock.hold(workdir):  # one writer per run directory, as `tx train`
    if tokenizer is not None:
      header.parent.mkdir(parents=True, exist_ok=True)
      for file in CONFIG_FILES:  # for transformers' AutoTokenizer.from_pretrained(OUT/tokenizer)
        if (folder / file).is_file():
          (header.parent / file).write_bytes((folder / file).read_bytes())
      tokenizer.save(header)  # tokenizer.json, byte for byte, then the header
    run_dir.write_json(workdir / run_dir.CONFIG, run_dir.config_dict(cfg, workdir))
    ckpt = Checkpointer(ckpt_dir, keep=cfg.train.keep_checkpoints, async_save=False)
    try:
      ckpt.save(0, state, meta={'best_eval': None, 'wall_time_s': 0.0,
                                'converted_from': str(hf_dir)})
    finally:
      ckpt.close()
  return workdir


def cli(args) -> int:
  """`tx convert`: prints where the run went, what the model is and which tokenizer it reads."""
  workdir = convert(args.hf, args.workdir, experiment=args.experiment,
                    overrides=parse_overrides(args.set))
  cfg = run_dir.load_run_config(workdir)
  m = cfg.model
  print(f'tx convert: {args.hf} -> {workdir} (experiment {cfg.name}: {m.family}, '
        f'{m.num_layers} layers, d_model {m.d_model}, vocab {m.vocab_size}, position '
        f'{m.position}); checkpoint at step 0')
  if cfg.data.tokenizer == 'hf':
    print(f'tokenizer: data.tokenizer=hf, data.tokenizer_path={cfg.data.tokenizer_path}')
  elif 'data.tokenizer' not in parse_overrides(args.set):
    print(f'tokenizer: {args.hf} has no {HF_FILE} (nor slow tokenizer files), so tx generate '
          f'/ tx eval cannot encode text for this run; put the checkpoint\'s {HF_FILE} there '
          'and convert again')
  return 0
