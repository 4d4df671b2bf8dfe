"""Toy models: small enough for the core tests and the smoke run."""

from lingshard import model_registry
from lingshard.base_model_params import SingleTaskModelParams
from lingshard.models import regression_model


@model_registry.RegisterSingleTaskModel
class FFRegression(SingleTaskModelParams):
  """A 2-hidden-layer MLP regressing a synthetic teacher (smoke test)."""

  def Train(self):
    return regression_model.RegressionInput.Params().Set(batch_size=64)

  def Dev(self):
    return self.Train().Set(seed=302)

  def Test(self):
    return self.Train().Set(seed=303)

  def Task(self):
    p = regression_model.FeedForwardRegression.Params().Set(
        name='model', input_dim=8, hidden_dims=[32, 32])
    p.train.Set(optimizer='adam', learning_rate=1e-2, max_steps=200)
    return p
