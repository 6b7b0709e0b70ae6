#!/usr/bin/env bash
# The measurements to take on a lent GPU machine, in parts (times seen on an H100):
#   cpu        the decoder cases of the CPU suite on that machine's own CPU (an Intel Xeon
#              with AMX, the host kind issue 24 asks about), on 2 threads, ~5 min
#   attention  benchmarks/gpu_attention.py: cuDNN checked against XLA and timed, ~2.5 min
#   gpt2       the GPU suite's GPT-2 small cases (cuDNN and XLA attention, the peer), ~2.5 min
#   gpu        the whole GPU suite (`tx bench --platform gpu`), ~6 min
# A call runs at most 10 minutes and a session has 15 minutes of device time, machine
# starts included; the unknowns first: `cpu attention`, then `gpt2` if time is left.
#
#   bash benchmarks/device_session.sh OUT_DIR [cpu|attention|gpt2|gpu ...]  # default: cpu attention
#
set -u
out=${1:?usage: bash benchmarks/device_session.sh OUT_DIR [cpu|attention|gpt2|gpu ...]}
shift
parts=${*:-cpu attention}
here=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH=$here PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
mkdir -p "$out"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
  lscpu | grep -E 'Model name|^CPU\(s\)|^Model:|Flags' | cut -c1-300
  python3 -c "import jax, flax, optax, torch, transformers as t
print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__,
      'torch', torch.__version__, 'transformers', t.__version__, jax.devices())"
} 2>&1 | tee "$out/env.txt"
for part in $parts; do
  case $part in
    gpu) timeout 420 python3 -m tx bench --platform gpu --threads 8 --json "$out/gpu.json" \
           2>&1 | tee "$out/gpu.txt" ;;
    gpt2) timeout 200 python3 -m tx bench --platform gpu --threads 8 --only gpt2_small \
            --json "$out/gpt2.json" 2>&1 | tee "$out/gpt2.txt" ;;
    attention) timeout 150 python3 "$here/benchmarks/gpu_attention.py" 2>&1 \
                 | tee "$out/attention.txt" ;;
    # the project machines' 2 threads, so the ratios compare with benchmarks/NOTES.md
    cpu) timeout 330 python3 -m tx bench --only gpt_baby gpt_6l --threads 2 \
           --json "$out/cpu.json" 2>&1 | tee "$out/cpu.txt" ;;
    *) echo "unknown part $part (cpu, attention, gpt2, gpu)" >&2; exit 2 ;;
  esac
done
