"""The (MoE) Transformer encoder-decoder for translation (GShard §2.1, §4).

Source ids -> embedding * sqrt(M) + sinusoidal positions -> dropout ->
encoder stack; target inputs likewise -> decoder stack (causal
self-attention, cross-attention over the encoder output) -> softmax over
the target vocabulary (its own weights, or the target embedding when
`share_tgt_embedding_softmax`). With `share_src_tgt_embedding` (one
vocabulary for both sides) a single table `tgt_emb` embeds source and
target, so a subword the source shares with English (names, code,
numbers, placeholders) has one vector: copying it is easy to learn. MoE layers replace every other FFN of both
stacks (or the layers `encoder_moe_layers` / `decoder_moe_layers` name).
With `pipeline_tpl` (GPipe, Huang et al. 2019) both stacks run as
pipelines of K stages and M micro-batches (transformer.TransformerStack);
the math, loss and gradients are those of the same model unpipelined, and
decoding runs the same weights unpipelined.

Loss (GShard §2.2): `loss = xent + sum_l aux_l`, where xent is the
label-smoothed per-token cross-entropy averaged over non-padding target
tokens and aux_l the auxiliary load-balancing loss of MoE layer l, already
weighted by that layer (e.g. top2.MoELayer's `aux_loss_weights.group_aux` k). Metrics
(name -> (value, weight)): `loss`, `xent`, `log_pplx` (unsmoothed
per-token nll), `aux_loss` (the sum), `num_tgt_tokens`, `num_src_tokens`,
and per MoE layer `{enc|dec}_layer_XXX_aux_loss` and
`{enc|dec}_layer_XXX_<routing metric>` (nested_map.FlattenMetrics;
per-expert metrics are vectors, which summaries write as histograms).

The decoder refuses an MoE layer whose training routing is not causal
(later target tokens could change an earlier token's experts: its class's
`RoutingLeaks`, layers/moe/causality.py) unless `allow_noncausal_routing`
(GShard's configs set it: m4.py); the encoder takes any gate.

Decoding (`Decode`) runs the encoder once, then the decoder one token at a
time with cached self-attention keys/values: greedy (beam_size 1),
standard beam search or GShard App. A.1's flat beam search, with GNMT
length normalisation. It needs a task built with `is_inference=True`
(`TransformerMTModel.InferenceParams`): no dropout, and MoE layers with
an eval capacity that cannot drop a token of a single sentence. The
trainer's decode and export modes use `CreateDecoder` (mt_decoder.py) and
`CreateExportModule` (mt_export.py).
"""

import tensorflow as tf

from lingshard import hyperparams
from lingshard.decoding import beam_search
from lingshard.decoding import flat_beam_search
from lingshard.decoding import greedy
from lingshard.layers import attention
from lingshard.layers import base_layer
from lingshard.layers import dropout
from lingshard.layers import embedding
from lingshard.layers import position
from lingshard.layers.moe import causality
from lingshard.layers.moe import metrics as routing_metrics
from lingshard.layers import softmax
from lingshard.layers import transformer
from lingshard.models import base_model
from lingshard.models import mt_decoder
from lingshard.models import mt_export
from lingshard.nested_map import NestedMap


def DecodeParams():
  """Default decoding hyper-parameters (`p.decode`)."""
  p = hyperparams.Params()
  p.Define('beam_size', 4, 'Beam size k; 1 = greedy.')
  p.Define('max_decode_len', 64, 'Most target tokens (including EOS).')
  p.Define('length_norm_alpha', 0.6, 'GNMT length normalisation alpha.')
  p.Define('flat_beam', True, 'Flat beam search (GShard App. A.1) instead '
           'of re-ordering cached keys/values.')
  p.Define('jit', True, 'XLA-compile each batch\'s whole search (the '
           'decoder of --mode=decode; scripts/bench_decode.py measured '
           'greedy 3.4x and flat beam 2.3x faster on CPU than op by op).')
  return p


class TransformerMTModel(base_model.BaseTask):
  """Encoder-decoder Transformer with optional MoE FFNs; see module doc."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('src_vocab_size', 0, 'Source vocabulary size.')
    p.Define('tgt_vocab_size', 0, 'Target vocabulary size.')
    p.Define('model_dim', 0, 'Model dim M.')
    p.Define('hidden_dim', 0, 'FFN and MoE expert hidden dim H.')
    p.Define('num_heads', 0, 'Attention heads.')
    p.Define('dim_per_head', 0, 'Attention key/value dim per head.')
    p.Define('num_encoder_layers', 0, 'Encoder Transformer layers.')
    p.Define('num_decoder_layers', 0, 'Decoder Transformer layers.')
    p.Define('norm_policy', 'pre', 'pre | post layer norm.')
    p.Define('input_dropout_prob', 0.0, 'Dropout on embeddings+positions.')
    p.Define('residual_dropout_prob', 0.0, 'Dropout on sublayer outputs.')
    p.Define('atten_dropout_prob', 0.0, 'Dropout on attention probs.')
    p.Define('relu_dropout_prob', 0.0, 'Dropout on FFN hidden units.')
    p.Define('label_smoothing', 0.1, 'Label smoothing eps.')
    p.Define('share_tgt_embedding_softmax', False,
             'Use the target embedding as the softmax weights.')
    p.Define('share_src_tgt_embedding', False,
             'One table (tgt_emb) embeds both sides; needs a shared '
             'vocabulary (src_vocab_size == tgt_vocab_size).')
    p.Define('moe_tpl', None, 'MoE layer params; None = dense model.')
    p.Define('encoder_moe_layers', None,
             'Encoder layers with MoE FFNs; None = every other (1, 3, ...).')
    p.Define('decoder_moe_layers', None,
             'Decoder layers with MoE FFNs; None = every other (1, 3, ...).')
    p.Define('allow_noncausal_routing', False,
             'Accept a decoder MoE layer whose training routing lets later '
             'tokens change earlier ones\' experts (its class\'s '
             'RoutingLeaks: GShard top-2 with a capacity that can drop, '
             'strictly balanced, expert choice; layers/moe/causality.py). '
             'False: building such a decoder is an error.')
    p.Define('pipeline_tpl', None,
             'GPipe: pipeline.PipelinedLayer params for both stacks '
             '(transformer.TransformerStack.pipeline_tpl); its '
             'stage_mesh_axis None = the last axis of device_mesh (a data x '
             'stage mesh puts data first; a 1-D mesh [K] is read as [1, K]: '
             'stages only, the batch not split) and batch_mesh_axis None = '
             'axis 0, the data axis. None = no pipeline.')
    p.Define('remat', 'none',
             "Both stacks' re-materialisation (transformer.TransformerStack."
             "remat): 'none' | 'layer' (recompute each layer in the "
             'backward pass; GShard §5.1).')
    p.Define('sos_id', 1, 'First decoder input token (BOS).')
    p.Define('eos_id', 2, 'End-of-sentence token.')
    p.Define('decode', DecodeParams(), 'Decoding hyper-parameters.')
    return p

  def _StackParams(self, is_decoder):
    p = self.params
    sp = transformer.TransformerStack.Params().Set(
        model_dim=p.model_dim, hidden_dim=p.hidden_dim,
        num_heads=p.num_heads, dim_per_head=p.dim_per_head,
        is_decoder=is_decoder, norm_policy=p.norm_policy,
        residual_dropout_prob=p.residual_dropout_prob,
        atten_dropout_prob=p.atten_dropout_prob,
        relu_dropout_prob=p.relu_dropout_prob,
        num_layers=(p.num_decoder_layers if is_decoder else
                    p.num_encoder_layers),
        moe_tpl=p.moe_tpl,
        moe_layers=(p.decoder_moe_layers if is_decoder else
                    p.encoder_moe_layers),
        pipeline_tpl=self._PipelineParams(), remat=p.remat)
    return sp

  def _PipelineParams(self):
    """pipeline_tpl with the stage mesh axis resolved (see Params)."""
    p = self.params
    if p.pipeline_tpl is None:
      return None
    return base_model.PipelineAxes(p.pipeline_tpl.Copy(), p, 0)

  @classmethod
  def ForPlatform(cls, p, platform):
    del platform
    return transformer.PipelinedMoEDispatch(p)

  def __init__(self, params):
    params = base_model.StageMesh(params)
    super().__init__(params)
    p = self.params
    emb = embedding.EmbeddingLayer.Params().Set(embedding_dim=p.model_dim)
    if p.share_src_tgt_embedding and p.src_vocab_size != p.tgt_vocab_size:
      raise ValueError(
          f'share_src_tgt_embedding needs one vocabulary: src_vocab_size '
          f'{p.src_vocab_size} != tgt_vocab_size {p.tgt_vocab_size}')
    if not p.share_src_tgt_embedding:
      self.CreateChild('src_emb', emb.Copy().Set(vocab_size=p.src_vocab_size))
    self.CreateChild('tgt_emb', emb.Copy().Set(vocab_size=p.tgt_vocab_size))
    self.CreateChild('pos_emb', position.PositionalEncoding.Params().Set(
        embedding_dim=p.model_dim))
    drop = dropout.DropoutLayer.Params().Set(dropout_prob=p.input_dropout_prob)
    self.CreateChild('src_dropout', drop)
    self.CreateChild('tgt_dropout', drop)
    self.CreateChild('enc', self._StackParams(is_decoder=False))
    dec_p = self._StackParams(is_decoder=True)
    causality.CheckCausalRouting(
        p.moe_tpl, [f'dec/layer_{i:03d}/moe' for i in
                    transformer.TransformerStack.MoeLayerIndices(dec_p)],
        'a decoder', p.allow_noncausal_routing)
    self.CreateChild('dec', dec_p)
    if not p.share_tgt_embedding_softmax:
      self.CreateChild('softmax', softmax.SoftmaxLayer.Params().Set(
          input_dim=p.model_dim, num_classes=p.tgt_vocab_size))

  # ---------------------------------------------------------------- forward
  def _Embed(self, theta, side, ids_bt, step):
    table = 'tgt' if self.params.share_src_tgt_embedding else side
    x = self.children[f'{table}_emb'].FProp(theta[f'{table}_emb'], ids_bt)
    x += self.pos_emb.FProp(theta.pos_emb, seq_length=tf.shape(ids_bt)[1])
    drop = self.src_dropout if side == 'src' else self.tgt_dropout
    return drop.FProp(theta[f'{side}_dropout'], x, step=step)

  def _Logits(self, theta, x_btm):
    if self.params.share_tgt_embedding_softmax:
      return self.tgt_emb.Logits(theta.tgt_emb, x_btm)
    return self.softmax.Logits(theta.softmax, x_btm)

  def Encode(self, theta, src_ids, src_paddings, step=None, token_offset=0):
    """Encoder output [B, S, M] and its FFN aux {layer_xxx: aux}."""
    x = self._Embed(theta, 'src', src_ids, step)
    return self.enc.FProp(theta.enc, x, src_paddings, step=step,
                          token_offset=token_offset)

  def ComputePredictions(self, theta, input_batch, step=None,
                         example_offset=0, **kwargs):
    """Logits [B, T, V] of the target labels, and the FFN aux per stack.

    Args:
      theta: weights.
      input_batch: NestedMap with src.ids/paddings [B, S] and
        tgt.ids/paddings [B, T] (lingshard.data.inputs layout).
      step: int64 scalar: dropout masks and MoE routing randomness.
      example_offset: global index of the batch's first example (a replica's
        share of a global batch starts at replica id x its batch): each
        stack's MoE layers key routing randomness by global token index,
        offset = example_offset x that stack's length (layers/rng.py), and
        dropout masks by global example (dropout.KeyedMasks).
      **kwargs: ignored.
    """
    del kwargs
    src, tgt = input_batch.src, input_batch.tgt
    example_offset = tf.cast(example_offset, tf.int64)
    # Dropout masks keyed by global example too (dropout.py).
    with dropout.KeyedMasks(0, example_offset):
      enc_bsm, enc_aux = self.Encode(
          theta, src.ids, src.paddings, step=step,
          token_offset=example_offset * tf.shape(src.ids,
                                                 out_type=tf.int64)[1])
      y = self._Embed(theta, 'tgt', tgt.ids, step)
      dec_btm, dec_aux = self.dec.FProp(
          theta.dec, y, tgt.paddings, enc_bsm, src.paddings, step=step,
          token_offset=example_offset * tf.shape(tgt.ids,
                                                 out_type=tf.int64)[1])
    return NestedMap(logits=self._Logits(theta, dec_btm),
                     ffn_aux=NestedMap(enc=enc_aux, dec=dec_aux))

  def ComputeLoss(self, theta, predictions, input_batch):
    """(metrics, per_example); see the module docstring for the keys."""
    p = self.params
    src, tgt = input_batch.src, input_batch.tgt
    weights_bt = tf.cast(tgt.weights, tf.float32) * (
        1.0 - tf.cast(tgt.paddings, tf.float32))
    xent = softmax.LabelSmoothedXent(predictions.logits, tgt.labels,
                                     weights_bt, p.label_smoothing)
    num_tgt = tf.reduce_sum(weights_bt)
    denom = tf.maximum(num_tgt, 1.0)
    avg_xent = tf.reduce_sum(xent.xent) / denom
    log_pplx = tf.reduce_sum(xent.nll) / denom
    one = tf.constant(1.0)
    metrics = NestedMap()
    aux_total = tf.constant(0.0)
    for stack in ('enc', 'dec'):
      for name, aux in sorted(predictions.ffn_aux[stack].items()):
        prefix = f'{stack}_{name}'
        aux_loss = tf.cast(aux.aux_loss, tf.float32)
        aux_total += aux_loss  # Weighted by the layer: added as is.
        metrics[f'{prefix}_aux_loss'] = (aux_loss, one)
        for key, pair in routing_metrics.WeightedMetrics(aux.metrics, prefix):
          metrics[key] = pair
    loss = avg_xent + aux_total
    num_src = tf.reduce_sum(1.0 - tf.cast(src.paddings, tf.float32))
    metrics.update(
        loss=(loss, num_tgt), xent=(avg_xent, num_tgt),
        log_pplx=(log_pplx, num_tgt), aux_loss=(aux_total, one),
        num_tgt_tokens=(num_tgt, one), num_src_tokens=(num_src, one))
    per_example = NestedMap(
        xent=tf.reduce_sum(xent.xent, axis=1),
        nll=tf.reduce_sum(xent.nll, axis=1),
        num_tokens=tf.reduce_sum(weights_bt, axis=1))
    return metrics, per_example

  # --------------------------------------------------------------- decoding
  def _StepLogProbs(self, theta, ids_bq, t, caches, positions_q, mask_bqs,
                    cross_kvs, cross_mask_bqs):
    """Decoder step: (logp [B, Q, V] float32, caches)."""
    x = self.tgt_emb.FProp(theta.tgt_emb, ids_bq)
    x += self.pos_emb.FProp(theta.pos_emb, positions=tf.fill(
        tf.shape(ids_bq), t))
    out, caches = self.dec.ExtendStep(theta.dec, x, caches, positions_q,
                                      mask_bqs, cross_kvs, cross_mask_bqs)
    logits = tf.cast(self._Logits(theta, out), tf.float32)
    return tf.nn.log_softmax(logits, axis=-1), caches

  def DecoderStepFn(self, theta, enc_bsm, src_paddings, beam_size, max_len,
                    flat):
    """A step function and initial states for the searches of `decoding/`.

    Args:
      theta: weights.
      enc_bsm: encoder output [B, S, M].
      src_paddings: [B, S].
      beam_size: k.
      max_len: L.
      flat: False: `beam_search.BeamSearch`'s contract over N = B * k rows
        (cross-attention keys tiled k times, caches [N, L, ...] that the
        search re-orders); True: `flat_beam_search.FlatBeamSearch`'s
        (caches [B, k * L, ...] never re-ordered, the search's mask says
        which positions each hypothesis sees).

    Returns:
      (step_fn, initial decoder caches).
    """
    b = tf.shape(enc_bsm)[0]
    k = beam_size
    cross_kvs = self.dec.CrossKeyValues(theta.dec, enc_bsm)
    if flat:
      cross_mask = attention.PaddingMask(src_paddings, k)

      def FlatStep(ids_bk, t, mask_bks, states):
        return self._StepLogProbs(
            theta, ids_bk, t, states, flat_beam_search.StepPositions(t, k),
            mask_bks, cross_kvs, cross_mask)

      return FlatStep, self.dec.InitCache(b, k * max_len)

    def Tile(x):  # [B, ...] -> [B * k, ...], row b * k + j.
      return tf.repeat(x, k, axis=0)

    tiled_kvs = tf.nest.map_structure(Tile, cross_kvs)
    tiled_mask = attention.PaddingMask(Tile(src_paddings), 1)

    def StandardStep(ids_n, t, states):
      mask_n1l = tf.tile(tf.cast(tf.range(max_len) <= t, tf.float32)[
          tf.newaxis, tf.newaxis], [tf.shape(ids_n)[0], 1, 1])
      logp, caches = self._StepLogProbs(
          theta, ids_n[:, tf.newaxis], t, states, t[tf.newaxis], mask_n1l,
          tiled_kvs, tiled_mask)
      return logp[:, 0], caches

    return StandardStep, self.dec.InitCache(b * k, max_len)

  def Decode(self, theta, src_ids, src_paddings, beam_size=None,
             max_decode_len=None, length_norm_alpha=None, flat_beam=None):
    """Translates a batch; usable inside tf.function (static shapes).

    Args:
      theta: weights (e.g. the training task's `theta`).
      src_ids: [B, S] int32.
      src_paddings: [B, S] float32, 1.0 = padding.
      beam_size, max_decode_len, length_norm_alpha, flat_beam: override
        `p.decode`; beam_size 1 is greedy search.

    Returns:
      NestedMap(ids [B, L] int32 (EOS included, 0 after), lengths [B] int32
      (including EOS), scores [B] float32 (length-normalised log-prob;
      greedy: the plain log-prob)); beam search adds topk_ids [B, k, L],
      topk_lengths [B, k], topk_scores [B, k], best first.
    """
    p = self.params
    if not p.is_inference:
      raise ValueError('Decode needs a task built with is_inference=True '
                       '(TransformerMTModel.InferenceParams); theta may come '
                       'from the training task.')
    d = p.decode
    k = d.beam_size if beam_size is None else beam_size
    max_len = d.max_decode_len if max_decode_len is None else max_decode_len
    alpha = (d.length_norm_alpha if length_norm_alpha is None else
             length_norm_alpha)
    flat = d.flat_beam if flat_beam is None else flat_beam
    src_paddings = tf.cast(src_paddings, tf.float32)
    enc_bsm, _ = self.Encode(theta, src_ids, src_paddings)
    batch = src_ids.shape[0]
    if batch is None:
      raise ValueError('Decode needs a static batch size')
    flat = flat and k > 1
    step_fn, states = self.DecoderStepFn(theta, enc_bsm, src_paddings, k,
                                         max_len, flat)
    if k == 1:
      return greedy.GreedySearch(step_fn, states, batch, max_len, p.sos_id,
                                 p.eos_id)
    search = (flat_beam_search.FlatBeamSearch if flat else
              beam_search.BeamSearch)
    return search(step_fn, states, batch, k, max_len, p.sos_id, p.eos_id,
                  alpha)

  # ------------------------------------------------- trainer mode hooks
  @classmethod
  def InferenceParams(cls, task_params):
    """A copy of MT task params for decoding, eval and export.

    Sets `is_inference` (no dropout; MoE layers use their eval capacity)
    and makes every MoE layer unable to drop a token: groups of one token
    (`group_size=1`), so each of a token's k choices, all different
    experts, has a slot of its own (C >= 1 = S). A decoding step's tokens
    are then routed exactly as in the full forward pass, whatever the
    batch, beam layout or step (GShard App. A.1 decodes on the training
    cluster). Costs grow as E * tokens, fine for decoding's few tokens per
    step. The einsum dispatch is used: it takes any number of groups on any
    mesh. Theta is unchanged: the training task's theta runs on the task
    these params build. Eval aux losses are per one-token group and so not
    comparable with training's; the token losses are.

    A GShard `random` (or `sampling`) second-expert policy becomes `all`:
    every token keeps its top-2 experts, as noisy gating drops its noise at
    inference. Their draws are keyed by the token's index in the batch
    (layers/rng.py), so a sentence would otherwise translate differently
    with other batch neighbours, padding or beam layout (decode vs export).
    """
    p = super().InferenceParams(task_params)
    # Each layer class says what it changes (MoEBase / MoELayer.ForInference).
    base_layer.ResolveParams(p, inference=True)
    return p

  def TokenIdsKey(self, layer_name):
    """Encoder layers see the source ids, decoder layers the target's."""
    return {'enc': 'src', 'dec': 'tgt'}.get(layer_name.split('/')[0])

  def CreateDecoder(self, input_generator, train_input_generator=None):
    """An mt_decoder.MtDecoder: BLEU / chrF per language of `input_generator`
    (an MtInput), hypothesis files, the copy baseline."""
    return mt_decoder.ForTask(self, input_generator, train_input_generator)

  def CreateExportModule(self, theta, input_generator):
    """An mt_export.Translator (`translate` signature) for the vocabularies
    and bucket bounds of `input_generator` (an MtInput)."""
    return mt_export.TranslatorForInput(self, theta, input_generator)
