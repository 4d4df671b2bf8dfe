"""The error of an input pipeline that cannot produce data.

Input generators (e.g. `lingshard.data.inputs.MtInput`) raise `InputError`
(or a subclass such as `lingshard.data.corpus_io.CorpusError`) when data is
read, never when params are built; the trainer and the tools catch it and
print its one-line message.
"""


class InputError(ValueError):
  """An input pipeline that cannot produce data: a missing corpus or
  vocabulary, data that yields no batch. The message is one line naming the
  file or param and what to do."""
