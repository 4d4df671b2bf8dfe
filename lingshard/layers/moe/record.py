"""An off-by-default record of each MoE layer's routing decisions.

For analysis (lingshard/tools/expert_usage.py: which languages and tokens
each expert gets; Shazeer et al. 2017 App. E, Table 9 shows experts
specialised by syntax and semantics). Inside

  with record.RoutingRecorder() as records:
    task.ComputePredictions(theta, batch)

every MoE layer's `MoEBase.FProp` appends one `LayerRouting`: the very
`routing.Routing` its gate (`Route`) returned and its dispatch used, so no
routing decision is recomputed or duplicated here. Outside a recorder
`Record` returns at once and adds no op.

Groups back to the batch: FProp cuts the B*T tokens of [B, T, M] inputs
row-major into G groups of S tokens (MoEBase._Grouped), so token (b, t) is
token s = (b*T + t) mod S of group g = (b*T + t) div S, and a [G, S, K]
tensor reshapes to [B, T, K] (letters: b batch row, t position, k choice).

Records are tensors of the graph being traced (or eager values): run the
forward pass and the recorder in one traced function and return the
records from it. A layer run inside a nested graph (a GPipe pipeline's
vectorised body, a loop) cannot hand its tensors out: `Record` raises
RecordError there rather than return unusable tensors.
"""

import contextlib
import contextvars
import typing

import tensorflow as tf

# (records list, the graph the recorder was opened in) or None.
_RECORDER = contextvars.ContextVar('lingshard_moe_routing_record',
                                   default=None)


class RecordError(ValueError):
  """Routing cannot be recorded here (see the module docstring)."""


class LayerRouting(typing.NamedTuple):
  """One MoE layer's routing of one batch, per token of the [B, T] batch.

  layer: the layer's path (`model/enc/layer_001/moe`).
  expert_btk: int32 [B, T, K], the expert choice k of token (b, t) wants
    (routing.Routing.expert_gsk); with `choice_is_expert`, K = E and choice
    k is expert k.
  real_bt: bool [B, T], the token is not padding.
  wanted_btk: bool [B, T, K], real and kept by the gate (e.g. GShard's
    second-expert policy), before capacity.
  dispatched_btk: bool [B, T, K], wanted and given a slot: what the experts
    computed.
  choice_is_expert: Python bool, Routing.choice_is_expert (K is not a
    preference rank: no first choice).
  num_experts: E.
  """
  layer: str
  expert_btk: typing.Any
  real_bt: typing.Any
  wanted_btk: typing.Any
  dispatched_btk: typing.Any
  choice_is_expert: bool
  num_experts: int

  def Tensors(self):
    """{field: tensor} of the tensor fields (to return from a function)."""
    return {'expert_btk': self.expert_btk, 'real_bt': self.real_bt,
            'wanted_btk': self.wanted_btk,
            'dispatched_btk': self.dispatched_btk}


def _Graph():
  return None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()


@contextlib.contextmanager
def RoutingRecorder():
  """Yields the list every MoE layer's FProp inside appends to."""
  records = []
  token = _RECORDER.set((records, _Graph()))
  try:
    yield records
  finally:
    _RECORDER.reset(token)


def Recording():
  """Whether a RoutingRecorder is open."""
  return _RECORDER.get() is not None


def Record(layer, gate_out, nonpad_gs, batch_shape):
  """Appends `layer`'s routing to the open recorder (no-op without one).

  Args:
    layer: the MoE layer (its `path` and params.num_experts are read).
    gate_out: the routing.Routing of its FProp, [G, S, K] tensors.
    nonpad_gs: float32 [G, S], 1.0 for real tokens.
    batch_shape: (B, T) of the layer's inputs (B*T = G*S).
  """
  state = _RECORDER.get()
  if state is None:
    return
  records, graph = state
  if _Graph() is not graph:
    raise RecordError(f'{layer.path}: its routing cannot be recorded: it '
                      'runs inside a nested graph (a pipeline body or a '
                      'loop), whose tensors cannot leave it')
  b, t = batch_shape
  k = gate_out.expert_gsk.shape[-1]

  def Btk(x_gsk):
    return tf.reshape(x_gsk, [b, t, k])

  real_bt = tf.reshape(tf.cast(nonpad_gs, tf.float32) > 0, [b, t])
  records.append(LayerRouting(
      layer=layer.path, expert_btk=Btk(gate_out.expert_gsk), real_bt=real_bt,
      wanted_btk=Btk(gate_out.wanted_gsk) & real_bt[..., tf.newaxis],
      dispatched_btk=Btk(gate_out.dispatched_gsk) & real_bt[..., tf.newaxis],
      choice_is_expert=bool(gate_out.choice_is_expert),
      num_experts=int(layer.params.num_experts)))
