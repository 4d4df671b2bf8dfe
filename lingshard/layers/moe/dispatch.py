"""Dispatch tokens to expert buffers and combine the experts' outputs.

A `routing.Routing` (produced by a gate) says, per group g, token s and
choice k, which expert the token wants (`expert_gsk`), its slot in that
expert's buffer (`position_gsk`), whether it got the slot (`dispatched_gsk`,
which already respects capacity) and its combine weight (`weight_gsk`, 0
where not dispatched). Expert
buffers hold C slots per (expert, group): the dispatched tensor is
`[E, G, C, M]` (GShard §3.1, Algorithm 2).

Two implementations with identical numerics (outputs and gradients):

- `EinsumMoE`: Algorithm 2 exactly. Builds the dense `combine_weights
  [G, S, E, C]` and `dispatch_mask` and uses the einsums
  `GSEC,GSM->EGCM`, experts `EGCM,EMH->EGCH`, `EGCH,EHM->GECM`, and
  `GSEC,GECM->GSM`. Costs O(G·S·E·C·M) for dispatch and combine; the
  TPU-friendly SPMD default.
- `GatherMoE`: index-based. Per group, the (token, choice) filling each
  slot is found by one integer scatter; the dispatched tensor is a row
  gather `[E, G, C, M]`, and the combine adds each token's <= K weighted
  expert-output rows (a gather whose backward pass is the scatter-add;
  routings with K = E scatter-add the weighted slots forward instead).
  Costs O(E·G·C·M) = O(k·cf·G·S·M), no one-hot tensors. Under a device
  mesh both steps run per group-shard inside manual partitioning
  (`sharding.auto_to_manual` / `manual_to_auto`, GShard §3.2), so the
  partitioner only sees the `[E, G, C, M]` re-split from G to E (an
  all-to-all) and back.

Empty slots hold zeros in both implementations; a choice without a slot
contributes exactly 0. Routing gates are read with one-hot contractions, not
gathers, so their gradients stay per token (no all-gather under SPMD).

Both call `expert_fn(x_egcm, out_layout)` for the expert FFN, so the layer
owns the expert weights and their sharding.
"""

import tensorflow as tf

from lingshard import sharding


def _ValidPositions(routing):
  """Positions of dispatched choices, -1 elsewhere (one_hot(-1) = 0)."""
  return tf.where(routing.dispatched_gsk, routing.position_gsk,
                  -tf.ones_like(routing.position_gsk))


def CombineWeightsGSEC(routing, num_experts, capacity):
  """Algorithm 2 `combine_weights [G, S, E, C]` (float32).

  einsum `GSK,GSKE,GSKC->GSEC`: at most K non-zeros per token. When
  `routing.choice_is_expert` (choice k is expert k, K = E) the expert
  one-hot is the identity and is skipped.
  """
  onehot_gskc = tf.one_hot(_ValidPositions(routing), capacity,
                           dtype=tf.float32)
  if routing.choice_is_expert:
    return routing.weight_gsk[..., tf.newaxis] * onehot_gskc
  onehot_gske = tf.one_hot(routing.expert_gsk, num_experts, dtype=tf.float32)
  return tf.einsum('gsk,gske,gskc->gsec', routing.weight_gsk, onehot_gske,
                   onehot_gskc)


def DispatchMaskGSEC(routing, num_experts, capacity, dtype=tf.float32):
  """Algorithm 2 `dispatch_mask [G, S, E, C]` (1 where dispatched).

  Built from the dispatched flags rather than `combine != 0` so a
  dispatched choice whose weight underflows to 0 stays dispatched, exactly
  as in the gather implementation.
  """
  onehot_gskc = tf.one_hot(_ValidPositions(routing), capacity,
                           dtype=dtype)
  if routing.choice_is_expert:
    return onehot_gskc
  onehot_gske = tf.one_hot(routing.expert_gsk, num_experts, dtype=dtype)
  return tf.einsum('gske,gskc->gsec', onehot_gske, onehot_gskc)


def EinsumMoE(x_gsm, routing, expert_fn, num_experts, capacity, shard):
  """GShard Algorithm 2: one-hot einsum dispatch and combine.

  Args:
    x_gsm: [G, S, M] inputs (fprop dtype).
    routing: a routing.Routing (see module docstring).
    expert_fn: `(x_egcm, out_layout) -> y` with out_layout 'egcm' | 'gecm'.
    num_experts, capacity: E, C.
    shard: `(tensor, key) -> tensor` activation annotation (keys 'gsm',
      'gsec', 'egcm', 'gecm').

  Returns:
    [G, S, M] combined expert outputs.
  """
  dtype = x_gsm.dtype
  combine_gsec = shard(CombineWeightsGSEC(routing, num_experts, capacity),
                       'gsec')
  dispatch_gsec = shard(DispatchMaskGSEC(routing, num_experts, capacity,
                                         dtype), 'gsec')
  x_egcm = shard(tf.einsum('gsec,gsm->egcm', dispatch_gsec, x_gsm), 'egcm')
  y_gecm = shard(expert_fn(x_egcm, 'gecm'), 'gecm')
  out_gsm = tf.einsum('gsec,gecm->gsm', tf.cast(combine_gsec, dtype), y_gecm)
  return shard(out_gsm, 'gsm')


def _SourceTable(routing, num_experts, capacity):
  """Which (token, choice) fills each slot: int32 [E, G, C], -1 = empty.

  Value = s*K + k. One integer scatter (unsorted_segment_sum: each slot
  receives at most one choice); dropped choices go to a dump segment.
  """
  expert_gsk = routing.expert_gsk
  g_len, s_len, k_len = (tf.shape(expert_gsk)[0], expert_gsk.shape[1],
                         expert_gsk.shape[2])
  num_slots = num_experts * g_len * capacity
  g_gsk = tf.range(g_len)[:, tf.newaxis, tf.newaxis]
  slot_gsk = (expert_gsk * g_len + g_gsk) * capacity + routing.position_gsk
  slot_gsk = tf.where(routing.dispatched_gsk, slot_gsk, num_slots)
  src_gsk = tf.reshape(tf.range(s_len * k_len, dtype=tf.int32),
                       [1, s_len, k_len]) + 1
  src_gsk = tf.broadcast_to(src_gsk, tf.shape(slot_gsk))
  src = tf.math.unsorted_segment_sum(src_gsk, slot_gsk, num_slots + 1)
  return tf.reshape(src[:num_slots], [num_experts, g_len, capacity]) - 1


def _LocalDispatch(x_gsm, routing, num_experts, capacity):
  """Per group-shard: gathers x into [E, G, C, M]; returns (x_egcm, src_egc).

  src_egc = s*K + k of the choice in each slot, -1 for empty slots.
  """
  g_len, s_len = tf.shape(x_gsm)[0], x_gsm.shape[1]
  k_len = routing.expert_gsk.shape[2]
  src_egc = _SourceTable(routing, num_experts, capacity)
  valid_egc = src_egc >= 0
  token_egc = tf.maximum(src_egc, 0) // k_len
  g_egc = tf.range(g_len)[tf.newaxis, :, tf.newaxis]
  x_flat = tf.reshape(x_gsm, [-1, x_gsm.shape[-1]])
  x_egcm = tf.gather(x_flat, g_egc * s_len + token_egc)
  # Empty slots gathered row 0 of their group: zero them, as the one-hot
  # einsum does (their outputs get weight 0 either way).
  x_egcm *= tf.cast(valid_egc, x_egcm.dtype)[..., tf.newaxis]
  return x_egcm, src_egc


def _LocalCombine(y_egcm, routing, src_egc, s_len):
  """Per group-shard: out[g, s] = sum_k weight[g, s, k] * y[slot(g, s, k)].

  Few choices per token (K << E): each token gathers its K expert outputs
  (the backward pass is the scatter-add). Routings with choice k = expert k
  (K = E) scatter-add the weighted slots into the tokens instead
  (unsorted_segment_sum), so the cost stays O(E*G*C*M) either way.
  A choice without a slot has weight 0 and reads slot 0: adds exactly 0.
  """
  g_len, c_len, m_len = tf.shape(y_egcm)[1], y_egcm.shape[2], y_egcm.shape[3]
  y_flat = tf.reshape(y_egcm, [-1, m_len])
  dtype = y_egcm.dtype
  if routing.choice_is_expert:
    k_len = routing.expert_gsk.shape[2]
    valid_egc = src_egc >= 0
    src = tf.maximum(src_egc, 0)
    g_egc = tf.range(g_len)[tf.newaxis, :, tf.newaxis]
    weight_egc = tf.gather(tf.reshape(routing.weight_gsk, [-1]),
                           g_egc * (s_len * k_len) + src)
    weight_egc *= tf.cast(valid_egc, weight_egc.dtype)
    row_egc = g_egc * s_len + src // k_len
    yw = y_flat * tf.cast(tf.reshape(weight_egc, [-1, 1]), dtype)
    out = tf.math.unsorted_segment_sum(yw, tf.reshape(row_egc, [-1]),
                                       g_len * s_len)
    return tf.reshape(out, [-1, s_len, m_len])
  g_gsk = tf.range(g_len)[:, tf.newaxis, tf.newaxis]
  ok_gsk = routing.dispatched_gsk  # Respects capacity (routing.Routing).
  slot_gsk = (routing.expert_gsk * g_len + g_gsk) * c_len + routing.position_gsk
  slot_gsk = tf.where(ok_gsk, slot_gsk, tf.zeros_like(slot_gsk))
  y_gskm = tf.gather(y_flat, slot_gsk)
  weight_gsk = routing.weight_gsk * tf.cast(ok_gsk, routing.weight_gsk.dtype)
  # sum_k w * y as broadcast-multiply + reduce (einsum `GSK,GSKM->GSM`):
  # its gradient is elementwise, where einsum's goes through batch matmuls.
  return tf.reduce_sum(tf.cast(weight_gsk, dtype)[..., tf.newaxis] * y_gskm,
                       axis=2)


def GatherMoE(x_gsm, routing, expert_fn, num_experts, capacity, shard,
              manual=None):
  """Index-based dispatch/combine (gather + scatter-add), same numerics.

  Args:
    x_gsm, routing, expert_fn, num_experts, capacity, shard: as EinsumMoE.
    manual: None, or NestedMap(device_mesh, mesh_axis_names, group_axis):
      run the per-group parts under manual partitioning with G split over
      mesh axis `group_axis`.

  Returns:
    [G, S, M].
  """
  g_len, s_len, m_len = x_gsm.shape
  if manual is None:
    x_egcm, src_egc = _LocalDispatch(x_gsm, routing, num_experts, capacity)
    y_egcm = shard(expert_fn(shard(x_egcm, 'egcm'), 'egcm'), 'egcm')
    out = _LocalCombine(y_egcm, routing, src_egc, s_len)
    return shard(out, 'gsm')

  mesh, names, ga = manual.device_mesh, manual.mesh_axis_names, manual.group_axis
  gsk_map = [ga, -1, -1]
  egcm_map = [-1, ga, -1, -1]
  # Manual on the group axis only when the mesh has other axes, so dims
  # split over those stay automatically partitioned.
  manual_axis = None if mesh.ndim == 1 else ga

  def ToManual(t, mapping):
    return sharding.auto_to_manual(t, mesh, mapping, names, manual_axis)

  def ToAuto(t, mapping, full_shape):
    return sharding.manual_to_auto(t, mesh, mapping, full_shape, names,
                                   manual_axis)

  local = routing._replace(**{
      key: ToManual(getattr(routing, key), gsk_map)
      for key in ('expert_gsk', 'position_gsk', 'dispatched_gsk',
                  'weight_gsk')})
  x_local = ToManual(x_gsm, gsk_map)
  x_egcm_l, src_egc_l = _LocalDispatch(x_local, local, num_experts,
                                       capacity)
  x_egcm = ToAuto(x_egcm_l, egcm_map, [num_experts, g_len, capacity, m_len])
  # Re-split from G to E: the all-to-all of GShard §3.1.
  y_egcm = shard(expert_fn(shard(x_egcm, 'egcm'), 'egcm'), 'egcm')
  y_egcm_l = ToManual(y_egcm, egcm_map)
  # The local routing and source table were computed on the same group
  # shard: they are manual tensors already (no communication).
  out_l = _LocalCombine(y_egcm_l, local, src_egc_l, s_len)
  out = ToAuto(out_l, gsk_map, [g_len, s_len, m_len])
  return shard(out, 'gsm')
