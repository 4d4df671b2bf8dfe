"""lingshard: a Lingvo-style TensorFlow zoo for giant conditional-computation
models (GShard, GPipe, Sparsely-Gated MoE).

Importing it changes nothing outside it: a program's start-up savings are
its entry point's (lingshard/startup.py)."""

__version__ = '0.1.0'
