"""Batches of prepared images (lingshard/data/image_prepare.py's files).

`ImageInput` reads DIR/{split}_images.npy (uint8 [N, H, W]) and
DIR/{split}_labels.npy (uint8 [N]) with np.load(allow_pickle=False) and
yields NestedMap(image float32 [B, H, W, 1] (pixels / 255), label int32
[B]). Training: the examples shuffled by `seed`, epoch after epoch, every
batch full; eval (`is_inference`): one pass in file order, the last batch
possibly smaller.

`UnavailableImageInput`: a paper config's input whose images are absent
(ImageNet 2012): batch shapes only; reading data is a one-line InputError.
"""

import os

import numpy as np
import tensorflow as tf

from lingshard import base_input
from lingshard.data import image_prepare
from lingshard.nested_map import NestedMap


class ImageInput(base_input.BaseInputGenerator):
  """Prepared image batches (module docstring)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('data_dir', image_prepare.DEFAULT_OUT,
             'A directory written by lingshard.data.image_prepare.')
    p.Define('split', 'train', 'train | test.')
    p.Define('batch_size', 64, 'Examples per batch.')
    p.Define('seed', 1234, 'Shuffle seed.')
    p.Define('is_inference', False, 'Eval: one pass in file order.')
    return p

  def SplitName(self, dataset):
    return self.params.split

  def BatchSpec(self, bucket=-1):
    del bucket
    b = self.params.batch_size
    return NestedMap(image=tf.TensorSpec([b, 28, 28, 1], tf.float32),
                     label=tf.TensorSpec([b], tf.int32))

  def Arrays(self):
    """(images uint8 [N, H, W], labels uint8 [N]); InputError if missing."""
    p = self.params
    if p.split not in image_prepare.SPLITS:
      raise base_input.InputError(f'split must be one of '
                                  f'{image_prepare.SPLITS}, got {p.split!r}')
    out = []
    for kind in ('images', 'labels'):
      path = os.path.join(p.data_dir, f'{p.split}_{kind}.npy')
      if not os.path.isfile(path):
        raise base_input.InputError(
            f'prepared images not found: {path}; run '
            f'{image_prepare.PrepareCommand(p.data_dir)}')
      try:
        out.append(np.load(path, allow_pickle=False))
      except (OSError, ValueError) as e:
        raise base_input.InputError(f'{path}: not a numpy array file: '
                                    f'{e}') from None
    images, labels = out
    if (images.dtype != np.uint8 or images.ndim != 3 or
        labels.shape != images.shape[:1]):
      raise base_input.InputError(
          f'{p.data_dir}: {p.split} images {images.dtype} {images.shape} and '
          f'labels {labels.shape} are not uint8 [N, H, W] and [N]')
    return images, labels

  def GetDataset(self):
    p = self.params
    images, labels = self.Arrays()
    ds = tf.data.Dataset.from_tensor_slices((images, labels))
    train = not p.is_inference
    if train:
      ds = ds.shuffle(len(labels), seed=p.seed,
                      reshuffle_each_iteration=True).repeat()
    ds = ds.batch(p.batch_size, drop_remainder=train)

    def ToBatch(image, label):
      return NestedMap(
          image=tf.cast(image, tf.float32)[..., tf.newaxis] / 255.0,
          label=tf.cast(label, tf.int32))

    return ds.map(ToBatch)


class UnavailableImageInput(base_input.BaseInputGenerator):
  """The input of a paper config whose images this project cannot provide
  (ImageNet 2012: no pinned source ships it). Its params and `BatchSpec`
  describe the paper's batches (for tools that need no data: count_params,
  config_check); reading data is a one-line InputError that names the
  config to train instead."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dataset', 'ImageNet 2012', 'What the paper trained on.')
    p.Define('image_shape', (224, 224, 3), '(H, W, C) of the images.')
    p.Define('split', 'train', 'train | test.')
    p.Define('batch_size', 128, 'Examples per batch.')
    p.Define('is_inference', False, 'Eval batches.')
    p.Define('instead', '', 'A registered config on available images.')
    return p

  def SplitName(self, dataset):
    return self.params.split

  def BatchSpec(self, bucket=-1):
    del bucket
    p = self.params
    return NestedMap(
        image=tf.TensorSpec([p.batch_size, *p.image_shape], tf.float32),
        label=tf.TensorSpec([p.batch_size], tf.int32))

  def GetDataset(self):
    p = self.params
    hint = f'; train {p.instead} instead' if p.instead else ''
    raise base_input.InputError(
        f'{p.dataset} images are not available here (no pinned source ships '
        f'them): this config is for count_params and config_check{hint}')
