"""TensorFlow loads without the optional packages it would import for
features lingshard never uses (start-up time of every command).

`import tensorflow` (2.21) also imports, when they are installed:
- jax (~0.35 s): `tensorflow/lite/python/util.py` imports `jax.jit` for
  TFLite's converter from JAX functions;
- Keras 3 (~0.5 s with what it imports): TensorFlow imports
  `keras.src.optimizers` eagerly (so that a SavedModel holding Keras
  optimizers finds them registered; ImportError is allowed) and `tf.keras`
  is a lazy loader; Keras would also import
- matplotlib.pyplot (~0.4 s) for `keras.visualization`.
lingshard's `spmd` extra installs jax and matplotlib (the SPMD checker's
XLA, the experiments' plots) and TensorFlow installs Keras, so every
lingshard process paid ~1.2 s of its ~2.6 s TensorFlow import for them
(`import lingshard.trainer`, measured: 3.55 s with all three, 2.87 s
without jax and matplotlib, 2.36 s without Keras too).
`HideOptionalImports` (installed by `lingshard/__init__.py`) hides the three
while TensorFlow's own module runs: TFLite's JAX converter sees jax as
absent (`TFLiteConverter.experimental_from_jax` raises ImportError in a
lingshard process), Keras is imported by the first use of `tf.keras`, and
all three packages import normally afterwards (`lingshard.spmd` imports
jax, the experiments import matplotlib).

Only a first `import tensorflow` after `import lingshard` is affected; a
process that imported TensorFlow earlier keeps what it has.
"""

import importlib.abc
import importlib.machinery
import sys

# Top-level packages hidden while tensorflow/__init__.py runs.
HIDDEN = ('jax', 'matplotlib', 'keras')


class _HidingLoader(importlib.abc.Loader):
  """Runs TensorFlow's own loader with HIDDEN absent from the import system
  (a None entry in sys.modules makes `import name` raise ImportError), then
  gives the module its own loader back."""

  def __init__(self, loader):
    self._loader = loader

  def create_module(self, spec):
    return self._loader.create_module(spec)

  def exec_module(self, module):
    hidden = [name for name in HIDDEN if name not in sys.modules]
    for name in hidden:
      sys.modules[name] = None
    try:
      self._loader.exec_module(module)
    finally:
      for name in hidden:
        if name in sys.modules and sys.modules[name] is None:
          del sys.modules[name]
      module.__loader__ = self._loader
      if module.__spec__ is not None:
        module.__spec__.loader = self._loader


class _TensorFlowFinder(importlib.abc.MetaPathFinder):
  """Finds `tensorflow` once (the path finders' spec, its loader wrapped),
  then leaves the meta path."""

  def find_spec(self, name, path=None, target=None):
    if name != 'tensorflow':
      return None
    Uninstall()
    spec = importlib.machinery.PathFinder.find_spec(name, path)
    if spec is not None and spec.loader is not None:
      spec.loader = _HidingLoader(spec.loader)
    return spec


_FINDER = _TensorFlowFinder()


def HideOptionalImports():
  """Installs the finder unless TensorFlow is already imported."""
  if 'tensorflow' not in sys.modules and _FINDER not in sys.meta_path:
    sys.meta_path.insert(0, _FINDER)


def Uninstall():
  if _FINDER in sys.meta_path:
    sys.meta_path.remove(_FINDER)
