"""Export: a SavedModel with a `translate` signature (in-graph
SentencePiece), reloaded with plain tf.saved_model.load in a fresh process,
translates raw strings with the exported weights."""

import json
import subprocess
import sys

import numpy as np
import sentencepiece as spm

from lingshard.models import mt_export
from tests.trainer import fake_translation
from tests.trainer import trainer_testlib

RELOAD = r'''
import json, sys
import tensorflow as tf
import tensorflow_text  # Registers the SentencePiece ops.
model = tf.saved_model.load(sys.argv[1])
source = tf.constant(json.loads(sys.argv[2]))
language = tf.fill(tf.shape(source), 'de')
out = model.signatures['translate'](source=source, language=language)
direct = model.translate(source=source, language=language)['translation']
assert out['translation'].numpy().tolist() == direct.numpy().tolist()
print(json.dumps([t.decode('utf-8') for t in out['translation'].numpy()]))
'''


def test_export_reload_in_fresh_process_translates(tmp_path):
  _, spm_path = fake_translation.WriteCorpus(str(tmp_path / 'corpus'))
  sp = spm.SentencePieceProcessor(model_file=spm_path)
  task = fake_translation.NewTask()
  # Weights that differ from their initial values: swap two words.
  table = np.arange(60, dtype=np.float32)
  cat, dog = sp.piece_to_id('▁cat'), sp.piece_to_id('▁dog')
  table[cat], table[dog] = dog, cat
  task.vars.table.assign(table)
  out_dir = str(tmp_path / 'export' / '00000007')
  mt_export.Export(task, task.vars, spm_path, spm_path, out_dir, batch_size=2,
                max_source_length=5)
  del task  # Nothing of this process is needed to translate.
  # 5 sources: 3 Decode calls of the static batch 2, the last one padded.
  sources = ['the cat sat on the mat', 'a dog ran', 'read the book',
             'zebra cat', 'close all the windows']
  run = subprocess.run(
      [sys.executable, '-c', RELOAD, out_dir, json.dumps(sources)],
      env=trainer_testlib.TrainerEnv(), capture_output=True, text=True,
      timeout=300, check=False)
  assert run.returncode == 0, run.stderr[-3000:]
  got = json.loads(run.stdout.strip().splitlines()[-1])
  assert got == [
      'the dog sat on',  # Truncated to 4 source pieces + EOS.
      'a cat ran',
      'read the book',
      sp.decode([sp.unk_id(), dog]),  # An unknown word stays <unk>.
      'close all the windows',
  ]
