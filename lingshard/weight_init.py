"""`WeightInit`: how a weight is initialised (method, scale, optional seed).

Kept free of TensorFlow so params text can be parsed without importing it.
Fan-in/fan-out treat every dim but the last two as batch dims (an expert
weight `[E, M, H]` has fan-in M and fan-out H).
"""

import ast
import collections
import re

METHODS = ('gaussian', 'uniform', 'xavier', 'constant', 'gaussian_sqrt_fanin',
           'truncated_gaussian')


class WeightInit(collections.namedtuple('WeightInit',
                                        ['method', 'scale', 'seed'])):
  """Initialisation recipe. Use the constructors, e.g. `WeightInit.Xavier()`.

  - gaussian: N(0, scale^2); truncated_gaussian: same, cut at 2 stddev.
  - gaussian_sqrt_fanin: N(0, (scale / sqrt(fan_in))^2).
  - uniform: U(-scale, scale).
  - xavier: U(-a, a), a = scale * sqrt(6 / (fan_in + fan_out)).
  - constant: every entry is `scale`.
  `seed` (optional) overrides the layer-derived seed for this weight.
  """

  __slots__ = ()

  def __new__(cls, method, scale=1.0, seed=None):
    if method not in METHODS:
      raise ValueError(f'Unknown WeightInit method {method!r}; one of '
                       f'{", ".join(METHODS)}')
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
      raise ValueError(f'WeightInit scale must be a number, got {scale!r}')
    if seed is not None and (isinstance(seed, bool) or
                             not isinstance(seed, int)):
      raise ValueError(f'WeightInit seed must be an int or None, got {seed!r}')
    return super().__new__(cls, method, float(scale), seed)

  @staticmethod
  def Gaussian(scale=1.0, seed=None):
    return WeightInit('gaussian', scale, seed)

  @staticmethod
  def TruncatedGaussian(scale=1.0, seed=None):
    return WeightInit('truncated_gaussian', scale, seed)

  @staticmethod
  def GaussianSqrtFanIn(scale=1.0, seed=None):
    return WeightInit('gaussian_sqrt_fanin', scale, seed)

  @staticmethod
  def Uniform(scale=1.0, seed=None):
    return WeightInit('uniform', scale, seed)

  @staticmethod
  def Xavier(scale=1.0, seed=None):
    return WeightInit('xavier', scale, seed)

  @staticmethod
  def Constant(scale=0.0):
    return WeightInit('constant', scale, None)

  def __repr__(self):
    return (f'WeightInit(method={self.method!r}, scale={self.scale!r}, '
            f'seed={self.seed!r})')

  @classmethod
  def FromText(cls, text):
    """Parses `WeightInit(method=..., scale=..., seed=...)` without eval."""
    if not re.match(r'^WeightInit\(.*\)$', text, re.S):
      raise ValueError(f'bad WeightInit text {text!r}')
    try:
      node = ast.parse(text, mode='eval').body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
      raise ValueError(f'bad WeightInit text {text!r}') from None
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == 'WeightInit'):
      raise ValueError(f'bad WeightInit text {text!r}')
    args = []
    kwargs = {}
    try:
      args = [ast.literal_eval(a) for a in node.args]
      for kw in node.keywords:
        if kw.arg is None:
          raise ValueError('**kwargs')
        kwargs[kw.arg] = ast.literal_eval(kw.value)
      return cls(*args, **kwargs)
    except (ValueError, TypeError, SyntaxError, RecursionError) as e:
      raise ValueError(f'bad WeightInit text {text!r}: {e}') from None


def Fans(shape):
  """(fan_in, fan_out) of a weight shape; leading dims are batch dims."""
  shape = list(shape)
  if not shape:
    return 1, 1
  if len(shape) == 1:
    return shape[0], shape[0]
  return shape[-2], shape[-1]
