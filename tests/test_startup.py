"""lingshard/startup.py: TensorFlow loads without jax, matplotlib and Keras
in a process that imports lingshard first, tensorflow_text without jax and
matplotlib; all three import and work afterwards (tf.keras loads on first
use); a process that imported TensorFlow first keeps them.
The corpus tools start without TensorFlow (lingshard/input_error.py).
Each case runs in a fresh interpreter (the import system is per process)."""

import json
import subprocess
import sys

from tests import readme_testlib

_AFTER_LINGSHARD = r'''
import json, sys
import lingshard.trainer
from lingshard import startup
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

_TF_FIRST = r'''
import json, sys
import tensorflow
import lingshard.trainer
from lingshard import startup
print(json.dumps(dict(jax='jax' in sys.modules, keras='keras' in sys.modules,
                      pending=sorted(startup._FINDER.pending))))
'''


def _Run(code):
  proc = subprocess.run([sys.executable, '-c', code], env=readme_testlib.Env(),
                        capture_output=True, text=True, timeout=120,
                        check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def test_tensorflow_loads_without_jax_matplotlib_keras_which_still_work():
  out = _Run(_AFTER_LINGSHARD)
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


def test_tensorflow_imported_first_keeps_its_imports():
  # jax installed (the spmd extra): TensorFlow's own import loads it, and
  # Keras.
  assert _Run(_TF_FIRST) == {'jax': True, 'keras': True,
                             'pending': ['tensorflow_text']}


def test_corpus_tools_start_without_tensorflow():
  # One interpreter: the modules loaded after the corpus tools, then after
  # base_input.
  code = ('import json, sys\n'
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
