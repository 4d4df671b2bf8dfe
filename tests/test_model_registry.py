"""Model registry: keys, duplicates, on-demand import, suggestions."""

import pytest

from lingshard import model_registry
from lingshard.base_model_params import SingleTaskModelParams
from lingshard.models import base_model
from lingshard.models import regression_model


def test_get_params_imports_on_demand_and_sets_input():
  p = model_registry.GetParams('toy.FFRegression', 'Train')
  assert p.cls is base_model.SingleTaskModel
  assert p.task.name == 'model'
  assert p.input.batch_size == 64
  dev = model_registry.GetParams('toy.FFRegression', 'Dev')
  assert dev.input.seed != p.input.seed
  assert 'toy.FFRegression' in model_registry.ListModels()
  assert model_registry.Describe('toy.FFRegression').startswith(
      'A 2-hidden-layer MLP')


def test_lookup_error_lists_close_matches():
  with pytest.raises(LookupError) as e:
    model_registry.GetParams('toy.FFRegresion', 'Train')
  assert str(e.value) == ("Model 'toy.FFRegresion' is not registered; "
                          'did you mean toy.FFRegression?')
  with pytest.raises(LookupError, match=r"Unknown dataset 'Eval'"):
    model_registry.GetParams('toy.FFRegression', 'Eval')


def test_duplicate_key_is_an_error(monkeypatch):
  # A copy of the registry, so DupModel is not listed after this test.
  monkeypatch.setattr(model_registry, '_REGISTRY',
                      dict(model_registry._REGISTRY))

  def Make():
    class DupModel(SingleTaskModelParams):
      """A duplicate (complete, so every-model tests can run it)."""

      def Task(self):
        return regression_model.FeedForwardRegression.Params()

      def Train(self):
        return regression_model.RegressionInput.Params()

    return DupModel

  first = model_registry.RegisterSingleTaskModel(Make())
  key = f'{first.__module__}.DupModel'
  assert model_registry.GetClass(key) is first
  with pytest.raises(ValueError) as e:
    model_registry.RegisterSingleTaskModel(Make())
  assert str(e.value).startswith(f'Duplicate model key {key!r}')


def test_register_requires_model_params_class():
  with pytest.raises(TypeError, match='must subclass SingleTaskModelParams'):
    model_registry.RegisterSingleTaskModel(dict)


def test_model_instantiates_task_and_input():
  model = model_registry.GetParams('toy.FFRegression', 'Train').Instantiate()
  batch = next(iter(model.GetInput().GetDataset()))
  metrics, _ = model.task.FProp(model.task.theta, batch)
  assert metrics.loss[0].shape == ()
