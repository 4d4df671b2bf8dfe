"""The convnet through the trainer (in this process; the pipelined one's
step is tests/models/test_image_model.py's): batch
norm's moving averages are trained, checkpointed, restored bit-exactly on
resume, and evaluation reports accuracy with them."""

import json
import os

import numpy as np

from lingshard import model_registry
from lingshard.data import image_prepare
from tests.data import image_testlib
from tests.trainer import trainer_testlib


def _Args(logdir, data_dir, max_steps, mode='train'):
  return ['--model=gpipe.MnistResNet', f'--logdir={logdir}',
          f'--max_steps={max_steps}', f'--mode={mode}', '--seed=5',
          f"--params_override=input.data_dir='{data_dir}';"
          'input.batch_size=8;task.channels=4;task.num_blocks=2;'
          'task.stem_pre_channels=[2];'
          'task.train.save_interval_steps=2',
          f"--eval_params_override=input.data_dir='{data_dir}'"]


def test_moving_averages_train_resume_bitwise_and_feed_eval(tmp_path):
  data = str(tmp_path / 'digits')
  image_prepare.Prepare(image_testlib.FakeWheel(tmp_path / 'fake.whl'), data)
  straight, resumed = tmp_path / 'straight', tmp_path / 'resumed'
  want, got = trainer_testlib.StraightAndResumed(
      lambda logdir, steps: _Args(logdir, data, steps), straight, resumed)
  moving = [k for k in want if k.startswith('theta/') and
            k.split('/')[-3] == 'moving']
  # The stems' BNs (stem_pre_000, stem) and the 2 blocks' two BNs each.
  assert len(moving) == 6, moving
  decay = model_registry.GetParams('gpipe.MnistResNet', 'Train').task.bn_decay
  for key in moving:
    # Trained: the debiasing row is 1 - decay^4 after 4 steps, not 0.
    np.testing.assert_allclose(want[key][..., 2, :], 1.0 - decay**4,
                               rtol=1e-5)
  for key in want:
    np.testing.assert_array_equal(got[key], want[key], err_msg=key)
  trainer_testlib.Run(*_Args(resumed, data, 4, mode='eval'))
  with open(os.path.join(resumed, 'eval_dev', 'metrics-00000004.json'),
            encoding='utf-8') as f:
    result = json.load(f)
  assert result['languages']['all']['examples'] == 1000
  assert 0.0 <= result['metrics']['accuracy'] <= 1.0
