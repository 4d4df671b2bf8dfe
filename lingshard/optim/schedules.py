"""Learning-rate schedules: pure functions of the int64 step.

`step` is the number of updates applied before this one; each schedule uses
t = step + 1 (the 1-based update number), so the first update sees t = 1.

- `constant`:    lr
- `rsqrt`:       linear warmup to lr over w steps, then rsqrt decay
                 (Vaswani et al. 2017): lr * min(t / w, sqrt(w / t))
- `rsqrt_decay`: lr / sqrt(max(t, w)); a plateau of lr / sqrt(w), then rsqrt
                 decay. GShard (§4): Adafactor, lr 1.0, w = 10k, which is the
                 Adafactor paper's relative step min(1e-2, 1/sqrt(t)).
"""

import tensorflow as tf

SCHEDULES = ('constant', 'rsqrt', 'rsqrt_decay')


def LearningRate(name, learning_rate, warmup_steps, step):
  """The learning rate of schedule `name` at `step` (float32 scalar)."""
  if name not in SCHEDULES:
    raise ValueError(f'Unknown lr_schedule {name!r}; one of '
                     f'{", ".join(SCHEDULES)}')
  lr = tf.constant(learning_rate, tf.float32)
  if name == 'constant':
    return lr
  t = tf.cast(step, tf.float32) + 1.0
  w = tf.constant(float(max(warmup_steps, 1)), tf.float32)
  if name == 'rsqrt':
    return lr * tf.minimum(t / w, tf.sqrt(w / t))
  return lr * tf.math.rsqrt(tf.maximum(t, w))
