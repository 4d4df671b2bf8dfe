"""TensorFlow and tensorflow_text load without the optional packages they
would import for features lingshard never uses (start-up time of every
command).

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
`import tensorflow_text` (the SentencePiece ops of the MT input and export)
defines a Keras layer at import (`tensorflow_text.keras.layers.ToDense`),
so it loads Keras, and Keras 3 imports jax (`keras.src.callbacks.
orbax_checkpoint`) and matplotlib.pyplot (`keras.src.visualization`), each
allowing an ImportError: 0.96 s, 0.38 s without jax and matplotlib
(measured after `import lingshard.trainer`).

`HideOptionalImports` (installed by `lingshard/__init__.py`) hides the three
while TensorFlow's own module runs, and jax and matplotlib while
tensorflow_text's runs (HIDDEN_WHILE). TFLite's JAX converter sees jax as
absent (`TFLiteConverter.experimental_from_jax` raises ImportError in a
lingshard process), and so does Keras when tensorflow_text loads it
(Keras' orbax checkpoint callback and its `keras.visualization` plots are
unavailable then). Keras is otherwise imported by the first use of
`tf.keras`, and all three packages import normally afterwards
(`lingshard.spmd` imports jax, the experiments import matplotlib).

Only a first import of each after `import lingshard` is affected; a
process that imported one earlier keeps what it has.
"""

import importlib.abc
import importlib.machinery
import sys

# {package: the top-level packages hidden while its __init__.py runs}.
HIDDEN_WHILE = {
    'tensorflow': ('jax', 'matplotlib', 'keras'),
    # tensorflow_text needs Keras (it subclasses tf.keras.layers.Layer).
    'tensorflow_text': ('jax', 'matplotlib'),
}


class _HidingLoader(importlib.abc.Loader):
  """Runs a package's own loader with `hidden` absent from the import
  system (a None entry in sys.modules makes `import name` raise
  ImportError), then gives the module its own loader back."""

  def __init__(self, loader, hidden):
    self._loader = loader
    self._hidden = hidden

  def create_module(self, spec):
    return self._loader.create_module(spec)

  def exec_module(self, module):
    hidden = [name for name in self._hidden if name not in sys.modules]
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


class _HidingFinder(importlib.abc.MetaPathFinder):
  """Finds each package of HIDDEN_WHILE once (the path finders' spec, its
  loader wrapped); leaves the meta path when none is left."""

  def __init__(self):
    self.pending = set()

  def find_spec(self, name, path=None, target=None):
    if name not in self.pending:
      return None
    self.pending.discard(name)
    if not self.pending:
      Uninstall()
    spec = importlib.machinery.PathFinder.find_spec(name, path)
    if spec is not None and spec.loader is not None:
      spec.loader = _HidingLoader(spec.loader, HIDDEN_WHILE[name])
    return spec


_FINDER = _HidingFinder()


def HideOptionalImports():
  """Installs the finder for the packages not imported yet."""
  _FINDER.pending = {name for name in HIDDEN_WHILE if name not in sys.modules}
  if _FINDER.pending and _FINDER not in sys.meta_path:
    sys.meta_path.insert(0, _FINDER)


def Uninstall():
  if _FINDER in sys.meta_path:
    sys.meta_path.remove(_FINDER)
