"""The batch decode job (`--mode=decode --decode_input=<glob>
--decode_output=<dir>`): one hypothesis file per input shard, written
whole; a rerun skips complete outputs and redoes missing or short ones;
each worker takes every n-th shard; hypotheses equal --mode=decode's on the
same sentences; bad input is one line and writes nothing."""

import os

import pytest

from lingshard import trainer
from lingshard.train import decode_loop
from tests.trainer import trainer_testlib

MODEL = 'm4.TinyDense'
SPLIT = 'dev_seen_en'


# ------------------------------------------------- shards (no model needed)
def test_outputs_are_named_from_the_output_dir_and_shard_name(tmp_path):
  pairs = decode_loop.ShardOutputs(['/in/a.tsv', '/in/sub/b', '/x/c.noph.tsv'],
                                   str(tmp_path))
  assert pairs == [('/in/a.tsv', f'{tmp_path}/a.hyp.txt'),
                   ('/in/sub/b', f'{tmp_path}/b.hyp.txt'),
                   ('/x/c.noph.tsv', f'{tmp_path}/c.noph.hyp.txt')]
  assert decode_loop.ShardOutputs(['/in/a.tsv'], 'gs://b/out/') == [
      ('/in/a.tsv', 'gs://b/out/a.hyp.txt')]


@pytest.mark.parametrize('inputs,message', [
    (['/in/a.tsv', '/other/a.tsv'],
     '--decode_input: shards /in/a.tsv and /other/a.tsv would both write '
     'a.hyp.txt; give the shards distinct names'),
    (['/in/a b.tsv'],
     "--decode_input: shard '/in/a b.tsv' cannot name an output file: use "
     "letters, digits, '_@.+=-' and no '..'"),
    (['/in/..tsv'],
     "--decode_input: shard '/in/..tsv' cannot name an output file: use "
     "letters, digits, '_@.+=-' and no '..'"),
])
def test_bad_shard_names_are_refused(inputs, message):
  with pytest.raises(decode_loop.ShardError) as e:
    decode_loop.ShardOutputs(inputs, '/out')
  assert str(e.value) == message


def test_workers_split_the_shards():
  pairs = [(f'i{k}', f'o{k}') for k in range(5)]
  shares = [decode_loop.WorkerShards(pairs, w, 2) for w in range(2)]
  assert shares == [pairs[0::2], pairs[1::2]]
  assert decode_loop.WorkerShards(pairs, 0, 1) == pairs


def test_rerun_skips_complete_and_redoes_short_outputs(tmp_path):
  pairs = decode_loop.ShardOutputs(['a.tsv', 'b.tsv'], str(tmp_path))
  calls = []

  def Decode(path):
    calls.append(path)
    return [f'{path} {i}\nline' for i in range(3)]  # A newline is flattened.

  lines = []
  assert decode_loop.DecodeShards(pairs, [3, 3], Decode, lines.append) == (
      ['a.tsv', 'b.tsv'], [])
  out_a, out_b = pairs[0][1], pairs[1][1]
  with open(out_a, encoding='utf-8') as f:
    assert f.read() == 'a.tsv 0 line\na.tsv 1 line\na.tsv 2 line\n'
  assert lines[0] == f'decoded a.tsv -> {out_a} (3 lines)'
  # An interrupted earlier run: a short output (a hand copy) and the
  # temporary sibling of a killed write; only the short one is redone.
  with open(out_b, 'w', encoding='utf-8') as f:
    f.write('b.tsv 0 line\n')
  stale = tmp_path / '.a.hyp.txt.tmp-killed'
  stale.write_text('partial')
  mtime_a = os.stat(out_a).st_mtime_ns
  calls.clear()
  assert decode_loop.DecodeShards(pairs, [3, 3], Decode, lines.append) == (
      ['b.tsv'], ['a.tsv'])
  assert calls == ['b.tsv'] and os.stat(out_a).st_mtime_ns == mtime_a
  assert lines[2] == f'skipped a.tsv: {out_a} is complete (3 lines)'
  assert decode_loop.IsComplete(out_b, 3)
  assert not decode_loop.IsComplete(out_b, 2)
  assert not decode_loop.IsComplete(str(tmp_path / 'missing.hyp.txt'), 0)


# --------------------------------------------- the trainer's decode job
def _Run(*args):
  lines = []
  out = trainer.Execute(trainer_testlib.ParseFlags(*args),
                        printer=lines.append)
  return out, lines


@pytest.fixture(name='trained', scope='module')
def TrainedFixture(prepared_dir, tmp_path_factory):
  """(trainer flags of a 1-step TinyDense checkpoint, the dev rows)."""
  logdir = str(tmp_path_factory.mktemp('log'))
  overrides = ';'.join(trainer_testlib.CorpusOverrides(prepared_dir) +
                       ['task.decode.max_decode_len=8', 'task.decode.jit=False'])
  base = [f'--model={MODEL}', f'--logdir={logdir}',
          f'--params_override={overrides}']
  _Run(*base, '--mode=train', '--max_steps=1')
  with open(os.path.join(prepared_dir, f'{SPLIT}.tsv'),
            encoding='utf-8') as f:
    rows = f.read().splitlines()[:12]
  return base, rows


def _WriteShards(directory, rows):
  """Two shards of the rows: a.tsv (first 7), b.tsv (the rest)."""
  os.makedirs(directory)
  for name, part in (('a.tsv', rows[:7]), ('b.tsv', rows[7:])):
    with open(os.path.join(directory, name), 'w', encoding='utf-8') as f:
      f.write(''.join(r + '\n' for r in part))
  return os.path.join(directory, '*.tsv')


def test_decode_job_resumes_by_shard_and_matches_decode(trained, tmp_path):
  base, rows = trained
  pattern = _WriteShards(str(tmp_path / 'in'), rows)
  out = tmp_path / 'out'
  job = [*base, '--mode=decode', f'--decode_input={pattern}',
         f'--decode_output={out}']
  (decoded, skipped), lines = _Run(*job)
  assert [os.path.basename(p) for p in decoded] == ['a.tsv', 'b.tsv']
  assert skipped == [] and sorted(os.listdir(out)) == ['a.hyp.txt',
                                                        'b.hyp.txt']
  assert lines[-1] == (f'worker 0 of 1: 2 shard(s) decoded, 0 complete, of 2 '
                       f'matching {pattern}')
  hyps = {n: (out / n).read_text(encoding='utf-8').split('\n')[:-1]
          for n in ('a.hyp.txt', 'b.hyp.txt')}
  assert [len(h) for h in hyps.values()] == [7, len(rows) - 7]
  mtimes = {n: os.stat(out / n).st_mtime_ns for n in hyps}
  (decoded, skipped), _ = _Run(*job)
  assert decoded == [] and len(skipped) == 2
  assert {n: os.stat(out / n).st_mtime_ns for n in hyps} == mtimes
  os.remove(out / 'b.hyp.txt')
  # Worker 0 of 2 owns a.tsv only (complete): b.tsv is worker 1's.
  cfg = trainer_testlib.ParseFlags(*job)
  assert trainer.RunDecodeShards(cfg, trainer.BuildParams(cfg)[0],
                                 lambda _: None, share=(0, 2)) == (
                                     [], [os.path.join(tmp_path, 'in',
                                                       'a.tsv')])
  assert not (out / 'b.hyp.txt').exists()
  (decoded, skipped), _ = _Run(*job)
  assert [os.path.basename(p) for p in decoded] == ['b.tsv']
  assert os.stat(out / 'a.hyp.txt').st_mtime_ns == mtimes['a.hyp.txt']
  assert (out / 'b.hyp.txt').read_text(encoding='utf-8').split('\n')[:-1] == (
      hyps['b.hyp.txt'])
  # --mode=decode on the same sentences (both shards, in other batches).
  _Run(*base, '--mode=decode',
       f"--eval_params_override=input.file_pattern='{pattern}'")
  by_lang = {}
  for row, hyp in zip(rows, hyps['a.hyp.txt'] + hyps['b.hyp.txt']):
    by_lang.setdefault(row.split('\t')[0], []).append(hyp)
  logdir = base[1].split('=', 1)[1]
  decode_dir = os.path.join(logdir, 'decode_dev')
  for lang, want in by_lang.items():
    with open(os.path.join(decode_dir, f'{lang}.hyp.txt'),
              encoding='utf-8') as f:
      assert f.read().split('\n')[:-1] == want, lang
  assert len(set(hyps['a.hyp.txt'] + hyps['b.hyp.txt'])) > 1


def test_decode_job_errors_are_one_line_and_write_nothing(trained, tmp_path):
  base, rows = trained
  pattern = _WriteShards(str(tmp_path / 'in'), rows)
  out = tmp_path / 'out'

  def Error(*flags):
    with pytest.raises(trainer.ConfigError) as e:
      _Run(*base, *flags)
    assert not out.exists()
    return str(e.value)

  assert Error('--mode=decode', f'--decode_input={tmp_path}/none*.tsv',
               f'--decode_output={out}') == (
                   f'--decode_input {tmp_path}/none*.tsv: no file matches')
  blocker = tmp_path / 'file'
  blocker.write_text('x')
  assert Error('--mode=decode', f'--decode_input={pattern}',
               f'--decode_output={blocker}/out') == (
                   f'--decode_output {blocker}/out: cannot write there: Not '
                   'a directory; choose another --decode_output')
  with open(tmp_path / 'in' / 'b.tsv', 'a', encoding='utf-8') as f:
    f.write('just a source sentence\n')
  line = len(rows) - 7 + 1
  assert Error('--mode=decode', f'--decode_input={pattern}',
               f'--decode_output={out}') == (
                   f'--decode_input: {tmp_path}/in/b.tsv:{line}: expected 3 '
                   'tab-separated fields (lang, source, target), got 1: '
                   "'just a source sentence'")
  assert Error('--mode=eval', f'--decode_input={pattern}') == (
      '--decode_input / --decode_output are for --mode=decode, not '
      '--mode=eval')
  assert Error('--mode=decode', f'--decode_input={pattern}') == (
      '--decode_input and --decode_output go together: set both (input '
      'shards, output directory)')
