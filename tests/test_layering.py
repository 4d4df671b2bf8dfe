"""Module layering (what `farm-studio look` reads): the data commands do
not import the tools, and the generic layers (lingshard/layers/*.py) do
not import the MoE family (lingshard/layers/moe/), at module level or
inside functions. Read from the source (ast), nothing is imported."""

import ast
import glob
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _Imported(path):
  """Every module name `path` imports (`from a import b`: a and a.b)."""
  with open(path, encoding='utf-8') as f:
    tree = ast.parse(f.read(), path)
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      names.add(node.module)
      names.update(f'{node.module}.{alias.name}' for alias in node.names)
  return names


def _Offenders(pattern, forbidden):
  out = {}
  for path in sorted(glob.glob(os.path.join(REPO, pattern))):
    bad = sorted(name for name in _Imported(path)
                 if name == forbidden or name.startswith(forbidden + '.'))
    if bad:
      out[os.path.relpath(path, REPO)] = bad
  return out


@pytest.mark.parametrize('pattern,forbidden', [
    ('lingshard/data/*.py', 'lingshard.tools'),
    # A layer family's rules reach generic layers through BaseLayer's
    # hooks (ForPipeline, CombineMetricParts, ...), never an import.
    ('lingshard/layers/*.py', 'lingshard.layers.moe'),
])
def test_no_back_arrow(pattern, forbidden):
  assert _Offenders(pattern, forbidden) == {}


def test_the_check_sees_an_import():
  # What the rule reads: `from lingshard import cli` is lingshard.cli.
  assert _Offenders('lingshard/tools/smoke.py', 'lingshard.cli') == {
      'lingshard/tools/smoke.py': ['lingshard.cli']}
