"""lingshard: a Lingvo-style TensorFlow zoo for giant conditional-computation
models (GShard, GPipe, Sparsely-Gated MoE)."""

from lingshard import startup

__version__ = '0.1.0'

# ~1.2 s off every command's TensorFlow import, ~0.6 s off tensorflow_text's
# (lingshard/startup.py).
startup.HideOptionalImports()
