"""The model registry: the one piece of global state in lingshard.

`@RegisterSingleTaskModel` records a param class under the key
`<module path under lingshard.params>.<ClassName>` (e.g. `m4.TinyMoE`);
classes defined elsewhere are keyed by their full module path. `GetParams`
imports `lingshard.params.<module>` on demand.
"""

import difflib
import importlib

from lingshard.base_model_params import SingleTaskModelParams

_PARAMS_PACKAGE = 'lingshard.params'
_REGISTRY = {}   # key -> param class
DATASETS = ('Train', 'Dev', 'Test')


def _KeyOf(cls):
  module = cls.__module__
  prefix = _PARAMS_PACKAGE + '.'
  if module.startswith(prefix):
    module = module[len(prefix):]
  return f'{module}.{cls.__name__}'


def RegisterSingleTaskModel(cls):
  """Class decorator: registers a SingleTaskModelParams subclass."""
  if not (isinstance(cls, type) and issubclass(cls, SingleTaskModelParams)):
    raise TypeError(f'{cls!r} must subclass SingleTaskModelParams')
  key = _KeyOf(cls)
  if key in _REGISTRY and _REGISTRY[key] is not cls:
    raise ValueError(f'Duplicate model key {key!r}: already registered by '
                     f'{_REGISTRY[key].__module__}.{_REGISTRY[key].__name__}')
  _REGISTRY[key] = cls
  return cls


def _ImportFor(key):
  """Imports `lingshard.params.<module>` for `<module>.<Class>` keys."""
  module = key.rpartition('.')[0]
  if not module:
    return
  try:
    importlib.import_module(f'{_PARAMS_PACKAGE}.{module}')
  except ModuleNotFoundError as e:
    if e.name and not f'{_PARAMS_PACKAGE}.{module}'.startswith(e.name):
      raise  # A real missing dependency inside the params module.


def ImportAllParams():
  """Imports every module under lingshard.params (to list all models)."""
  import pkgutil  # pylint: disable=g-import-not-at-top
  package = importlib.import_module(_PARAMS_PACKAGE)
  for info in sorted(pkgutil.iter_modules(package.__path__),
                     key=lambda i: i.name):
    importlib.import_module(f'{_PARAMS_PACKAGE}.{info.name}')


def GetClass(key):
  """The registered param class for `key`; LookupError with suggestions."""
  if key not in _REGISTRY:
    _ImportFor(key)
  if key not in _REGISTRY:
    ImportAllParams()
  if key not in _REGISTRY:
    close = difflib.get_close_matches(key, sorted(_REGISTRY), n=5, cutoff=0.5)
    hint = ('did you mean ' + ', '.join(close) + '?') if close else (
        'known models: ' + ', '.join(sorted(_REGISTRY)))
    raise LookupError(f'Model {key!r} is not registered; {hint}')
  return _REGISTRY[key]


def GetParams(key, dataset='Train'):
  """Model params of `key` with `input` set to its `dataset` input params."""
  cls = GetClass(key)
  name = dataset.capitalize() if isinstance(dataset, str) else dataset
  if name not in DATASETS:
    raise LookupError(f'Unknown dataset {dataset!r}; one of {DATASETS}')
  instance = cls()
  p = instance.Model()
  p.input = getattr(instance, name)()
  return p


def ListModels():
  """Sorted keys of every registered model (importing lingshard.params)."""
  ImportAllParams()
  return sorted(_REGISTRY)


def Describe(key):
  """One-line description of a model: its class docstring's first line."""
  doc = (GetClass(key).__doc__ or '').strip()
  return doc.splitlines()[0] if doc else ''
