"""lingshard/startup.py, a lingshard program's start-up (`startup.Install()`
first thing in every entry point and test process): TensorFlow loads
without jax, matplotlib and Keras, tensorflow_text without jax and
matplotlib; all three import and work afterwards (tf.keras loads on first
use); a process that imported TensorFlow first keeps them. On a host with
no GPU driver TensorFlow's CUDA start-up lines are dropped.
`import lingshard` alone changes nothing outside lingshard.
The corpus tools start without TensorFlow (lingshard/input_error.py).
Each process case runs in a fresh interpreter (the import system is per
process)."""

import json
import os
import subprocess
import sys

import pytest

from lingshard import startup
from tests import readme_testlib

_AFTER_INSTALL = r'''
import json, sys
from lingshard import startup
startup.Install()
import lingshard.trainer
def Seen():
  return {name: name in sys.modules for name in (
      'tensorflow', 'tensorflow_text', 'jax', 'matplotlib', 'keras')}
seen = Seen()
pending = sorted(startup._FINDER.pending)
finder_left = startup._FINDER in sys.meta_path
import tensorflow as tf
loader = type(tf.__loader__).__name__
import tensorflow_text
seen_text = Seen()
text_finder_left = startup._FINDER in sys.meta_path
text_loader = type(tensorflow_text.__loader__).__name__
import jax.numpy as jnp
import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
plt.figure()
total = float(jnp.arange(4.0).sum())
adam = type(tf.keras.optimizers.Adam(0.1)).__name__
print(json.dumps(dict(seen=seen, pending=pending, finder_left=finder_left,
                      loader=loader, seen_text=seen_text,
                      text_finder_left=text_finder_left,
                      text_loader=text_loader, total=total, adam=adam)))
'''

# What a process that never saw lingshard has after `import tensorflow`
# (the packages TF loaded, the meta path TF's imports leave), and what one
# that imports lingshard (the library) has.
_LOADED = r'''
import json, sys
def Loaded():
  return dict(
      packages=sorted(m for m in ('jax', 'keras', 'matplotlib.pyplot')
                      if m in sys.modules),
      meta_path=[type(finder).__name__ for finder in sys.meta_path])
if sys.argv[1] == 'lingshard':
  meta_path = list(sys.meta_path)
  import lingshard
  import importlib.util
  same_after_package = meta_path == sys.meta_path
  findable = all(importlib.util.find_spec(name) is not None
                 for name in ('jax', 'keras', 'matplotlib'))
  import lingshard.trainer
  print(json.dumps(dict(same_after_package=same_after_package,
                        findable=findable, loaded=Loaded())))
else:
  import tensorflow
  loaded = Loaded()
  # A program that imported TensorFlow before its start-up keeps it all.
  from lingshard import startup
  startup.Install()
  import lingshard.trainer
  print(json.dumps(dict(loaded=loaded, kept=Loaded()['packages'],
                        pending=sorted(startup._FINDER.pending))))
'''


def _Run(code, *args, env=None):
  proc = subprocess.run([sys.executable, '-c', code, *args],
                        env=env or readme_testlib.Env(),
                        capture_output=True, text=True, timeout=120,
                        check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_lingshard_leaves_other_packages_as_they_were():
  plain = _Run(_LOADED, 'tensorflow')
  out = _Run(_LOADED, 'lingshard')
  assert out == dict(same_after_package=True, findable=True,
                     loaded=plain['loaded'])
  # TensorFlow imports all three when nothing hides them (this venv).
  all_three = ['jax', 'keras', 'matplotlib.pyplot']
  assert plain['loaded']['packages'] == all_three
  assert plain['kept'] == all_three
  assert plain['pending'] == ['tensorflow_text']


def test_quiet_cuda_probe_drops_only_the_no_driver_lines(capfd):
  noise = ('WARNING: All log messages before absl::InitializeLog() is called '
           'are written to STDERR\n'
           'I0000 00:00:1.0 1 cudart_stub.cc:31] Could not find cuda drivers '
           'on your machine, GPU will not be used.\n'
           'E0000 00:00:1.0 1 cuda_platform.cc:52] failed call to cuInit: '
           'INTERNAL: CUDA error\n')
  with pytest.raises(ValueError):
    with startup.QuietCudaProbe():
      os.write(2, ('W0000 a warning\n' + noise + 'last\n').encode())
      raise ValueError('replayed even so')
  kept = capfd.readouterr().err
  if startup.HasGpuDriver():
    assert kept == 'W0000 a warning\n' + noise + 'last\n'
  else:
    assert kept == 'W0000 a warning\nlast\n'


def test_trainer_on_a_cpu_host_prints_no_cuda_lines(tmp_path):
  env = readme_testlib.Env()
  del env['TF_CPP_MIN_LOG_LEVEL']
  proc = subprocess.run(
      [sys.executable, '-m', 'lingshard.trainer', '--model=toy.FFRegression',
       '--mode=train', f'--logdir={tmp_path}', '--max_steps=2'],
      env=env, capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'step 2/2 loss' in proc.stdout
  if startup.HasGpuDriver():
    pytest.skip('a GPU driver is installed: the CUDA log is kept')
  lines = proc.stderr.splitlines()
  assert not [line for line in lines if 'cuda' in line.lower() or
              'absl::InitializeLog' in line or 'cpu_feature_guard' in line]


def test_tensorflow_loads_without_jax_matplotlib_keras_which_still_work():
  out = _Run(_AFTER_INSTALL)
  assert out['seen'] == {'tensorflow': True, 'tensorflow_text': False,
                         'jax': False, 'matplotlib': False, 'keras': False}
  assert out['pending'] == ['tensorflow_text'] and out['finder_left']
  assert out['loader'] == 'SourceFileLoader'  # Its own loader back.
  # tensorflow_text loads Keras (its ToDense layer), not jax / matplotlib.
  assert out['seen_text'] == {'tensorflow': True, 'tensorflow_text': True,
                              'jax': False, 'matplotlib': False,
                              'keras': True}
  assert not out['text_finder_left']
  assert out['text_loader'] == 'SourceFileLoader'
  assert out['total'] == 6.0
  assert out['adam'] == 'Adam'


def test_corpus_tools_start_without_tensorflow():
  # One interpreter: the modules loaded after the corpus tools, then after
  # base_input.
  code = ('import json, sys\n'
          'from lingshard import startup\n'
          'startup.Install()\n'
          'def Loaded():\n'
          '  return sorted(m for m in ("tensorflow", "jax") '
          'if m in sys.modules)\n'
          'import lingshard.data.prepare, lingshard.data.stats\n'
          'import lingshard.data.lm_prepare\n'
          'tools = Loaded()\n'
          'from lingshard import base_input\n'
          'print(json.dumps([tools, Loaded()]))\n')
  tools, after_base_input = _Run(code)
  assert tools == []
  assert after_base_input == ['tensorflow']


def test_corpus_errors_are_the_trainers_input_errors():
  from lingshard import base_input
  from lingshard.data import corpus_io
  assert issubclass(corpus_io.CorpusError, base_input.InputError)
