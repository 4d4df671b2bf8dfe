"""config_check.CheckValues / CheckHostMemory: a value no mesh or job can
make valid is one exact line, raised by the trainer in every mode (also
print_params) before any device, data, file or weight; a model whose
weights cannot fit in this host's memory is refused before allocating."""

import os

import pytest

from lingshard import config_check
from lingshard import model_registry
from lingshard import trainer
from tests.trainer import trainer_testlib


def _Execute(tmp_path, mode, override, *more, printed=0):
  """The one line; `printed`: lines printed before it (the params diff)."""
  lines = []
  with pytest.raises(config_check.ConfigCheckError) as e:
    trainer.Execute(trainer_testlib.ParseFlags(
        '--model=m4.TinyMoE', f'--mode={mode}', f'--logdir={tmp_path / "run"}',
        '--max_steps=1', f'--params_override={override}', *more),
        printer=lines.append)
  assert len(lines) == printed  # 0: not even the params diff.
  assert os.listdir(tmp_path) == []
  return str(e.value)


@pytest.mark.parametrize('mode,override,message', [
    ('print_params', 'task.model_dim=0',
     'task.model_dim=0: must be an integer >= 1'),
    ('print_params', 'task.model_dim=-128',
     'task.model_dim=-128: must be an integer >= 1'),
    ('print_params', 'task.moe_tpl.num_experts=0',
     'task.moe_tpl.num_experts=0: must be an integer >= 1'),
    ('print_params', 'task.encoder_moe_layers=[99]',
     'task.encoder_moe_layers=[99]: layer index 99 is out of range; '
     'task.num_encoder_layers=2 (indices 0..1)'),
    ('print_params', "task.encoder_moe_layers='abc'",
     "task.encoder_moe_layers='abc': must be None or a list of layer "
     'indices, e.g. [1, 3]'),
    ('print_params', 'task.moe_tpl.num_groups=0',
     'task.moe_tpl.num_groups=0: must be an integer >= 1'),
    # A layer's own check, raised while the config check builds the task.
    ('print_params', 'task.moe_tpl.dropout_rate=1.5',
     'moe: dropout_rate must be in [0, 1)'),
    ('print_params', 'input.bucket_upper_bounds=[]',
     'input.bucket_upper_bounds=[]: must be a non-empty ascending list of '
     'sequence lengths >= 2'),
    ('print_params', 'input.bucket_upper_bounds=[8,16]',
     'input.bucket_batch_limits=[128, 64, 32, 16]: must list one batch size '
     'per bucket of input.bucket_upper_bounds=[8, 16]'),
    ('train', 'input.bucket_batch_limits=[0,0,0,0]',
     'input.bucket_batch_limits=[0, 0, 0, 0]: every batch size must be an '
     'integer >= 1, got 0'),
    ('train', 'input.temperature=-1.0',
     'input.temperature=-1.0: must be > 0 (1 samples languages by their '
     'share of the data; None samples uniformly)'),
    ('train', 'task.dtype=tf.string',
     'task.dtype=tf.string: must be a floating-point dtype (tf.float32, '
     'tf.bfloat16, tf.float16 or tf.float64)'),
    ('train', 'task.train.max_checkpoints_to_keep=0',
     'task.train.max_checkpoints_to_keep=0: must be >= 1 (the latest '
     'checkpoint is the one training resumes from)'),
    ('eval', 'input.eval_batch_size=-3',
     'input.eval_batch_size=-3: must be an integer >= 1'),
])
def test_bad_values_are_one_line_before_anything(tmp_path, mode, override,
                                                 message):
  assert _Execute(tmp_path, mode, override) == message


def test_eval_only_override_is_checked_before_restoring(tmp_path):
  assert _Execute(tmp_path, 'decode', '',
                  '--eval_params_override=input.eval_batch_size=0') == (
                      'input.eval_batch_size=0: must be an integer >= 1')


_TOO_BIG = ("the model's weights take 59.4 TB (16,330,000,000,512 values) "
            'but this host has 16.0 GB of memory available; choose smaller '
            'sizes (e.g. task.model_dim) or a TPU slice (--strategy=tpu)')


def test_weights_beyond_host_memory_are_refused_before_allocating(
    tmp_path, monkeypatch):
  monkeypatch.setattr(config_check, 'HostMemoryBytes', lambda: 16 * 2**30)
  for mode in ('train', 'export'):
    assert _Execute(tmp_path, mode, 'task.model_dim=1000000000',
                    printed=1) == _TOO_BIG


def test_host_memory_check_counts_every_declared_weight():
  """Tiny M4: 2,090,752 float32 values (as count_params counts them)."""
  task = config_check.Validate(model_registry.GetParams('m4.TinyMoE', 'Train'))
  assert config_check.DeclaredWeightBytes(task) == (2090752, 8363008)
  config_check.CheckHostMemory(task, available_bytes=8363008)
  with pytest.raises(config_check.ConfigCheckError) as e:
    config_check.CheckHostMemory(task, available_bytes=8363007)
  assert str(e.value) == (
      "the model's weights take 8.0 MB (2,090,752 values) but this host has "
      '8.0 MB of memory available; choose smaller sizes (e.g. '
      'task.model_dim) or a TPU slice (--strategy=tpu)')


def test_registered_params_pass_for_every_dataset():
  model_registry.ImportAllParams()
  for key in model_registry.ListModels():
    for dataset in model_registry.DATASETS:
      try:
        params = model_registry.GetParams(key, dataset)
      except LookupError:
        continue
      config_check.CheckValues(params)
