"""The image demo (`python -m lingshard.tools.demo
--model=gpipe.MnistResNetPipelined`) end to end on digits prepared from the
tests' small wheel, for 2 steps of a narrow model: the trainer binary
trains the pipelined convnet with --jit, evaluates every test digit, and the
demo prints the evaluation's accuracy beside the softmax-regression
baseline."""

import json
import os
import re

from lingshard.data import image_prepare
from lingshard.tools import demo_image
from tests.data import image_testlib
from tests.trainer import trainer_testlib


def test_image_models_read_their_prepared_digits():
  for model in ('gpipe.MnistResNet', 'gpipe.MnistResNetPipelined',
                'gpipe.MnistAmoebaNetPipelined'):
    assert demo_image.IsImage(model)
    assert demo_image.DataDir(model) == image_prepare.DEFAULT_OUT
  assert not demo_image.IsImage('toy.FFRegression')


def test_demo_trains_the_pipelined_convnet_and_scores_the_test_digits(
    tmp_path):
  data = str(tmp_path / 'digits')
  image_prepare.Prepare(image_testlib.FakeWheel(tmp_path / 'fake.whl'), data)
  logdir = str(tmp_path / 'log')
  run = trainer_testlib.RunModule(
      'lingshard.tools.demo', '--model=gpipe.MnistResNetPipelined',
      f'--data_dir={data}', f'--logdir={logdir}', '--max_steps=2',
      '--params_override=task.channels=4;task.num_blocks=2;input.batch_size=8')
  assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
  assert re.search(r'^step 2/2 loss \d+\.\d+', run.stdout, re.M), run.stdout
  assert 'strategy default: 1 replica(s), jit on' in run.stdout
  table = run.stdout.split('softmax regression on the pixels ==\n', 1)[1]
  row = table.splitlines()[1].split()
  with open(os.path.join(logdir, 'eval_dev', 'metrics-00000002.json'),
            encoding='utf-8') as f:
    metrics = json.load(f)['metrics']
  baseline = demo_image.SoftmaxRegression(data)
  assert row == ['test', '1000', f'{metrics["accuracy"]:.4f}',
                 f'{metrics["acc5"]:.4f}', f'{baseline:.4f}',
                 'yes' if metrics['accuracy'] > baseline else 'NO']
  assert re.search(r'^model gpipe\.MnistResNetPipelined; step 2; training '
                   r'\d+\.\d min', run.stdout, re.M), run.stdout
