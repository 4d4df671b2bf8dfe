"""`SingleTaskModelParams`: what a registered model param class provides."""


class SingleTaskModelParams:
  """Base of registered param classes (Lingvo's vocabulary).

  Subclasses implement `Task()` (the task layer's params) and
  `Train()/Dev()/Test()` (input generator params). `Model()` wraps the task
  as `SingleTaskModel` params; `model_registry.GetParams` sets its `input`.
  """

  def Task(self):
    raise NotImplementedError(f'{type(self).__name__}.Task')

  def Train(self):
    raise NotImplementedError(f'{type(self).__name__}.Train')

  def Dev(self):
    return self.Train()

  def Test(self):
    return self.Dev()

  def Model(self):
    from lingshard.models import base_model  # pylint: disable=g-import-not-at-top
    return base_model.SingleTaskModel.Params().Set(task=self.Task())
