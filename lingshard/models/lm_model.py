"""The Sparsely-Gated MoE language model (Shazeer et al. 2017, App. C.1).

embedding -> LSTM -> MoE -> LSTM -> softmax: "For every layer other than
the softmax, we apply dropout to the layer output ... After dropout, the
output of the previous layer is added to the layer output" (a residual,
from the second layer on); the MoE's output goes through a sigmoid before
dropout (`moe_tpl.output_activation = 'sigmoid'`). Without `moe_tpl` the
MoE's position holds more LSTM layers (the 4xLSTM-512 baseline) or none.
An MoE layer whose training routing is not causal (its class's
`RoutingLeaks`, layers/moe/causality.py) is refused unless
`allow_noncausal_routing`.

Batch (lingshard.data.lm_inputs.LmInput): ids [B, T] int32 (<s> w1..wn),
labels [B, T] int32 (w1..wn </s>), paddings [B, T] float32 (1.0 = pad).

Loss = mean NLL per word + the MoE layer's aux_loss, added as is: the
layer already weighted it (w_importance * CV(Importance)^2 + w_load *
CV(Load)^2, eqs. 7 and 11). log_pplx is the mean NLL over every word
including the end-of-sentence symbol (App. C.1: "sum over all the words
including the end of sentence symbol"); perplexity = exp(log_pplx).

Large vocabularies (App. C.1 trains "the Softmax output layer ... using
importance sampling", as Jozefowicz et al. 2016): with `num_sampled` S > 0
training uses sampled_softmax's loss over the label and S log-uniform
samples and reports it as `sampled_nll` (log_pplx and pplx need the full
softmax); evaluation (`is_inference`) always uses the full softmax, on the
same weights.
"""

import tensorflow as tf

from lingshard.layers import dropout
from lingshard.layers import embedding
from lingshard.layers import lstm
from lingshard.layers.moe import causality
from lingshard.layers.moe import metrics as routing_metrics
from lingshard.layers import sampled_softmax
from lingshard.layers import softmax
from lingshard.models import base_model
from lingshard.nested_map import NestedMap


class LMTask(base_model.BaseTask):
  """Word-level LSTM LM with an optional MoE layer between LSTM layers."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('vocab_size', 0, 'Vocabulary size V (with <pad>, <s>, </s>, '
             '<unk>).')
    p.Define('model_dim', 512, 'Embedding dim = LSTM output dim = MoE '
             'input/output dim (App. C.1: 512).')
    p.Define('num_cells', 0, 'Cells per LSTM layer; 0 = model_dim. With '
             'num_cells != model_dim the LSTM projects to model_dim (LSTMP).')
    p.Define('num_lstm_before', 1, 'LSTM layers before the MoE position.')
    p.Define('num_lstm_after', 1, 'LSTM layers after the MoE position.')
    p.Define('moe_tpl', None, 'Params of the MoE layer (NoisyTopKMoELayer, '
             'HierarchicalMoELayer, BalancedMoELayer); input_dim is set to '
             'model_dim. None = no MoE layer.')
    p.Define('allow_noncausal_routing', False,
             'Accept an MoE layer whose training routing lets later words '
             'change earlier words\' experts (its class\'s RoutingLeaks; '
             'layers/moe/causality.py). False: building it is an error.')
    p.Define('dropout_prob', 0.1, 'DropProb of App. C on every layer output '
             'but the softmax.')
    p.Define('num_sampled', 0, 'Sampled-softmax classes S per training '
             'batch; 0 = full softmax (module docstring).')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CheckPositive('vocab_size', 'model_dim')
    cells = p.num_cells or p.model_dim
    self.CreateChild('emb', embedding.EmbeddingLayer.Params().Set(
        vocab_size=p.vocab_size, embedding_dim=p.model_dim,
        scale_sqrt_depth=False))
    lstm_p = lstm.LSTMLayer.Params().Set(
        input_dim=p.model_dim, num_cells=cells,
        num_output_nodes=0 if cells == p.model_dim else p.model_dim)
    self.CreateChildren('lstm_before', [lstm_p.Copy()
                                        for _ in range(p.num_lstm_before)])
    if p.moe_tpl is not None:
      causality.CheckCausalRouting(p.moe_tpl, [f'{p.name}/moe'],
                                   'a language model',
                                   p.allow_noncausal_routing)
      self.CreateChild('moe', p.moe_tpl.Copy().Set(input_dim=p.model_dim))
    self.CreateChildren('lstm_after', [lstm_p.Copy()
                                       for _ in range(p.num_lstm_after)])
    num_dropouts = 1 + p.num_lstm_before + p.num_lstm_after + (
        p.moe_tpl is not None)
    self.CreateChildren('dropout', [
        dropout.DropoutLayer.Params().Set(dropout_prob=p.dropout_prob)
        for _ in range(num_dropouts)])
    if p.num_sampled:
      softmax_p = sampled_softmax.SampledSoftmaxLayer.Params().Set(
          num_sampled=p.num_sampled)
    else:
      softmax_p = softmax.SoftmaxLayer.Params()
    self.CreateChild('softmax', softmax_p.Set(input_dim=p.model_dim,
                                              num_classes=p.vocab_size))

  def _Sampled(self):
    """True when training uses the sampled softmax."""
    return bool(self.params.num_sampled) and not self.params.is_inference

  def TokenIdsKey(self, layer_name):
    """Every layer sees the word ids."""
    del layer_name
    return 'ids'

  def ComputePredictions(self, theta, input_batch, step=None,
                         example_offset=0):
    """NestedMap(logits [B, T, V] (or, sampled training: outputs [B, T, M]
    and step), ffn_aux (the MoE layer's aux or {}))."""
    # Dropout masks are keyed by global example (dropout.KeyedMasks), as
    # routing noise is by global word: replicas draw what one device would.
    with dropout.KeyedMasks(0, example_offset):
      return self._Forward(theta, input_batch, step, example_offset)

  def _Forward(self, theta, input_batch, step, example_offset):
    paddings_bt = tf.cast(input_batch.paddings, tf.float32)
    x = self.dropout[0].FProp(theta.dropout[0],
                              self.emb.FProp(theta.emb, input_batch.ids),
                              step=step)
    drops = iter(range(1, len(self.dropout)))

    def Residual(x, y):
      i = next(drops)
      return x + self.dropout[i].FProp(theta.dropout[i], y, step=step)

    for layer, layer_theta in zip(self.lstm_before, theta.lstm_before):
      x = Residual(x, layer.FProp(layer_theta, x, paddings_bt))
    ffn_aux = NestedMap()
    if self.params.moe_tpl is not None:
      # Routing noise is keyed by global word index (layers/rng.py).
      token_offset = tf.cast(example_offset, tf.int64) * tf.shape(
          x, out_type=tf.int64)[1]
      y, ffn_aux = self.moe.FProp(theta.moe, x, paddings_bt, step=step,
                                  token_offset=token_offset)
      x = Residual(x, y)  # y is already sigmoid(MoE(x)) (App. C.1).
    for layer, layer_theta in zip(self.lstm_after, theta.lstm_after):
      x = Residual(x, layer.FProp(layer_theta, x, paddings_bt))
    ffn_aux = NestedMap(ffn_aux or {})
    if self._Sampled():
      return NestedMap(outputs=x, step=step, ffn_aux=ffn_aux)
    return NestedMap(logits=self.softmax.Logits(theta.softmax, x),
                     ffn_aux=ffn_aux)

  def ComputeLoss(self, theta, predictions, input_batch):
    """(metrics, per_example): loss, log_pplx per word incl. </s>, aux."""
    weights_bt = 1.0 - tf.cast(input_batch.paddings, tf.float32)
    if 'logits' in predictions:
      nll_bt = softmax.LabelSmoothedXent(predictions.logits,
                                         input_batch.labels, weights_bt,
                                         0.0).nll
    else:
      nll_bt = self.softmax.SampledNll(theta.softmax, predictions.outputs,
                                       input_batch.labels,
                                       predictions.step) * weights_bt
    num_words = tf.reduce_sum(weights_bt)
    log_pplx = tf.reduce_sum(nll_bt) / tf.maximum(num_words, 1.0)
    one = tf.constant(1.0)
    metrics = NestedMap()
    aux_loss = tf.constant(0.0)
    aux = predictions.ffn_aux
    if aux:
      aux_loss = tf.cast(aux.aux_loss, tf.float32)  # Weighted by the layer.
      for key, pair in routing_metrics.WeightedMetrics(
          aux.get('metrics', NestedMap()), 'moe'):
        metrics[key] = pair
    nll_key = 'log_pplx' if 'logits' in predictions else 'sampled_nll'
    metrics.update(
        loss=(log_pplx + aux_loss, num_words), aux_loss=(aux_loss, one),
        num_words=(num_words, one))
    metrics[nll_key] = (log_pplx, num_words)
    if nll_key == 'log_pplx' and not self.params.is_inference:
      # This batch's perplexity for the training curves; eval reports the
      # corpus perplexity (eval_loop: lang/all/pplx).
      metrics.pplx = (tf.exp(tf.minimum(log_pplx, 700.0)), num_words)
    per_example = NestedMap(nll=tf.reduce_sum(nll_bt, axis=1),
                            num_tokens=tf.reduce_sum(weights_bt, axis=1))
    return metrics, per_example
