"""`BaseLayer`: Lingvo's layer contract on tf.Module.

A layer is configured by its `Params()`, builds children with `CreateChild`
and declares weights with `CreateVariable` in `__init__`, and computes with
`FProp(theta, *inputs)` where `theta` is a NestedMap of its weights and its
children's thetas. Because FProp takes theta explicitly, a step is a pure
function of (theta, inputs): remat, pipelining, manual partitioning and HLO
export need nothing else.

Variables are declared in `__init__` and created lazily, for the whole tree at
once, the first time any theta/variables are asked for: the full path of each
weight (`model/enc/layer_000/moe/wi`) is only known once the parent links
exist, and parameter counting can walk the declarations without allocating.
Initial values come from stateless RNG seeded by (random_seed, weight path),
so they do not depend on the creation order of unrelated layers.
"""

import functools
import re
import zlib

import numpy as np
import tensorflow as tf

from lingshard import hyperparams
from lingshard import sharding
from lingshard.nested_map import NestedMap
from lingshard.weight_init import Fans
from lingshard.weight_init import WeightInit

_NAME_RE = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*$')
# Params a child takes from its parent when it leaves them as None.
INHERITED_PARAMS = ('dtype', 'fprop_dtype', 'params_init', 'random_seed',
                    'device_mesh', 'mesh_axis_names', 'batch_axes',
                    'is_inference')
# The logical mesh axis of batch dims in activation split mappings: resolved
# by ShardActivation to the layer's `batch_axes` (one mesh axis or a tuple).
BATCH = 'batch'
_ROOT_DEFAULTS = {
    'dtype': tf.float32,
    'params_init': WeightInit.Xavier(1.0),
    'random_seed': 1234,
    'batch_axes': 0,
    'is_inference': False,
}


def WeightParams(shape, init=None, dtype=None, device_mesh=None,
                 tensor_split_dims_mapping=None, trainable=True,
                 count_update_rate=None, update_rule=None):
  """Declares one weight; None fields are filled from the layer's params."""
  p = hyperparams.Params()
  p.Define('shape', list(shape), 'Weight shape.')
  p.Define('init', init, 'WeightInit; None = the layer\'s params_init.')
  p.Define('dtype', dtype, 'Variable dtype; None = the layer\'s dtype.')
  p.Define('device_mesh', device_mesh, 'Device mesh; None = the layer\'s.')
  p.Define('tensor_split_dims_mapping', tensor_split_dims_mapping,
           'Mesh axis per dim (-1 replicated); None = the layer\'s '
           'weight_split_dims_mapping.<name>.')
  p.Define('trainable', trainable, 'Whether gradients update this weight.')
  p.Define('count_update_rate', count_update_rate, 'None: the optimizer '
           'updates the weight (if trainable). A rate gamma: its gradient '
           'slot carries what update_rule reads (e.g. counts) and the train '
           'step sets w = update_rule.Updated(w, slot, gamma) instead, '
           'outside the optimizer and the gradient norm.')
  p.Define('update_rule', update_rule, 'With count_update_rate: a class '
           'whose Updated(w, slot, rate) is the new weight (e.g. '
           'layers/moe/bias_balance.CountBalance).')
  return p


def ResolveParams(params, platform=None, inference=False):
  """The one visitor of the params hooks: for every layer params in the
  tree `params` (in place, depth first), `cls.ForPlatform(p, platform)`
  when a platform is given and `cls.ForInference(p)` when `inference`.
  Returns the dotted keys that were set."""
  keys = []
  for prefix, sub in params.IterParams():
    if not isinstance(sub, hyperparams.InstantiableParams):
      continue
    cls = sub.cls
    if not (isinstance(cls, type) and issubclass(cls, BaseLayer)):
      continue
    names = []
    if platform is not None:
      names += cls.ForPlatform(sub, platform)
    if inference:
      names += cls.ForInference(sub)
    keys += [f'{prefix}.{n}' if prefix else n for n in names]
  return keys


def StableSeed(*parts):
  """A 31-bit seed from strings/ints, stable across runs and processes."""
  text = '/'.join(str(p) for p in parts)
  return zlib.crc32(text.encode('utf-8')) & 0x7FFFFFFF


class BaseLayer(tf.Module):
  """Base class of all layers (see the module docstring)."""

  @classmethod
  def Params(cls):
    """The params that configure this layer class."""
    p = hyperparams.InstantiableParams(cls)
    p.Define('name', '', 'Layer name: one path component of weight names.')
    p.Define('dtype', None, 'Weight dtype; None inherits (root: float32).')
    p.Define('fprop_dtype', None,
             'Activation dtype (e.g. bfloat16); None inherits (root: dtype).')
    p.Define('params_init', None,
             'Default WeightInit; None inherits (root: Xavier(1.0)).')
    p.Define('random_seed', None,
             'Seed of initialisation and routing randomness; None inherits '
             '(root: 1234).')
    p.Define('device_mesh', None,
             'ndarray of device ids: the logical mesh; None = no sharding.')
    p.Define('mesh_axis_names', None, 'Optional names of the mesh axes.')
    p.Define('batch_axes', None,
             "The mesh axis (index or name), or tuple of axes, that "
             "activation mappings' logical 'batch' entry means (data "
             'parallelism; e.g. (\'data\', \'expert\') on a data x expert '
             'mesh, where dense layers split the batch over both); None '
             'inherits (root: mesh axis 0).')
    p.Define('weight_split_dims_mapping', hyperparams.Params(),
             'Per weight name: the mesh axis of each dim (-1 replicated).')
    p.Define('activation_split_dims_mapping', hyperparams.Params(),
             'Per activation name: the mesh axis of each dim.')
    p.Define('is_inference', None, 'Inference mode (no dropout, eval '
             'capacity); None inherits (root: False).')
    return p

  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    init = cls.__dict__.get('__init__')
    if init is not None:
      cls.__init__ = _TrackInit(init)

  def __init__(self, params):
    if not isinstance(params, hyperparams.InstantiableParams):
      raise TypeError(f'{type(self).__name__} takes its Params(), got '
                      f'{type(params).__name__}')
    p = params.Copy()
    for key, value in _ROOT_DEFAULTS.items():
      if p.Get(key) is None:
        p.Set(**{key: value})
    if p.fprop_dtype is None:
      p.fprop_dtype = p.dtype
    if not p.name:
      p.name = _SnakeCase(type(self).__name__)
    if not _NAME_RE.match(p.name):
      raise ValueError(f'Layer name {p.name!r} is not an identifier.')
    if p.device_mesh is not None:
      p.device_mesh = sharding.ValidateDeviceMesh(p.device_mesh)
    super().__init__(name=p.name)
    d = self.__dict__
    d['_params'] = p.Freeze()
    d['_parent'] = None
    d['_child_name'] = p.name
    d['_children'] = {}        # name -> layer | [layers] | {key: layer}
    d['_weight_params'] = {}   # name -> resolved WeightParams
    d['_vars'] = None          # name -> tf.Variable once created
    d.setdefault('_init_depth', 0)

  # ----------------------------------------------- params resolution hooks
  @classmethod
  def ForPlatform(cls, p, platform):
    """Sets, in `p` (this class's params), what they leave to the platform
    the program runs on ('cpu' | 'gpu' | 'tpu', lingshard.platform);
    returns the keys set. Applied by `ResolveParams`; default: nothing."""
    del p, platform
    return []

  @classmethod
  def ForInference(cls, p):
    """Sets, in `p`, what the layer changes to decode token by token (a
    decoding task's `InferenceParams` applies it through `ResolveParams`);
    returns the keys set. Default: nothing."""
    del p
    return []

  # ------------------------------------------------------ training hooks
  # What the trainer, the config check and the pipeline ask of any layer;
  # a layer family with its own rules (layers/moe/) overrides them, so
  # those callers need no knowledge of it.
  @classmethod
  def ForPipeline(cls, p, owner):
    """`p` (this class's params) made fit to run inside a GPipe pipeline
    body, or ValueError (one line, naming `owner`, the stack) if it cannot
    run there. Default: unchanged."""
    del owner
    return p

  @classmethod
  def CombineMetricParts(cls, parts):
    """The metrics of a batch from those of its disjoint parts (a
    pipeline's micro-batches; NestedMaps of one structure). Default: the
    mean of each value."""
    return parts[0].Pack([tf.add_n(list(v)) / float(len(parts))
                          for v in zip(*[m.Flatten() for m in parts])])

  def ExpertWeights(self):
    """{own weight name: E} of weights whose leading dim is E experts:
    a warm start tiles a checkpoint's dense or E1-expert value over E
    (train/init_rules.py). Default: none."""
    return {}

  def WeightLayout(self):
    """An int array recorded in checkpoints (train/checkpointer.py): which
    layer each slot of this layer's stacked weights holds (-1: padding).
    A checkpoint with another layout is refused, since weights of one
    shape would restore permuted. Default: None (no layout)."""
    return None

  def CheckMeshFit(self, axis_size):
    """ValueError (one line) if the layer's split does not fit its mesh;
    `axis_size(axis) -> (size, label)` of a mesh axis (config_check).
    Default: nothing to check."""
    del axis_size

  def CheckTokensFit(self, tokens, where):
    """ValueError (one line) if the layer cannot run on `tokens` tokens
    per (micro-)batch, described by `where` (config_check). Default:
    nothing to check."""
    del tokens, where

  # ------------------------------------------------------------- properties
  @property
  def params(self):
    """The layer's resolved, frozen params."""
    return self._params

  @property
  def parent(self):
    return self._parent

  @property
  def path(self):
    """`root/child/grandchild` path; weight names are `path/weight`."""
    if self._parent is None:
      return self._child_name
    return f'{self._parent.path}/{self._child_name}'

  @property
  def fprop_dtype(self):
    return self._params.fprop_dtype

  @property
  def layer_seed(self):
    """A seed unique to this layer: (random_seed, path)."""
    return StableSeed(self._params.random_seed, self.path)

  def __getattr__(self, name):
    children = self.__dict__.get('_children')
    if children is not None and name in children:
      return children[name]
    raise AttributeError(f'{type(self).__name__} has no attribute or child '
                         f'{name!r}')

  # ----------------------------------------------------------- construction
  def CheckPositive(self, *names):
    """Raises ValueError naming the params unless every one is > 0."""
    p = self._params
    values = [p.Get(n) for n in names]
    if any(v is None or v <= 0 for v in values):
      listed = names[0] if len(names) == 1 else (
          ', '.join(names[:-1]) + ' and ' + names[-1])
      raise ValueError(f'{p.name}: {listed} must be > 0, got '
                       + ', '.join(str(v) for v in values))

  def CheckOneOf(self, name, choices):
    """Raises ValueError naming the param unless its value is in choices."""
    p = self._params
    value = p.Get(name)
    if value not in choices:
      raise ValueError(f'{p.name}: {name} must be one of {choices}, got '
                       f'{value!r}')

  def _CheckInInit(self, what):
    if self.__dict__.get('_init_depth', 0) <= 0:
      raise RuntimeError(f'{what} may only be called in __init__ '
                         f'({type(self).__name__} {self.path}).')

  def _CheckNewName(self, name):
    if not isinstance(name, str) or not _NAME_RE.match(name):
      raise ValueError(f'Name {name!r} is not an identifier.')
    if name in self._children or name in self._weight_params:
      raise ValueError(f'{self.path} already has a child or weight {name!r}')
    if hasattr(type(self), name):
      raise ValueError(f'{name!r} clashes with an attribute of '
                       f'{type(self).__name__}')

  def _ChildParams(self, name, params):
    if not isinstance(params, hyperparams.InstantiableParams):
      raise TypeError(f'child {name!r} needs InstantiableParams, got '
                      f'{type(params).__name__}')
    p = params.Copy()
    for key in INHERITED_PARAMS:
      if p.Get(key) is None:
        p.Set(**{key: self._params.Get(key)})
    p.name = name
    return p

  def _Adopt(self, child, name):
    if not isinstance(child, BaseLayer):
      raise TypeError(f'child {name!r} is a {type(child).__name__}, not a '
                      'BaseLayer')
    child.__dict__['_parent'] = self
    child.__dict__['_child_name'] = name
    return child

  def CreateChild(self, name, params):
    """Instantiates `params` as child `name` (only in __init__)."""
    self._CheckInInit('CreateChild')
    self._CheckNewName(name)
    child = self._Adopt(self._ChildParams(name, params).Instantiate(), name)
    self._children[name] = child
    return child

  def CreateChildren(self, name, params_list):
    """A list (children `name_000`, ...) or dict of children under `name`."""
    self._CheckInInit('CreateChildren')
    self._CheckNewName(name)
    if isinstance(params_list, dict):
      kids = {}
      for key in sorted(params_list):
        sub = f'{name}_{key}'
        kids[key] = self._Adopt(
            self._ChildParams(sub, params_list[key]).Instantiate(), sub)
    elif isinstance(params_list, (list, tuple)):
      kids = []
      for i, cp in enumerate(params_list):
        sub = f'{name}_{i:03d}'
        kids.append(self._Adopt(self._ChildParams(sub, cp).Instantiate(), sub))
    else:
      raise TypeError('CreateChildren takes a list or dict of params.')
    self._children[name] = kids
    return kids

  def CreateVariable(self, name, weight_params):
    """Declares weight `name`; it is created with the rest of the tree."""
    self._CheckInInit('CreateVariable')
    self._CheckNewName(name)
    p = self._params
    wp = weight_params.Copy()
    if wp.init is None:
      wp.init = p.params_init
    if wp.dtype is None:
      wp.dtype = p.dtype
    if wp.device_mesh is None:
      wp.device_mesh = p.device_mesh
    if (wp.tensor_split_dims_mapping is None and
        name in p.weight_split_dims_mapping):
      wp.tensor_split_dims_mapping = p.weight_split_dims_mapping.Get(name)
    if wp.device_mesh is not None and wp.tensor_split_dims_mapping is not None:
      mesh = sharding.ValidateDeviceMesh(wp.device_mesh)
      sharding.ResolveSplitDimsMapping(wp.tensor_split_dims_mapping,
                                       mesh.ndim, len(wp.shape),
                                       p.mesh_axis_names)
    self._weight_params[name] = wp.Freeze()

  # -------------------------------------------------------------- children
  def _ChildItems(self):
    """[(name, layer | [layers] | {key: layer})] in name order."""
    return sorted(self._children.items())

  def AllLayers(self):
    """This layer and every descendant, depth first (children by name)."""
    yield self
    for _, c in self._ChildItems():
      for layer in _Layers(c):
        yield from layer.AllLayers()

  @property
  def children(self):
    return dict(self._children)

  @property
  def weight_params(self):
    """{name: WeightParams} this layer declared (not its children's)."""
    return dict(self._weight_params)

  def DeclaredWeights(self):
    """NestedMap like theta, with WeightParams leaves; allocates nothing."""
    return self._ThetaLike(lambda layer, name: layer._weight_params[name])

  # -------------------------------------------------------------- variables
  def _Root(self):
    layer = self
    while layer._parent is not None:
      layer = layer._parent
    return layer

  def InstantiateVariables(self):
    """Creates every declared variable of the whole tree (once)."""
    root = self._Root()
    if any(layer._init_depth > 0 for layer in (self, root)):
      raise RuntimeError('variables are created after __init__; do not ask '
                         'for theta inside __init__')
    with tf.init_scope():
      for layer in root.AllLayers():
        if layer._vars is None:
          layer._CreateOwnVariables()

  def _CreateOwnVariables(self):
    created = {}
    for name, wp in sorted(self._weight_params.items()):
      created[name] = tf.Variable(self.InitialWeightValue(name, wp),
                                  name=f'{self.path}/{name}',
                                  trainable=wp.trainable)
    self.__dict__['_vars'] = None
    self._vars = created  # tf.Module tracks the dict (checkpoints).

  # ------------------------------------------- weight hooks (public, stable)
  def InitialWeightValue(self, name, wp):
    """Hook: the initial tensor of own weight `name` (resolved
    WeightParams `wp`). Default: `wp.init` by stateless RNG seeded by
    (random_seed, weight path) unless the init fixes a seed. A layer whose
    variables stack several layers' weights (pipeline_weights) overrides
    it to initialise each slice as its own layer."""
    return InitialValue(wp, self.WeightSeed(f'{self.path}/{name}', wp))

  def WeightSeed(self, path, wp):
    """The initialisation seed of the weight at `path`: the init's own
    seed, else one derived from (random_seed, path)."""
    if wp.init.seed is not None:
      return wp.init.seed
    return StableSeed(self._params.random_seed, path)

  def PackOwnWeights(self, own):
    """Hook: how theta (and vars, DeclaredWeights) hold this layer's own
    weights, given `own` = {weight name: leaf}. Default: a NestedMap by
    name. A layer whose variables are its body's weights stacked (the
    pipeline) packs them in the body's theta structure instead."""
    return NestedMap({name: own[name] for name in sorted(own)})

  @property
  def vars(self):
    """NestedMap of variables of this layer and its children."""
    self.InstantiateVariables()
    return self._ThetaLike(lambda layer, name: layer._vars[name])

  @property
  def theta(self):
    """The layer's weights as a NestedMap, the first arg of FProp."""
    return self.vars

  @property
  def variables(self):
    self.InstantiateVariables()
    return super().variables

  @property
  def trainable_variables(self):
    self.InstantiateVariables()
    return super().trainable_variables

  def _ThetaLike(self, leaf_fn):
    out = self.PackOwnWeights({name: leaf_fn(self, name)
                               for name in self._weight_params})
    for name, c in self._ChildItems():
      if isinstance(c, BaseLayer):
        out[name] = c._ThetaLike(leaf_fn)
      elif isinstance(c, list):
        out[name] = [k._ThetaLike(leaf_fn) for k in c]
      else:
        out[name] = NestedMap({str(k): c[k]._ThetaLike(leaf_fn)
                               for k in sorted(c)})
    return out

  # --------------------------------------------------------------- sharding
  def ShardTheta(self, theta):
    """Annotates every weight in `theta` with its declared sharding.

    Call once at the top of a compiled step so the weight layout reaches
    XLA (the argument then carries a Sharding custom-call in the HLO).
    """
    out = NestedMap()
    for name, value in theta.items():
      if name in self._weight_params:
        wp = self._weight_params[name]
        out[name] = sharding.mesh_split(value, wp.device_mesh,
                                        wp.tensor_split_dims_mapping,
                                        self._params.mesh_axis_names)
      elif name in self._children:
        c = self._children[name]
        if isinstance(c, BaseLayer):
          out[name] = c.ShardTheta(value)
        elif isinstance(c, list):
          out[name] = [k.ShardTheta(v) for k, v in zip(c, value)]
        else:
          out[name] = NestedMap({k: c[k].ShardTheta(value[k]) for k in value})
      else:
        raise KeyError(f'{self.path}: theta has unknown key {name!r}')
    return out

  def ShardActivation(self, t, key):
    """Annotates activation `t` by `activation_split_dims_mapping.<key>`."""
    p = self._params
    if key not in p.activation_split_dims_mapping:
      raise KeyError(f'{self.path}: no activation_split_dims_mapping.{key} '
                     'defined')
    mapping = p.activation_split_dims_mapping.Get(key)
    if mapping is not None:
      mapping = [p.batch_axes if a == BATCH else a for a in mapping]
    return sharding.mesh_split(t, p.device_mesh, mapping, p.mesh_axis_names)

  # ------------------------------------------------------------------ fprop
  def FProp(self, theta, *args, **kwargs):
    """Computes the layer's output from explicit weights `theta`."""
    raise NotImplementedError(f'{type(self).__name__}.FProp')

  def __call__(self, *args, **kwargs):
    """`FProp` with the layer's own (sharding-annotated) variables."""
    return self.FProp(self.ShardTheta(self.theta), *args, **kwargs)


def _Layers(c):
  if isinstance(c, BaseLayer):
    return [c]
  if isinstance(c, dict):
    return [c[k] for k in sorted(c)]
  return list(c)


def _TrackInit(init):
  """Marks a layer as under construction while its __init__ runs."""

  @functools.wraps(init)
  def Wrapped(self, *args, **kwargs):
    depth = self.__dict__.get('_init_depth', 0)
    self.__dict__['_init_depth'] = depth + 1
    try:
      init(self, *args, **kwargs)
    finally:
      self.__dict__['_init_depth'] = depth

  return Wrapped


def _SnakeCase(name):
  return re.sub(r'(?<!^)(?=[A-Z])', '_', name).lower()


def InitialValue(wp, seed):
  """Initial tensor of a weight from its WeightInit, by stateless RNG."""
  init = wp.init
  shape = [int(d) for d in wp.shape]
  dtype = tf.as_dtype(wp.dtype)
  rng_seed = tf.constant([seed, 0x5EED], tf.int32)
  fan_in, fan_out = Fans(shape)
  if init.method == 'constant':
    return tf.fill(shape, tf.cast(init.scale, dtype))
  if init.method in ('gaussian', 'gaussian_sqrt_fanin', 'truncated_gaussian'):
    stddev = init.scale
    if init.method == 'gaussian_sqrt_fanin':
      stddev = init.scale / np.sqrt(max(fan_in, 1))
    fn = (tf.random.stateless_truncated_normal
          if init.method == 'truncated_gaussian' else
          tf.random.stateless_normal)
    return tf.cast(fn(shape, rng_seed, stddev=stddev), dtype)
  limit = init.scale
  if init.method == 'xavier':
    limit = init.scale * np.sqrt(6.0 / max(fan_in + fan_out, 1))
  return tf.cast(tf.random.stateless_uniform(shape, rng_seed, -limit, limit),
                 dtype)
