"""Every registered config's fit-critical settings, pinned.

What decides whether a config fits its devices and runs as its docstring
says (re-materialisation, batch per bucket, device mesh, pipeline, MoE
dispatch and groups, activation dtype, sampled softmax) is set in
`lingshard/params/`, far from anything that would notice a change: with
`m4.MoE128E36L`'s remat back to 'none' the config needs 21-241 GiB per core
(scripts/bench_paper_scale.py), and nothing else in the suite fails. A
change here is deliberate: update the table with the reason in the commit.
Params only; no model is built.
"""

import numpy as np
import pytest

from lingshard import model_registry

# Shared values (GShard Table 3 batches: 1M / 4M target tokens over three
# length buckets; the Tiny configs' four buckets; the LM corpus's three).
M4_1M, M4_4M, M4_BOUNDS = (32768, 16384, 8192), (131072, 65536, 32768), (
    32, 64, 128)
TINY, TINY_BOUNDS = (128, 64, 32, 16), (8, 16, 32, 64)
LM, LM_BOUNDS = (64, 32, 16), (16, 32, 64)
GPIPE_L = dict(remat='none', batch=(32,), bounds=(1024,))
TINY_MT = dict(remat='none', mesh=(8,), axes=('x',), batch=TINY,
               bounds=TINY_BOUNDS)
TINY_MOE = dict(TINY_MT, moe=('auto', 8, None, 1.0))
LM1B = dict(batch=LM, bounds=LM_BOUNDS, sampled=8192)
LM1B_MOE = dict(LM1B, moe=('auto', 1, None, None))
LM_TINY = dict(batch=LM, bounds=LM_BOUNDS, sampled=0)
LM_TINY_MOE = dict(LM_TINY, mesh=(8,), moe=('auto', 8, None, 1.25))


def _Paper(remat, devices, batch, groups, **kw):
  return dict(remat=remat, mesh=(devices,), axes=('x',),
              moe=('auto', groups, None, 1.0), batch=batch, bounds=M4_BOUNDS,
              **kw)


# key: settings that are not None. pipeline = (num_stages,
# num_micro_batches, remat); moe = (dispatch_impl, num_groups, group_size,
# capacity_factor); mesh = device_mesh shape; batch = bucket_batch_limits
# (or batch_size); repeats = a circular schedule's; bounds =
# bucket_upper_bounds; dtype = fprop_dtype.
EXPECTED = {
    'gpipe.TinyDensePipelined': dict(
        remat='none', mesh=(2, 4), pipeline=(4, 4, True), batch=TINY,
        bounds=TINY_BOUNDS),
    'gpipe.TinyMoEPipelined': dict(
        remat='none', mesh=(2, 2, 2), axes=('data', 'expert', 'stage'),
        batch_axes=('data', 'expert'), pipeline=(2, 4, True),
        moe=('auto', None, 64, 1.0), batch=TINY, bounds=TINY_BOUNDS),
    # Circular (R = 2): K * R = 4 chunks; TinyMoE's is twice as deep.
    'gpipe.TinyDensePipelinedCircular': dict(
        remat='none', mesh=(4, 2), pipeline=(2, 4, True), repeats=2,
        batch=TINY, bounds=TINY_BOUNDS),
    'gpipe.TinyMoEPipelinedCircular': dict(
        remat='none', mesh=(2, 2, 2), axes=('data', 'expert', 'stage'),
        batch_axes=('data', 'expert'), pipeline=(2, 4, True), repeats=2,
        moe=('auto', None, 64, 1.0), batch=TINY, bounds=TINY_BOUNDS),
    # GShard's T(96L) with R = 3: bubble 7% instead of 19%.
    'gpipe.DenseT96LCircular': dict(
        remat='none', mesh=(128, 16), axes=('data', 'stage'),
        pipeline=(16, 64, True), repeats=3, batch=M4_4M, bounds=M4_BOUNDS),
    # GPipe's image half on CPU (MNIST digits): K = 2, M = 4, remat.
    'gpipe.MnistResNet': dict(batch=64),
    'gpipe.MnistResNetPipelined': dict(pipeline=(2, 4, True), batch=64),
    # AmoebaNet: Table 1's batch 128 on a data-parallel mesh, or pipelined
    # (the cell pipeline) on data x stage: B(18, 512) on §4.1's 4
    # partitions, D(18, 256) K = 4 x 2 replicas, M = 8; the MNIST ones at
    # MnistResNet's 64, pipelined as MnistResNetPipelined.
    'gpipe.AmoebaNetB_18_512': dict(mesh=(4,), axes=('data',), batch=128),
    'gpipe.AmoebaNetD_18_256': dict(mesh=(8,), axes=('data',), batch=128),
    'gpipe.AmoebaNetB_18_512Pipelined': dict(
        mesh=(1, 4), axes=('data', 'stage'), pipeline=(4, 8, True),
        batch=128),
    'gpipe.AmoebaNetD_18_256Pipelined': dict(
        mesh=(2, 4), axes=('data', 'stage'), pipeline=(4, 8, True),
        batch=128),
    'gpipe.MnistAmoebaNet': dict(batch=64),
    'gpipe.MnistAmoebaNetPipelined': dict(pipeline=(2, 4, True), batch=64),
    'gpipe.TransformerL3': GPIPE_L,
    'gpipe.TransformerL13': dict(GPIPE_L, pipeline=(1, 32, True)),
    'gpipe.TransformerL103': dict(GPIPE_L, mesh=(8,), pipeline=(8, 32, True)),
    'gpipe.TransformerL415': dict(GPIPE_L, mesh=(32,),
                                  pipeline=(32, 32, True)),
    'gpipe.TransformerL1663': dict(GPIPE_L, mesh=(128,),
                                   pipeline=(128, 32, True)),
    'lm1b.LSTM2048x512': LM1B,
    'lm1b.LSTM4x512': LM1B,
    'lm1b.MoE4': LM1B_MOE,
    'lm1b.MoE32': LM1B_MOE,
    'lm1b.MoE256': LM1B_MOE,
    'lm1b.MoE256H': LM1B_MOE,
    'lm1b.MoE1024H': LM1B_MOE,
    'lm1b.MoE4096H': LM1B_MOE,
    'lm1b.TinyLSTM': LM_TINY,
    'lm1b.TinyLSTMLarge': LM_TINY,
    'lm1b.TinyMoE': LM_TINY_MOE,
    'lm1b.TinyMoELarge': LM_TINY_MOE,
    'm4.DenseT96L': dict(
        remat='none', mesh=(128, 16), axes=('data', 'stage'),
        pipeline=(16, 64, True), batch=M4_4M, bounds=M4_BOUNDS),
    # GShard §5.1: 36L and up, and more than 2,048 tokens per core, remat.
    'm4.MoE128E12L': _Paper('layer', 128, M4_1M, 512),
    'm4.MoE128E36L': _Paper('layer', 128, M4_1M, 512),
    'm4.MoE512E12L': _Paper('none', 512, M4_1M, 512),
    'm4.MoE512E36L': _Paper('layer', 512, M4_1M, 512),
    'm4.MoE2048E12L': _Paper('none', 2048, M4_4M, 2048),
    'm4.MoE2048E36L': _Paper('layer', 2048, M4_4M, 2048),
    'm4.MoE2048E60L': _Paper('layer', 2048, M4_4M, 2048, dtype='bfloat16'),
    # The pipeline remats per stage; groups by size (512 tokens).
    'm4.MoE2048E36LPipelined': dict(
        remat='none', mesh=(1024, 2), axes=('x', 'stage'),
        pipeline=(2, 8, True), moe=('auto', None, 512, 1.0), batch=M4_4M,
        bounds=M4_BOUNDS),
    'm4.TinyDense': TINY_MT,
    'm4.TinyDenseLarge': TINY_MT,
    'm4.TinyMoE': TINY_MOE,
    'm4.TinyMoELarge': TINY_MOE,
    'm4.TinyMoE12L': TINY_MOE,
    'm4.TinyMoE16E': TINY_MOE,
    'm4.TinyMoE32E': TINY_MOE,
    'm4.TinyMoE4E': dict(TINY_MOE, mesh=(4,)),
    'm4.TinyMoEShared': TINY_MOE,
    'm4.TinyMoEUpcycled': TINY_MOE,
    'toy.FFRegression': dict(batch=64),
}


def _FitSettings(p):
  """The pinned settings of model params `p` that are not None."""
  t, i = p.task, p.input
  pipe = t.pipeline_tpl if 'pipeline_tpl' in t else None
  moe = t.moe_tpl if 'moe_tpl' in t else None
  facts = dict(
      remat=t.remat if 'remat' in t else None,
      dtype=None if t.fprop_dtype is None else t.fprop_dtype.name,
      mesh=None if t.device_mesh is None else np.shape(t.device_mesh),
      axes=None if t.mesh_axis_names is None else tuple(t.mesh_axis_names),
      batch_axes=t.batch_axes if 'batch_axes' in t else None,
      pipeline=None if pipe is None else (
          pipe.num_stages, pipe.num_micro_batches, pipe.remat),
      # A circular schedule's repeats (the bubble; chunks per stage).
      repeats=(pipe.schedule.repeats if pipe is not None and
               'schedule' in pipe and 'repeats' in pipe.schedule else None),
      moe=None if moe is None else (
          moe.dispatch_impl, moe.num_groups,
          moe.group_size if 'group_size' in moe else None,
          moe.capacity_factor),
      batch=(tuple(i.bucket_batch_limits) if 'bucket_batch_limits' in i
             else i.batch_size),
      bounds=(tuple(i.bucket_upper_bounds) if 'bucket_upper_bounds' in i
              else None),
      sampled=t.num_sampled if 'num_sampled' in t else None)
  return {k: v for k, v in facts.items() if v is not None}


def test_every_registered_config_is_in_the_table():
  assert sorted(EXPECTED) == model_registry.ListModels()


@pytest.mark.parametrize('key', sorted(EXPECTED))
def test_fit_critical_settings(key):
  assert _FitSettings(model_registry.GetParams(key, 'Train')) == EXPECTED[key]
