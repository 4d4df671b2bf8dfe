"""Which languages and tokens each expert of a trained MoE model gets.

  python -m lingshard.tools.expert_usage --model=m4.TinyMoE --logdir=RUN \
      [--split=Dev] [--max_batches=0] [--json=usage.json]

Shazeer et al. 2017 (App. E, Table 9) find MoE experts "highly specialized
by syntax and/or semantics"; this measures it on a checkpoint. The latest
checkpoint of --logdir is restored as `trainer --mode=eval` restores it
(the registry's params, then --params_file, --params_override,
--eval_params_override, --seed; the task's `InferenceParams`: no dropout
or routing noise, MT layers route each token alone so none is dropped),
and the forward pass runs over --split. Each MoE layer's routing is read
from the layer itself (layers/moe/record.py: the Routing its gate returned
and its dispatch used, mapped back to the [B, T] tokens) and counted per
real (non-padding) token:

- first: the expert of the token's first choice, its top-1 (every real
  token has one; gates whose choices are no ranking, i.e. expert choice and
  strictly balanced, have none and report `all` only);
- all: every dispatched choice (what the experts computed; k per token
  when nothing is dropped),

by the example's language (the batch's `lang`: MT's source language; a
decoder layer's target tokens count under their example's language pair;
LM batches have none and count as `all`) and by token id: an encoder
layer's tokens are the source ids, a decoder layer's the decoder input ids
(BOS, then the target pieces: the token at the position the layer routes),
an LM's its input ids (<s> w1..wn).

The table gives per layer the mutual information I(expert; language) and
I(expert; token) in bits (plug-in estimates, beside what independence
gives by chance, (R-1)(C-1) / (2 N ln 2) for R x C non-empty cells, Miller
1955), and per expert its share of first and of dispatched choices and its
top languages and tokens by lift = P(x | expert) / P(x) among those with
at least --min_count of the expert's --choice counts. --json writes every
count (`Measure`'s docstring).
"""

from lingshard import startup

if __name__ == '__main__':  # A program: its start-up before TF's import.
  startup.Install()

import json
import math
import os
import sys
import types

from absl import flags
import numpy as np
import sentencepiece as spm
import tensorflow as tf

from lingshard import base_input
from lingshard import config_check
from lingshard import model_registry
from lingshard import sharding
from lingshard import trainer
from lingshard.data import lm_inputs
from lingshard.layers import pipeline
from lingshard.layers.moe import base as moe_base
from lingshard.layers.moe import record as routing_record
from lingshard import cli
from lingshard.train import checkpointer
from lingshard.train import overrides

CHOICES = ('first', 'all')
# Batch key of the token ids a layer routes: MT stacks, an LM's one layer.
_SIDE_NAMES = {'src': 'source tokens', 'tgt': 'target (decoder input) '
               'tokens', 'ids': 'input tokens'}
NO_LANGUAGE = 'all'  # The language of batches without `lang` (eval_loop).


def DefineFlags(fv):
  """Defines the tool's flags on FlagValues `fv`."""
  flags.DEFINE_string('model', None, 'Registered MoE model key, e.g. '
                      'm4.TinyMoE.', flag_values=fv)
  flags.DEFINE_string('logdir', None, 'The training run (its latest '
                      'checkpoint in logdir/train).', flag_values=fv)
  flags.DEFINE_enum('split', 'Dev', model_registry.DATASETS, 'Dataset of '
                    'the model to run over.', flag_values=fv)
  flags.DEFINE_integer('max_batches', 0, 'Batches to count; 0 = the whole '
                       '(finite) split.', flag_values=fv)
  flags.DEFINE_string('params_file', None, 'As the trainer\'s.',
                      flag_values=fv)
  flags.DEFINE_string('params_override', '', 'As the trainer\'s: the run\'s '
                      'overrides.', flag_values=fv)
  flags.DEFINE_string('eval_params_override', '', 'As the trainer\'s: '
                      'overrides of the --split dataset only.', flag_values=fv)
  flags.DEFINE_integer('seed', None, 'The run\'s --seed, if it had one.',
                       flag_values=fv)
  flags.DEFINE_enum('choice', 'first', CHOICES, 'Counts the lifts and '
                    'mutual information use.', flag_values=fv)
  flags.DEFINE_integer('top', 5, 'Languages and tokens listed per expert.',
                       flag_values=fv)
  flags.DEFINE_integer('min_count', 5, 'Fewest tokens of an expert a '
                       'language or token needs to be listed.', flag_values=fv)
  flags.DEFINE_string('json', None, 'Also write every count to this JSON '
                      'file.', flag_values=fv)


FLAGS = flags.FlagValues()
DefineFlags(FLAGS)


class UsageError(ValueError):
  """A one-line error of this tool (printed, exit code 1)."""


# ------------------------------------------------------------------ layers
def MoeLayers(task):
  """{path: (name, side, gate class name, E)} of `task`'s MoE layers,
  encoder first; name is the path below the task (`enc/layer_001/moe`),
  side the batch key of the token ids it routes ('src' | 'tgt' | 'ids').
  UsageError for MoE layers in a pipeline or a task of another kind."""
  out = {}
  for layer in task.AllLayers():
    if isinstance(layer, pipeline.PipelinedLayer) and any(
        isinstance(x, moe_base.MoEBase) for x in layer.body.AllLayers()):
      raise UsageError(f'{layer.path} runs MoE layers inside a GPipe '
                       'pipeline, whose routing cannot be recorded '
                       '(layers/moe/record.py); use the same model without '
                       'pipeline_tpl')
    if not isinstance(layer, moe_base.MoEBase):
      continue
    name = layer.path[len(task.path) + 1:]
    side = task.TokenIdsKey(name)
    if side not in _SIDE_NAMES:
      raise UsageError(f'{type(task).__name__}: expert_usage knows the '
                       'token ids of TransformerMTModel and LMTask batches '
                       'only')
    out[layer.path] = (name, side, type(layer).__name__,
                       int(layer.params.num_experts))
  order = list(_SIDE_NAMES)  # Encoder, decoder, LM: the forward order.
  return dict(sorted(out.items(), key=lambda kv: (order.index(kv[1][1]),
                                                  kv[1][0])))


def _TokenIds(batch, side):
  return np.asarray(batch.ids if side == 'ids' else batch[side].ids)


# ---------------------------------------------------------------- counting
def _NewCounts(num_experts):
  return {'expert': np.zeros([num_experts], np.int64), 'lang': {},
          'token': {}}


def _AddPairs(table, keys, experts, num_experts):
  """table[key][expert] += 1 for each (key, expert) pair."""
  if not keys.size:
    return
  pairs, counts = np.unique(np.stack([keys, experts], axis=1), axis=0,
                            return_counts=True)
  for (key, e), c in zip(pairs.tolist(), counts.tolist()):
    row = table.get(key)
    if row is None:
      row = table[key] = np.zeros([num_experts], np.int64)
    row[e] += c


class UsageCounter:
  """Accumulates the routing records of batches (see the module doc)."""

  def __init__(self, layers):
    self.layers = layers
    self.examples = 0
    self.batches = 0
    self._langs = []  # Language names by code (keys of the lang tables).
    self._state = {}  # path -> its counts.

  def _LangCodes(self, langs):
    codes = []
    for lang in langs:
      if lang not in self._langs:
        self._langs.append(lang)
      codes.append(self._langs.index(lang))
    return np.asarray(codes, np.int64)

  def _Layer(self, path, num_experts, choices):
    if path not in self._state:
      self._state[path] = dict(
          real_tokens=0, dropped_choices=0, choices_per_token=choices,
          first=None, all=_NewCounts(num_experts))
    return self._state[path]

  def Add(self, records, batch, choice_is_expert):
    """Adds one batch: `records` {path: {field: ndarray}} of record.py's
    LayerRouting tensors; `batch` the (host) batch with `lang` if any;
    `choice_is_expert` {path: Routing.choice_is_expert}."""
    unknown = sorted(set(records) - set(self.layers))
    if unknown:
      raise UsageError(f'routing recorded for {unknown[0]}, which is not an '
                       'MoE layer of the task')
    self.batches += 1
    if not records:
      return
    b = next(iter(records.values()))['real_bt'].shape[0]
    self.examples += b
    langs = ([x.decode('utf-8') for x in np.asarray(batch.lang)]
             if 'lang' in batch else [NO_LANGUAGE] * b)
    lang_b = self._LangCodes(langs)
    for path, rec in sorted(records.items()):
      _, side, _, num_experts = self.layers[path]
      expert_btk = np.asarray(rec['expert_btk']).astype(np.int64)
      real_bt = np.asarray(rec['real_bt'])
      ids_bt = _TokenIds(batch, side)
      if ids_bt.shape != real_bt.shape:
        raise UsageError(f'{path} routed {list(real_bt.shape)} tokens but '
                         f'the batch\'s {side} ids are {list(ids_bt.shape)}')
      _, t, k = expert_btk.shape
      lang_bt = np.broadcast_to(lang_b[:, None], [b, t])
      by_rank = not choice_is_expert[path]
      state = self._Layer(path, num_experts, k if by_rank else None)
      state['real_tokens'] += int(real_bt.sum())
      disp_btk = np.asarray(rec['dispatched_btk']) & real_bt[..., None]
      wanted_btk = np.asarray(rec['wanted_btk']) & real_bt[..., None]
      state['dropped_choices'] += int((wanted_btk & ~disp_btk).sum())
      if by_rank:
        if state['first'] is None:
          state['first'] = _NewCounts(num_experts)
        self._Count(state['first'], expert_btk[..., 0][real_bt],
                    lang_bt[real_bt], ids_bt[real_bt], num_experts)
      lang_btk = np.broadcast_to(lang_bt[..., None], [b, t, k])
      ids_btk = np.broadcast_to(ids_bt[..., None], [b, t, k])
      self._Count(state['all'], expert_btk[disp_btk], lang_btk[disp_btk],
                  ids_btk[disp_btk], num_experts)

  @staticmethod
  def _Count(counts, experts, langs, ids, num_experts):
    counts['expert'] += np.bincount(experts, minlength=num_experts)
    _AddPairs(counts['lang'], langs, experts, num_experts)
    _AddPairs(counts['token'], ids.astype(np.int64), experts, num_experts)

  def Result(self):
    """{name: counts of the layer} (JSON-ready; Measure's docstring)."""
    def Table(counts):
      if counts is None:
        return None
      return {'expert': counts['expert'].tolist(),
              'lang': {self._langs[c]: row.tolist()
                       for c, row in sorted(counts['lang'].items(),
                                            key=lambda x: self._langs[x[0]])},
              'token': {str(i): row.tolist()
                        for i, row in sorted(counts['token'].items())}}

    out = {}
    for path, (name, side, gate, num_experts) in self.layers.items():
      state = self._Layer(path, num_experts, None)
      out[name] = dict(
          path=path, tokens=side, gate=gate, num_experts=num_experts,
          choices_per_token=state['choices_per_token'],
          real_tokens=state['real_tokens'],
          dropped_choices=state['dropped_choices'],
          first=Table(state['first']), all=Table(state['all']))
    return out


def CountUsage(task, theta, batches, step=0):
  """{layers, examples, batches} (as in Measure) of `task` (an
  inference task) with weights `theta` over `batches` (an iterable of
  input batches, string leaves included)."""
  layers = MoeLayers(task)
  static = {}

  def Forward(theta, batch, step):
    with routing_record.RoutingRecorder() as records:
      task.ComputePredictions(theta, batch, step=step)
    out = {}
    for r in records:
      if r.layer in out:
        raise UsageError(f'{r.layer} ran twice in one forward pass')
      static[r.layer] = r.choice_is_expert
      out[r.layer] = r.Tensors()
    return out

  fn = sharding.Function(Forward, xla_compiled=False)
  counter = UsageCounter(layers)
  step_t = tf.constant(step, tf.int64)
  for batch in batches:
    records = fn(theta, base_input.NumericBatch(batch), step_t)
    counter.Add({k: {f: v.numpy() for f, v in r.items()}
                 for k, r in records.items()}, batch, static)
  return dict(layers=counter.Result(), examples=counter.examples,
              batches=counter.batches)


# --------------------------------------------------------------- the run
def _TrainerConfig(cfg):
  """What trainer.BuildParams reads of the trainer's flags."""
  return types.SimpleNamespace(
      model=cfg.model, params_file=cfg.params_file,
      params_override=cfg.params_override,
      eval_params_override=cfg.eval_params_override, strategy='default',
      max_steps=None, seed=cfg.seed)


def _PieceNames(input_generator, side, ids):
  """{str(id): piece or word} of token `ids` on `side`."""
  if side == 'ids':
    words = lm_inputs.VocabWords(input_generator.params.vocab)
    name = lambda i: words[i] if 0 <= i < len(words) else f'<{i}>'  # noqa: E731
  else:
    src, tgt = input_generator.VocabFiles()
    sp = spm.SentencePieceProcessor(model_file=src if side == 'src' else tgt)
    size = sp.get_piece_size()
    name = lambda i: sp.id_to_piece(i) if 0 <= i < size else f'<{i}>'  # noqa: E731
  return {str(i): name(i) for i in sorted(ids)}


def _CheckFlags(cfg):
  if not cfg.model:
    raise UsageError('--model is required, e.g. --model=m4.TinyMoE')
  if not cfg.logdir:
    raise UsageError('--logdir is required: the training run to read')
  for name in ('max_batches', 'top', 'min_count'):
    if getattr(cfg, name) < 0:
      raise UsageError(f'--{name}={getattr(cfg, name)}: must be >= 0')
  if cfg.json:
    parent = os.path.dirname(os.path.abspath(cfg.json))
    if os.path.isdir(cfg.json) or not os.path.isdir(parent):
      raise UsageError(f'--json {cfg.json}: not a file in an existing '
                       'directory')


def Measure(cfg):
  """The usage of the run --logdir of --model over --split (parsed flags
  `cfg`): {model, logdir, step, split, examples, batches, layers: {name:
  {path, tokens (the side), gate, num_experts, choices_per_token (k, None
  without ranked choices), real_tokens, dropped_choices, first, all}},
  pieces: {side: {id: piece}}}; first / all: {expert: [E] counts, lang:
  {lang: [E]}, token: {id: [E]}} (first None without ranked choices)."""
  _CheckFlags(cfg)
  params, _ = trainer.BuildParams(_TrainerConfig(cfg), cfg.split,
                                  for_eval=True)
  config_check.Validate(params)
  task = trainer.InferenceTask(params)
  if not MoeLayers(task):
    raise UsageError(f'{cfg.model} has no MoE layer')
  theta, step = trainer.RestoredTheta(params, cfg.logdir)
  input_generator = params.input.Instantiate()
  dataset = input_generator.GetDataset()
  if cfg.max_batches:
    dataset = dataset.take(cfg.max_batches)
  elif dataset.cardinality() == tf.data.INFINITE_CARDINALITY:
    raise UsageError(f'--split={cfg.split} is endless: set --max_batches')
  usage = CountUsage(task, theta.Transform(lambda v: v.read_value()),
                     dataset, step)
  pieces = {}
  for layer in usage['layers'].values():
    ids = {int(i) for i in (layer['all'] or {}).get('token', {})}
    pieces.setdefault(layer['tokens'], set()).update(ids)
  usage.update(
      model=cfg.model, logdir=cfg.logdir, step=int(step),
      split=input_generator.SplitName(cfg.split),
      pieces={side: _PieceNames(input_generator, side, ids)
              for side, ids in sorted(pieces.items())})
  return usage


# ------------------------------------------------------------------ table
def MutualInformation(table):
  """(I(X; expert), chance, H(X)) in bits of {x: [E] counts}: plug-in
  estimates; chance = (R-1)(C-1) / (2 N ln 2) over the R x C non-empty
  rows and columns, the bias of the plug-in I under independence."""
  m = np.asarray(list(table.values()), np.float64)
  n = m.sum() if m.size else 0.0
  if n <= 0:
    return 0.0, 0.0, 0.0
  p_xe = m / n
  p_x, p_e = p_xe.sum(1), p_xe.sum(0)
  nz = p_xe > 0
  mi = float(np.sum(p_xe[nz] * np.log2(p_xe[nz] / np.outer(p_x, p_e)[nz])))
  rows, cols = int((p_x > 0).sum()), int((p_e > 0).sum())
  chance = (rows - 1) * (cols - 1) / (2.0 * n * math.log(2.0))
  h = float(-np.sum(p_x[p_x > 0] * np.log2(p_x[p_x > 0])))
  return mi, chance, h


def TopByLift(table, expert, top, min_count):
  """[(x, lift, count)] of `expert`'s `top` x by lift P(x | e) / P(x) among
  those with >= min_count tokens of it (ties: more tokens first)."""
  n = sum(sum(row) for row in table.values())
  n_e = sum(row[expert] for row in table.values())
  found = []
  for x, row in table.items():
    c = row[expert]
    if c and c >= min_count:
      found.append((-(c / n_e) / (sum(row) / n), -c, x))
  return [(x, -lift, -c) for lift, c, x in sorted(found)[:top]]


def _Printable(text):
  return ''.join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def _Share(counts, e):
  if counts is None:
    return f'{"-":>6}'
  return f'{100.0 * counts["expert"][e] / max(sum(counts["expert"]), 1):5.1f}%'


def _LayerLines(name, layer, pieces, choice, top, min_count):
  """The table of one layer (FormatTable)."""
  k, num_experts = layer['choices_per_token'], layer['num_experts']
  kind = choice if layer[choice] is not None else 'all'
  lines = [f'{name} ({layer["gate"]}, {num_experts} experts'
           + (f', top-{k}' if k else '') + f'; {_SIDE_NAMES[layer["tokens"]]}'
           f'): {layer["real_tokens"]} real tokens, '
           f'{sum(layer["all"]["expert"])} dispatched choices, '
           f'{layer["dropped_choices"]} dropped']
  counts = layer[kind]
  by_lang = len(counts['lang']) > 1  # Else one language (an LM: 'all').
  info = []
  for label, table in (('language', counts['lang']),
                       ('token', counts['token'])):
    if len(table) > 1:
      mi, chance, h = MutualInformation(table)
      info.append(f'I(expert; {label}) = {mi:.3f} bits (chance {chance:.3f}'
                  f'; H({label}) = {h:.2f})')
  lines.append(f'  by {kind} choice: ' + ('; '.join(info) or '-'))
  lines.append(f'  {"expert":>6} {"first":>6} {"all":>6}  top ' +
               ('languages / ' if by_lang else '') + 'tokens by lift (count)')
  for e in range(num_experts):
    head = f'  {e:>6} {_Share(layer["first"], e)} {_Share(layer["all"], e)}  '
    toks = '  '.join(f'{_Printable(pieces.get(x, x))} {lift:.1f} ({c})'
                     for x, lift, c in TopByLift(counts['token'], e, top,
                                                 min_count)) or '-'
    if by_lang:
      langs = '  '.join(f'{x} {lift:.1f} ({c})' for x, lift, c in TopByLift(
          counts['lang'], e, top, min_count)) or '-'
      lines += [head + langs, ' ' * len(head) + toks]
    else:
      lines.append(head + toks)
  return lines


def FormatTable(usage, choice='first', top=5, min_count=5):
  """The report text of `usage` (Measure's or CountUsage's): per layer a
  header, the mutual information, then per expert its shares of first and
  of dispatched choices, its top languages (when there are several) and
  its top tokens by lift."""
  lines = []
  if 'model' in usage:
    lines.append(f'{usage["model"]} step {usage["step"]}, split '
                 f'{usage["split"]}: {usage["examples"]} examples in '
                 f'{usage["batches"]} batches')
  pieces = usage.get('pieces', {})
  for name, layer in usage['layers'].items():
    lines += _LayerLines(name, layer, pieces.get(layer['tokens'], {}),
                         choice, top, min_count)
  return '\n'.join(lines)


def WriteJson(path, usage):
  """Writes `usage` to `path` (a temporary file renamed into place)."""
  tmp = f'{path}.tmp{os.getpid()}'
  try:
    with open(tmp, 'w', encoding='utf-8') as f:
      f.write(json.dumps(usage, indent=1, sort_keys=True,
                         ensure_ascii=False) + '\n')
    os.replace(tmp, path)
  except OSError as e:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise UsageError(f'--json {path}: {e.strerror or e}') from None


ERRORS = (UsageError, trainer.ConfigError, overrides.OverrideError,
          checkpointer.CheckpointError, base_input.InputError,
          config_check.ConfigCheckError, routing_record.RecordError)


def Execute(cfg, printer=print):
  """Measures, prints the table, writes --json; returns the usage. Raises
  one of ERRORS (one line) on bad flags, data or checkpoints."""
  usage = Measure(cfg)
  if cfg.json:
    WriteJson(cfg.json, usage)
  printer(FormatTable(usage, cfg.choice, cfg.top, cfg.min_count))
  if cfg.json:
    printer(f'wrote {cfg.json}')
  return usage


def Main(cfg, printer=print):
  """Execute, exiting 1 with `expert_usage: error: ...` on ERRORS."""
  try:
    return Execute(cfg, printer)
  except ERRORS as e:
    sys.exit(f'expert_usage: error: {e}')


def main(argv):
  if len(argv) > 1:
    sys.exit(f'expert_usage: error: unexpected arguments {argv[1:]}')
  Main(FLAGS)


if __name__ == '__main__':
  cli.RunMain(main, FLAGS)
