"""The error of an input pipeline, without TensorFlow.

`lingshard.base_input.InputError` is this class. It lives here so that the
corpus tools (`lingshard.data.prepare`, `stats`, `lm_prepare`), whose
errors derive from it (`corpus_io.CorpusError`), start without importing
TensorFlow (~2 s of every such command).
"""


class InputError(ValueError):
  """An input pipeline that cannot produce data: a missing corpus or
  vocabulary, data that yields no batch. The message is one line naming the
  file or param and what to do."""
