"""Shazeer et al. 2017 App. C.1 models: Table 7's parameter counts."""

import pytest

from lingshard import model_registry
from lingshard.params import lm1b
from lingshard.tools import count_params


@pytest.mark.parametrize('name', sorted(lm1b.PAPER_COUNTS))
def test_app_c_counts_excluding_embedding_and_softmax(name):
  # A small vocabulary: the counted layers do not depend on it.
  task = lm1b.Model(name, vocab_size=16).Instantiate()
  c = count_params.CountTask(task)
  counted = c.total - c.by_kind['embedding']
  assert abs(counted / 1e6 / lm1b.PAPER_COUNTS[name] - 1) <= 0.05, counted
  if name in lm1b.MOE_MODELS:
    assert c.by_kind['experts'] == lm1b.MOE_MODELS[name][0] * 2 * 512 * 1024


def test_unknown_model_is_one_line():
  with pytest.raises(ValueError, match=r"^unknown App. C model 'MoE-8'; one "
                     r'of 4xLSTM-512, '):
    lm1b.Model('MoE-8')


@pytest.mark.parametrize('key,data_dir', [
    ('lm1b.TinyMoE', lm1b.DATA_DIR), ('lm1b.TinyLSTM', lm1b.DATA_DIR),
    ('lm1b.TinyMoELarge', lm1b.LARGE_DATA_DIR),
    ('lm1b.TinyLSTMLarge', lm1b.LARGE_DATA_DIR)])
def test_tiny_configs_read_their_corpus_and_size_its_vocab(
    key, data_dir, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  for dataset in model_registry.DATASETS:
    p = model_registry.GetParams(key, dataset).input
    assert (p.file_pattern, p.vocab) == (
        f'{data_dir}/{dataset.lower()}.txt', f'{data_dir}/vocab.txt')
  assert model_registry.GetParams(key).task.vocab_size == 10004  # Unbuilt.
  (tmp_path / data_dir).mkdir(parents=True)
  (tmp_path / data_dir / 'vocab.txt').write_text(
      '\n'.join(['<pad>', '<s>', '</s>', '<unk>'] + ['w'] * 96) + '\n')
  assert model_registry.GetParams(key).task.vocab_size == 100
