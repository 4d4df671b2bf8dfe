"""Subprocess helper of test_multi_host.py: one worker of a multi-worker
job (TF_CONFIG from the environment) running the trainer's main path on
the given flags, recording every example its input pipeline fed the step.
argv[1]: the JSON file to write ({'rows': [[src ids, tgt labels]],
'batch_rows': [rows per step], 'lines': the trainer's output}); the rest are trainer flags."""

from lingshard import startup

if __name__ == '__main__':  # A program: its start-up before TF's import.
  startup.Install()

import gc
import json
import sys

import numpy as np

from lingshard import trainer
from lingshard.train import train_loop
from tests.trainer import trainer_testlib


def Main(out_path, flags):
  seen = {'rows': [], 'batch_rows': []}
  step = train_loop.Trainer.Step

  def RecordingStep(self, batch):
    src, tgt = batch.src, batch.tgt
    rows = []
    for ids, pad, lab, tpad in zip(*(np.asarray(x) for x in (
        src.ids, src.paddings, tgt.labels, tgt.paddings))):
      rows.append([ids[pad == 0].tolist(), lab[tpad == 0].tolist()])
    seen['rows'].extend(rows)
    seen['batch_rows'].append(len(rows))
    return step(self, batch)

  train_loop.Trainer.Step = RecordingStep
  lines = []
  trainer.Execute(trainer_testlib.ParseFlags(*flags), printer=lines.append)
  seen['lines'] = lines
  with open(out_path, 'w', encoding='utf-8') as f:
    json.dump(seen, f)


if __name__ == '__main__':
  # A test process, like the pytest workers (tests/conftest.py): no
  # automatic collection while TF traces (replica_routing_helper: 56.9 ->
  # 51.6 s).
  gc.disable()
  Main(sys.argv[1], sys.argv[2:])
