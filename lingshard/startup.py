"""Start-up of a process that is a lingshard program: the trainer, the
tools, the data and experiment commands, the scripts and the test
processes call `Install()` first thing, before TensorFlow is imported
(`if __name__ == '__main__': startup.Install()` above their imports).
`import lingshard` itself changes nothing: a notebook or program that
imports lingshard beside jax or Keras keeps its import system as it was.

1. Optional imports (start-up time of every command).
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
lingshard command paid ~1.2 s of its ~2.6 s TensorFlow import for them
(`import lingshard.trainer`, measured: 3.55 s with all three, 2.87 s
without jax and matplotlib, 2.36 s without Keras too).
`import tensorflow_text` (the SentencePiece ops of the MT input and export)
defines a Keras layer at import (`tensorflow_text.keras.layers.ToDense`),
so it loads Keras, and Keras 3 imports jax (`keras.src.callbacks.
orbax_checkpoint`) and matplotlib.pyplot (`keras.src.visualization`), each
allowing an ImportError: 0.96 s, 0.38 s without jax and matplotlib
(measured after `import lingshard.trainer`).
`HideOptionalImports` hides the three while TensorFlow's own module runs,
and jax and matplotlib while tensorflow_text's runs (HIDDEN_WHILE). In a
lingshard program TFLite's JAX converter sees jax as absent
(`TFLiteConverter.experimental_from_jax` raises ImportError), and so does
Keras when tensorflow_text loads it (Keras' orbax checkpoint callback and
its `keras.visualization` plots are unavailable then). Keras is otherwise
imported by the first use of `tf.keras`, and all three packages import
normally afterwards (`lingshard.spmd` imports jax, the experiments import
matplotlib). Only a first import of each is affected; a process that
imported one earlier keeps what it has.

2. A quiet start on a machine without a GPU driver (`QuietCudaProbe`).
TensorFlow's wheel is built with CUDA: on a host with no NVIDIA driver its
import logs `Could not find cuda drivers on your machine, GPU will not be
used` (twice, before absl logging is initialised, so TF_CPP_MIN_LOG_LEVEL
does not reach them) and its device listing logs `E0000 ... failed call to
cuInit: INTERNAL: CUDA error`, which reads like a failure on a healthy CPU
run. With no driver library (`libcuda.so.1` does not load) no GPU can be
used, so those lines say nothing: they are dropped from what TensorFlow's
import and first device listing write to stderr, everything else is
written as it came, and TF's C++ INFO records (e.g. the CPU instruction
notice) are off unless TF_CPP_MIN_LOG_LEVEL is set; warnings and errors
stay. With a driver nothing is dropped: a GPU user sees why a GPU is not
used (e.g. a missing CUDA runtime) and TF's device log.
"""

import contextlib
import ctypes
import importlib.abc
import importlib.machinery
import os
import sys
import tempfile

# {package: the top-level packages hidden while its __init__.py runs}.
HIDDEN_WHILE = {
    'tensorflow': ('jax', 'matplotlib', 'keras'),
    # tensorflow_text needs Keras (it subclasses tf.keras.layers.Layer).
    'tensorflow_text': ('jax', 'matplotlib'),
}

# What TensorFlow logs about CUDA on a host with no GPU driver (see 2.).
NO_DRIVER_NOISE = (
    'WARNING: All log messages before absl::InitializeLog() is called',
    'Could not find cuda drivers on your machine',
    'failed call to cuInit',
)


def HasGpuDriver():
  """Whether the NVIDIA driver library loads (what cuInit needs)."""
  try:
    ctypes.CDLL('libcuda.so.1')
  except OSError:
    return False
  return True


@contextlib.contextmanager
def QuietCudaProbe():
  """Drops NO_DRIVER_NOISE from what the block writes to stderr (file
  descriptor 2, so TF's C++ log too) on a host without a GPU driver; the
  rest is written when the block ends, also when it raises."""
  if HasGpuDriver():
    yield
    return
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      yield
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      lines = captured.read().decode('utf-8', 'replace').splitlines(True)
      kept = ''.join(line for line in lines
                     if not any(noise in line for noise in NO_DRIVER_NOISE))
      if kept:
        sys.stderr.write(kept)
        sys.stderr.flush()


class _HidingLoader(importlib.abc.Loader):
  """Runs a package's own loader with `hidden` absent from the import
  system (a None entry in sys.modules makes `import name` raise
  ImportError), then gives the module its own loader back. TensorFlow's
  import also lists the GPUs, both under QuietCudaProbe."""

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
      if module.__name__ == 'tensorflow':
        with QuietCudaProbe():
          self._loader.exec_module(module)
          # The first listing initialises the CUDA platform (cuInit); it
          # does not initialise TF's logical devices.
          module.config.list_physical_devices('GPU')
      else:
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


def Install():
  """A lingshard program's start-up, before TensorFlow is imported: 1. and
  2. of the module docstring."""
  if not HasGpuDriver():
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '1')
  HideOptionalImports()
