"""tx/bench/host.py: the host record of `tx bench` — cpuinfo parsing on three host kinds,
the probe on this machine, and the host block in the JSON `tx bench` writes."""

import json

from tx import cli
from tx.bench import host, suite

_ZEN4_FLAGS = ('fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 '
               'clflush mmx fxsr sse sse2 ht syscall nx mmxext pdpe1gb rdtscp lm pni '
               'pclmulqdq ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt aes xsave avx f16c rdrand '
               'hypervisor bmi1 avx2 smep bmi2 erms avx512f avx512dq rdseed adx avx512ifma '
               'clflushopt clwb avx512cd sha_ni avx512bw avx512vl avx512_bf16 avx512vbmi '
               'avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni avx512_bitalg avx512_vpopcntdq')
_SPR_FLAGS = ('fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 '
              'clflush mmx fxsr sse sse2 ss ht syscall nx pdpe1gb rdtscp lm pni pclmulqdq '
              'ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt aes xsave avx f16c rdrand hypervisor '
              'bmi1 hle avx2 smep bmi2 erms avx512f avx512dq rdseed adx avx512ifma avx512cd '
              'sha_ni avx512bw avx512vl avx_vnni avx512_bf16 avx512vbmi avx512_vbmi2 gfni '
              'vaes vpclmulqdq avx512_vnni avx512_bitalg avx512_vpopcntdq avx512_fp16 '
              'amx_bf16 amx_tile amx_int8 arch_capabilities')
_ROME_FLAGS = ('fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 '
               'clflush mmx fxsr sse sse2 ht syscall nx mmxext pdpe1gb rdtscp lm pni '
               'pclmulqdq ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt aes xsave avx f16c rdrand '
               'hypervisor lahf_lm abm sse4a bmi1 avx2 smep bmi2 rdseed adx clflushopt clwb '
               'sha_ni xsaveopt xsavec xgetbv1 clzero xsaveerptr arat npt nrip_save umip rdpid')


def _cpuinfo(vendor, family, model, stepping, name, flags, cache, cpus):
  """cpuinfo text: `cpus` is a list of (physical id, core id), one block per processor."""
  blocks = []
  for i, (phys, core) in enumerate(cpus):
    blocks.append(
        f'processor\t: {i}\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n'
        f'model name\t: {name}\nstepping\t: {stepping}\nmicrocode\t: 0x1000065\n'
        f'cpu MHz\t\t: 2596.134\ncache size\t: {cache}\nphysical id\t: {phys}\n'
        f'siblings\t: {len(cpus)}\ncore id\t\t: {core}\ncpu cores\t: 2\nflags\t\t: {flags}\n'
        'bugs\t\t: spectre_v1 spectre_v2\nbogomips\t: 5192.26\n'
        'address sizes\t: 48 bits physical, 48 bits virtual\npower management:\n')
  return '\n'.join(blocks) + '\n'


# An AMD EPYC Zen 4 (family 25 model 17, AVX-512 with bf16), 2 cores, no SMT (this project's
# most frequent host); an Intel Xeon with AMX (family 6, model 167 as issue 24 records it), 2
# cores x 2 threads; an AMD EPYC Zen 2 (family 23 model 49) with AVX2 + FMA only.
ZEN4 = _cpuinfo('AuthenticAMD', 25, 17, 1, 'AMD EPYC', _ZEN4_FLAGS, '1024 KB', [(0, 0), (0, 1)])
XEON_AMX = _cpuinfo('GenuineIntel', 6, 167, 8, 'Intel(R) Xeon(R) Processor',
                    _SPR_FLAGS, '107520 KB', [(0, 0), (0, 0), (0, 1), (0, 1)])
AVX2 = _cpuinfo('AuthenticAMD', 23, 49, 0, 'AMD EPYC 7B12', _ROME_FLAGS, '512 KB',
                [(0, 0), (0, 1)])


def test_parse_zen4():
  got = host.parse_cpuinfo(ZEN4)
  assert (got['vendor'], got['model_name']) == ('AuthenticAMD', 'AMD EPYC')
  assert (got['family'], got['model'], got['stepping']) == (25, 17, 1)
  assert (got['logical_cpus'], got['physical_cores'], got['threads_per_core']) == (2, 2, 1)
  assert got['isa'] == {'fma': True, 'avx2': True, 'avx512f': True, 'avx512_bf16': True,
                        'avx512_vnni': True, 'amx_tile': False, 'amx_bf16': False,
                        'amx_int8': False}
  assert got['isa_level'] == 'avx512'


def test_parse_xeon_with_amx():
  got = host.parse_cpuinfo(XEON_AMX)
  assert got['vendor'] == 'GenuineIntel' and got['model_name'].startswith('Intel(R) Xeon(R)')
  assert (got['family'], got['model'], got['stepping']) == (6, 167, 8)
  # four hardware threads on two cores (hyper-threading)
  assert (got['logical_cpus'], got['physical_cores'], got['threads_per_core']) == (4, 2, 2)
  assert all(got['isa'].values()), got['isa']
  assert got['isa_level'] == 'amx'


def test_parse_avx2_only():
  got = host.parse_cpuinfo(AVX2)
  assert (got['vendor'], got['model_name'], got['family'], got['model']) == (
      'AuthenticAMD', 'AMD EPYC 7B12', 23, 49)
  assert {f for f, on in got['isa'].items() if on} == {'fma', 'avx2'}
  assert got['isa_level'] == 'avx2'


def test_parse_degrades_gracefully():
  empty = host.parse_cpuinfo('')
  assert empty['vendor'] == empty['model_name'] == 'unknown'
  assert empty['family'] is None and empty['isa'] == {} and empty['isa_level'] == 'unknown'
  arm = host.parse_cpuinfo('processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd sve\n'
                           'CPU implementer\t: 0x41\nCPU part\t: 0xd40\n\n')
  assert arm['vendor'] == '0x41' and arm['isa_level'] == 'baseline'
  assert arm['logical_cpus'] == 1 and arm['physical_cores'] is None


def test_caches_from_sysfs(tmp_path):
  for i, (level, kind, size) in enumerate([(1, 'Data', '48K'), (1, 'Instruction', '32K'),
                                           (2, 'Unified', '2048K'), (3, 'Unified', '105M')]):
    d = tmp_path / f'index{i}'
    d.mkdir()
    for name, value in (('level', level), ('type', kind), ('size', size)):
      (d / name).write_text(f'{value}\n')
  assert host.read_caches(str(tmp_path)) == {'L1d': 48 << 10, 'L1i': 32 << 10, 'L2': 2 << 20,
                                             'L3': 105 << 20}
  assert host.read_caches(str(tmp_path / 'absent')) == {}


REQUIRED = ('vendor', 'model_name', 'family', 'model', 'stepping', 'logical_cpus',
            'physical_cores', 'threads_per_core', 'cpu_count', 'usable_cpus', 'isa',
            'isa_level', 'caches', 'memory_bytes', 'xla_flags', 'xla_flags_env', 'jax',
            'jaxlib', 'platform', 'machine', 'source')


def test_probe_on_this_machine():
  info = host.probe({'XLA_FLAGS': '--xla_cpu_enable_fast_math=false'})
  assert set(REQUIRED) <= set(info)
  assert set(info['isa']) in (set(host.ISA_FLAGS), set())  # {} only without a flags line
  assert info['cpu_count'] and info['memory_bytes'] > 2**28
  assert info['jax'] and info['jaxlib']
  assert info['xla_flags'] == '--xla_cpu_enable_fast_math=false'
  json.dumps(info)
  text = host.summary(info)
  assert text.startswith('host: ') and 'jax ' in text and '--xla_cpu_enable_fast_math' in text


def test_bench_json_has_the_host(tmp_path, monkeypatch, capsys):
  """`tx bench` writes the host block and prints it, measurements faked (no processes)."""
  fake = {'float32_flops': 1e9, 'bfloat16_flops': 2e9, 'compile_s': 1.0, 'tokens_per_s': 10.0,
          'step_time_s': 1.0, 'flops_per_step': 1e8, 'peak_rss_bytes': 1e8,
          'first_step_s': 1.0, 'new_tokens_per_s': 5.0, 'generated_tokens': 8}
  monkeypatch.setattr(suite, 'run_isolated', lambda target, spec, threads, platform: dict(fake))
  # flags that are XLA's defaults anyway, in case this call starts the backend
  monkeypatch.setenv('XLA_FLAGS', '--xla_cpu_enable_fast_math=false '
                     '--xla_force_host_platform_device_count=1')
  out = tmp_path / 'bench.json'
  assert cli.main(['bench', '--quick', '--no-peers', '--quiet', '--json', str(out)]) == 0
  doc = json.loads(out.read_text())
  got = doc['machine']['host']
  assert set(REQUIRED) <= set(got)
  # what every measurement gets: the device count dropped (tx/bench/worker.py thread_env)
  assert got['xla_flags'] == '--xla_cpu_enable_fast_math=false'
  assert 'device_count=1' in got['xla_flags_env']
  printed = capsys.readouterr().out
  assert host.summary(got).splitlines()[0] in printed
