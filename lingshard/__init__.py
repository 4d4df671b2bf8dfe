"""lingshard: a Lingvo-style TensorFlow zoo for giant conditional-computation
models (GShard, GPipe, Sparsely-Gated MoE)."""

__version__ = '0.1.0'
