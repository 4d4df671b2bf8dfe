"""The smoke run trains the registered toy model: its loss falls."""

from lingshard.tools import smoke


def test_smoke_run_reduces_loss():
  lines = []
  losses = smoke.TrainSteps('toy.FFRegression', steps=60, log_every=20,
                     printer=lines.append)
  assert len(losses) == 60
  assert sum(losses[-10:]) / 10 < 0.5 * sum(losses[:10]) / 10
  assert lines[-1].startswith('toy.FFRegression: 1377 parameters, 60 steps')
