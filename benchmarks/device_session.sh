#!/usr/bin/env bash
# The measurements to take on a lent GPU machine, in parts (times seen on an H100):
#   profile    `tx bench --profile` of bert_6l with tx's defaults and with both of torch's
#              kernels at 4 steps per call: each side's step in ms by category (GEMMs,
#              attention, norms, optimizer, the rest), to find where tx loses on that
#              machine's CPU (an Intel Xeon with AMX, the host kind issue 24 asks about), ~4 min
#   tuned      `tx tune` on bert_6l (XLA's defaults against torch's attention, alone and with
#              torch's GEMM, at 4 steps per call; one round), then `tx bench --only 'bert_6[l]'
#              --tune`: the encoder as a user who ran `tx tune` gets it, against the peer; ~6 min
#   decoder    gpt_6l in float32 with tx's defaults, one job alone (training and decoding), ~4 min
#   decoder_torch  gpt_6l_torch_attention_2_per_call (torch's attention, 2 steps per call)
#              against the peer: does the float32 decoder reach the peer there, ~4 min
#   inside     benchmarks/torch_in_step.py: torch's GEMM and attention inside tx's bert_6l step
#              against the same calls alone, in tx's and in the peer's layouts, ~1.5 min
#   threads    the same with --cpu-by-thread: which threads ran on the CPUs while each torch
#              call did (its caller, XLA's other worker, torch's OpenMP workers), ~1.5 min
#   sched      benchmarks/step_faults.py: bert_6l_torch_kernels_4_per_call with XLA's
#              concurrency-optimized scheduler (the default) and without it (fewer XLA ops
#              beside a torch call), 2 rounds, ~4 min
#   faults     benchmarks/step_faults.py: bert_6l_torch_kernels_4_per_call with tx's glibc
#              tunables; with the freed memory kept (the trim threshold at 4 GiB keeps the
#              4-step call's buffer in the main heap, top_pad at 64 MiB the thread arenas'
#              extra heaps); and with torch's OpenMP threads sleeping at once instead of
#              spinning: page faults, system time and seconds a step, one round, ~3 min
#   cpu        the decoder cases of the CPU suite on 2 threads, ~5 min
#   attention  benchmarks/gpu_attention.py: cuDNN checked against XLA and timed, ~2.5 min
#   gpt2       the GPU suite's GPT-2 small cases (cuDNN and XLA attention, the peer), ~2.5 min
#   gpu        the whole GPU suite (`tx bench --platform gpu`), ~7.5 min on an H200
#   compiled   GPT-2 small and bert_6l in bf16 against a torch.compile'd peer (`--peer-compile`;
#              gpt_6l_bf16 took 2 min alone on an H200: 1.63x), ~4 min
#   cpu4       four CPU jobs at once, each on 2 cores of its own (taskset, distinct physical
#              cores): the decoder cases, the encoder cases with attention ablated, and
#              benchmarks/tune_case.py on gpt_6l and bert_6l; ~8 min. The jobs disturb one
#              another (benchmarks/NOTES.md attempt 48: ±20 %): read its paired ratios only
#   tune       torch's kernels, and 4 steps per call, against XLA's defaults in the bf16 and
#              the encoder step (benchmarks/tune_case.py, one job at a time, 2 rounds), ~8 min
#   encoder    bert_6l with tx's defaults and with both of torch's kernels at 4 steps per call,
#              2 rounds, ~7 min
#   encoder1   every bert_6l case of the CPU suite, one round, ~6 min
#   bf16       gpt_6l_bf16 with XLA's and with torch's GEMM against the peer in autocast, ~4.5 min
# A call runs at most 10 minutes and a session has 15 minutes of device time, machine
# starts included (~30 s): one full call, then a short one on the warm machine. The unknown
# first: `threads sched` (benchmarks/NOTES.md attempts 67-69: on the Intel host torch's
# GEMMs ran 1.09x slower inside tx's step than alone, measured on a step that still had the
# stability diagnostics on; on the step `tx bench` runs, does XLA's other worker take the
# CPUs from torch's calls there, and does a schedule with fewer concurrent ops help), then
# `bf16` on the warm machine (cut before its report in attempt 57, left out in attempt 67).
#
#   bash benchmarks/device_session.sh OUT_DIR [PART ...]  # default: threads sched
#
set -u
out=${1:?usage: bash benchmarks/device_session.sh OUT_DIR [PART ...] (the parts are listed above)}
shift
parts=${*:-threads sched}
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
    gpu) timeout 470 python3 -m tx bench --platform gpu --threads 8 --json "$out/gpu.json" \
           2>&1 | tee "$out/gpu.txt" ;;
    compiled) timeout 280 python3 -m tx bench --platform gpu --threads 8 --peer-compile \
                --only 'gpt2_small_bf1[6]' 'bert_6l_bf1[6]' --json "$out/compiled.json" 2>&1 \
                | tee "$out/compiled.txt" ;;
    gpt2) timeout 200 python3 -m tx bench --platform gpu --threads 8 --only gpt2_small \
            --json "$out/gpt2.json" 2>&1 | tee "$out/gpt2.txt" ;;
    attention) timeout 150 python3 "$here/benchmarks/gpu_attention.py" 2>&1 \
                 | tee "$out/attention.txt" ;;
    # the project machines' 2 threads, so the ratios compare with benchmarks/NOTES.md
    cpu) timeout 330 python3 -m tx bench --only gpt_baby gpt_6l --threads 2 \
           --json "$out/cpu.json" 2>&1 | tee "$out/cpu.txt" ;;
    profile) taskset -c 0,1 timeout 240 python3 -m tx bench --only 'bert_6[l]' \
               bert_6l_torch_kernels_4_per_call --profile --threads 2 \
               --json "$out/profile.json" 2>&1 | tee "$out/profile.txt" ;;
    tuned)
      # one round, so that the tune is cached before `--tune` needs it (a tune cut short by
      # its timeout caches nothing, and `--tune` would then time all 12 candidates)
      taskset -c 0,1 timeout 150 python3 "$here/benchmarks/tune_case.py" bert_6l --threads 2 \
        --candidates default torch_attention_4_per_call torch_attention_matmul_4_per_call \
        --rounds 1 --steps 4 2>&1 | tee "$out/tune_bert_6l.txt"
      taskset -c 0,1 timeout 200 python3 -m tx bench --only 'bert_6[l]' --tune \
        --threads 2 --json "$out/tuned.json" 2>&1 | tee "$out/tuned.txt" ;;
    decoder) taskset -c 0,1 timeout 330 python3 -m tx bench --only 'gpt_6[l]' --threads 2 \
               --json "$out/decoder.json" 2>&1 | tee "$out/decoder.txt" ;;
    encoder) taskset -c 0,1 timeout 540 python3 -m tx bench --only 'bert_6[l]' \
               bert_6l_torch_kernels_4_per_call --rounds 2 --threads 2 \
               --json "$out/encoder.json" 2>&1 | tee "$out/encoder.txt" ;;
    encoder1) taskset -c 0,1 timeout 420 python3 -m tx bench --only bert_6l --threads 2 \
                --json "$out/encoder1.json" 2>&1 | tee "$out/encoder1.txt" ;;
    decoder_torch) taskset -c 0,1 timeout 330 python3 -m tx bench --only gpt_6l_torch_attention_2_per_call \
                     --threads 2 --json "$out/decoder_torch.json" 2>&1 | tee "$out/decoder_torch.txt" ;;
    faults) taskset -c 0,1 timeout 220 python3 "$here/benchmarks/step_faults.py" --calls 4 --rounds 1 \
              --variants '' "glibc.malloc.trim_threshold=$((4 << 30)):glibc.malloc.top_pad=$((64 << 20))" \
              OMP_WAIT_POLICY=PASSIVE 2>&1 | tee "$out/faults.txt" ;;
    inside) taskset -c 0,1 timeout 150 python3 "$here/benchmarks/torch_in_step.py" --threads 2 \
              2>&1 | tee "$out/inside.txt" ;;
    threads) taskset -c 0,1 timeout 150 python3 "$here/benchmarks/torch_in_step.py" --threads 2 \
               --cpu-by-thread 2>&1 | tee "$out/threads.txt" ;;
    sched) taskset -c 0,1 timeout 300 python3 "$here/benchmarks/step_faults.py" --calls 4 --rounds 2 \
             --variants '' XLA_FLAGS=--xla_cpu_enable_concurrency_optimized_scheduler=false \
             2>&1 | tee "$out/sched.txt" ;;
    bf16) taskset -c 0,1 timeout 300 python3 -m tx bench --only gpt_6l_bf16 --threads 2 \
            --json "$out/bf16.json" 2>&1 | tee "$out/bf16.txt" ;;
    tune)
      taskset -c 0,1 timeout 270 python3 "$here/benchmarks/tune_case.py" gpt_6l_bf16 \
        --threads 2 --candidates default torch_matmul torch_matmul_4_per_call --rounds 2 \
        --steps 4 2>&1 | tee "$out/tune_gpt_6l_bf16.txt"
      taskset -c 0,1 timeout 270 python3 "$here/benchmarks/tune_case.py" bert_6l --threads 2 \
        --candidates default torch_attention_matmul default_4_per_call \
        torch_attention_matmul_4_per_call --rounds 2 --steps 4 2>&1 | tee "$out/tune_bert_6l.txt" ;;
    cpu4)
      # one logical CPU per physical core, two per job, so no job shares a core with another
      read -r -a cpus <<<"$(lscpu -p=CPU,CORE,SOCKET | grep -v '^#' | sort -t, -k3,3n -k2,2n -u \
                             | cut -d, -f1 | tr '\n' ' ')"
      echo "one CPU per core: ${cpus[*]}" | tee -a "$out/env.txt"
      pin() { echo "${cpus[$1]},${cpus[$1 + 1]}"; }
      taskset -c "$(pin 0)" timeout 540 python3 -m tx bench --only gpt_baby gpt_6l --threads 2 \
        --json "$out/cpu.json" >"$out/cpu.txt" 2>&1 &
      taskset -c "$(pin 2)" timeout 540 python3 -m tx bench --only bert_6l --threads 2 \
        --ablate-attention --json "$out/bert.json" >"$out/bert.txt" 2>&1 &
      taskset -c "$(pin 4)" timeout 540 python3 "$here/benchmarks/tune_case.py" gpt_6l \
        --threads 2 >"$out/tune_gpt.txt" 2>&1 &
      taskset -c "$(pin 6)" timeout 540 python3 "$here/benchmarks/tune_case.py" bert_6l \
        --threads 2 --rounds 2 --steps 3 >"$out/tune_bert.txt" 2>&1 &
      wait
      tail -n 40 "$out"/cpu.txt "$out"/bert.txt "$out"/tune_gpt.txt "$out"/tune_bert.txt ;;
    *) echo "unknown part $part (profile, tuned, decoder, decoder_torch, inside, threads, sched, faults, encoder, encoder1, tune, bf16, cpu, cpu4, attention, gpt2, gpu, compiled)" >&2; exit 2 ;;
  esac
done
