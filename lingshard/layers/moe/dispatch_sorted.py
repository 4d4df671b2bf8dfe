"""Dropless dispatch without padding: assignments sorted by expert, blocks.

The padded dispatchers (dispatch.py) give every (expert, group) C slots;
dropless there means C = S: an `[E, G, S, M]` buffer and E times the
expert FLOPs of the tokens. Here only the dispatched (token, choice)
assignments are computed, as grouped matmuls over blocks of B rows (the
block-sparse formulation of MegaBlocks, Gale et al. 2023, in TF ops with
static shapes, so XLA compiles it):

1. The A = G*S*K assignments (`routing.expert_gsk`, `dispatched_gsk`) are
   sorted by expert (stable, so within an expert in token order); choices
   not dispatched sort last and are dropped.
2. Each expert's segment is padded to a multiple of B. Rows in all:
   sum_e ceil(count_e / B) * B <= A + E*(B-1): `nb = (A + E*(B-1)) // B`
   blocks, a static bound (unused blocks are all-empty rows).
3. Per block n, its expert `expert_n` [nb]; the block's rows are gathered
   from the tokens, `x_nbm` [nb, B, M], and the expert FFN runs per block
   with that expert's weights gathered, `wi_n = wi[expert_n]` [nb, M, H]:
   einsums `NBM,NMH->NBH` and `NBH,NHM->NBM` (letters: n block, b row,
   m model, h hidden).
4. Each token adds its <= K weighted rows (gather of the rows its choices
   landed in, sum over k: `dispatch._LocalCombine`'s arithmetic, so the
   outputs match the padded path to float rounding).

Two ways to run the blocks (`loop`):
- all at once (training, differentiable): (A + E*(B-1)) rows of M->H->M
  instead of the padded E*G*S (dropless) or E*G*C (a capacity factor),
  plus the weight gathers' [nb, M, H] copies (nb*M*H moves, 1/B of the
  matmul work, but memory of M/B times the rows');
- a while loop over the used blocks only (inference, MoEBase with
  `is_inference`): each block reads its expert's weights in place, so no
  weight copies are held and empty blocks cost nothing: rows computed are
  sum_e ceil(count_e / B) * B. Measured (scripts/bench_moe_dropless.py,
  XLA, E = 64, 2 shared cores, two runs): 0.82-0.96x the time of capacity
  factor 2.0, 11-14x faster than padded dropless, 8 MiB peak vs 12 MiB
  (cf 2.0) and 256 MiB (padded). No gradient is taken through it.

Any routing works, capacity-limited ones too (the dispatched flags already
respect C): outputs equal the padded dispatchers' at the same routing. In
training, gradients flow through the gathers (their backward passes are
scatter-adds into x and into wi/wo [E, ...]); expert dropout masks are
drawn per block row, not per slot, so with dropout the draws (not their
statistics) differ from the padded dispatchers'.

Sharding: this is a single-device / data-parallel path (each replica
sorts its own tokens; expert weights replicated). No activation here is
annotated. Under an expert-split mesh (`SetExpertSharding`) the SPMD
partitioner must gather rows of wi/wo split on E by data-dependent
indices: it replicates the weights (an all-gather of every expert's
weights per step) or, at best, runs a masked local gather and all-reduces
the [nb, M, H] result; neither is the all-to-all of GShard §3.2, so
expert-sharded programs should keep the padded dispatchers (MoEBase's
`inference_dispatch_impl='einsum'` for inference) until an
expert-parallel sorted path exists.
"""

import math

import tensorflow as tf

MAX_AUTO_BLOCK = 128


def AutoBlockSize(num_assignments, num_experts, loop=False):
  """B for `num_assignments` = G*S*K over E experts: the largest power of
  two <= A / (4E) (so the static padding E*(B-1) stays <= A/4), in
  [1, MAX_AUTO_BLOCK]; with `loop`, <= A / (2E) (empty blocks cost
  nothing there; bigger blocks read each expert's weights fewer times)."""
  ratio = num_assignments / ((2.0 if loop else 4.0) * num_experts)
  if ratio < 2:
    return 1
  return min(MAX_AUTO_BLOCK, 2 ** int(math.floor(math.log2(ratio))))


def NumBlocks(num_assignments, num_experts, block_size):
  """Static block count: sum_e ceil(c_e / B) <= (A + E*(B-1)) // B."""
  return (num_assignments + num_experts * (block_size - 1)) // block_size


def SortedLayout(routing, num_experts, block_size):
  """Where each assignment goes in the block layout.

  Returns (row_a, valid_a, src_r, expert_n, num_used):
    row_a: int32 [A], the row of assignment a = (g*S + s)*K + k (0 where
      not dispatched);
    valid_a: bool [A], dispatched;
    src_r: int32 [nb*B], the assignment in each row, -1 for empty rows;
    expert_n: int32 [nb], each block's expert (empty trailing blocks read
      expert E-1: their rows are zeros);
    num_used: int32 scalar, the blocks holding rows (the first ones).
  """
  e_len, b_len = num_experts, block_size
  expert_a = tf.reshape(routing.expert_gsk, [-1])
  valid_a = tf.reshape(routing.dispatched_gsk, [-1])
  a_len = expert_a.shape[0]
  nb = NumBlocks(a_len, e_len, b_len)
  rows = nb * b_len
  key_a = tf.where(valid_a, expert_a, e_len)
  order = tf.argsort(key_a, stable=True)
  key_sorted = tf.gather(key_a, order)
  count_e = tf.math.unsorted_segment_sum(tf.ones_like(key_a), key_a,
                                         e_len + 1)[:e_len]
  padded_e = (count_e + b_len - 1) // b_len * b_len
  start_e = tf.cumsum(count_e, exclusive=True)
  pstart_e = tf.cumsum(padded_e, exclusive=True)
  # Sorted position i of expert e goes to row pstart_e + (i - start_e);
  # choices not dispatched (key E) go to the dump row `rows`.
  key_c = tf.minimum(key_sorted, e_len - 1)
  row_sorted = (tf.gather(pstart_e, key_c) + tf.range(a_len, dtype=tf.int32)
                - tf.gather(start_e, key_c))
  row_sorted = tf.where(key_sorted < e_len, row_sorted, rows)
  # Inverse permutation: row of each assignment in its original order.
  row_a = tf.math.unsorted_segment_sum(row_sorted, order, a_len)
  src_r = tf.math.unsorted_segment_sum(order + 1, row_sorted, rows + 1)
  src_r = src_r[:rows] - 1
  # Block n belongs to the first expert whose padded segment ends after
  # its first row: expert_n = #{e : pend_e <= n*B}.
  pend_e = tf.cumsum(padded_e)
  first_row_n = tf.range(nb, dtype=tf.int32) * b_len
  expert_n = tf.reduce_sum(tf.cast(pend_e[tf.newaxis, :] <=
                                   first_row_n[:, tf.newaxis], tf.int32), 1)
  expert_n = tf.minimum(expert_n, e_len - 1)
  row_a = tf.where(valid_a, row_a, tf.zeros_like(row_a))
  num_used = tf.reduce_sum(padded_e) // b_len
  return row_a, valid_a, src_r, expert_n, num_used


def _BlockLoop(x_nbm, expert_n, num_used, block_expert_fn):
  """y_nbm: the blocks [0, num_used) one at a time in a while loop (one
  expert's weights read per block, nothing gathered up front); blocks
  past num_used stay zero."""
  nb, b_len, m_len = x_nbm.shape

  def Body(i, out):
    y = block_expert_fn(x_nbm[i][tf.newaxis], expert_n[i][tf.newaxis])
    return i + 1, out.write(i, y[0])

  # A TensorArray, not a scatter into [nb, B, M]: in TF graphs (no XLA)
  # each scatter would copy the whole output. Unwritten blocks stack as 0.
  out = tf.TensorArray(x_nbm.dtype, size=nb, element_shape=[b_len, m_len])
  _, out = tf.while_loop(lambda i, _: i < num_used, Body,
                         (tf.constant(0), out), maximum_iterations=nb)
  return out.stack()


def SortedMoE(x_gsm, routing, block_expert_fn, num_experts, block_size=None,
              loop=False):
  """Dropless dispatch / combine without padding (module docstring).

  Args:
    x_gsm: [G, S, M] inputs.
    routing: a routing.Routing; only dispatched choices are computed.
    block_expert_fn: `(x_nbm, expert_n) -> y_nbm`, the expert FFN of each
      block's expert (MoEBase.BlockExpertFn).
    num_experts: E.
    block_size: B rows per block; None = AutoBlockSize(A, E, loop).
    loop: False: every block at once, each with its expert's weights
      gathered (`[nb, M, H]`: differentiable, for training); True: the
      used blocks one by one in a while loop (no weight copies in memory,
      no work for empty blocks; inference: no gradient through it).

  Returns:
    [G, S, M] combined expert outputs (zeros for tokens with no
    dispatched choice).
  """
  g_len, s_len, m_len = x_gsm.shape
  k_len = routing.expert_gsk.shape[2]
  a_len = g_len * s_len * k_len
  b_len = block_size or AutoBlockSize(a_len, num_experts, loop)
  nb = NumBlocks(a_len, num_experts, b_len)
  row_a, valid_a, src_r, expert_n, num_used = SortedLayout(
      routing, num_experts, b_len)
  valid_r = src_r >= 0
  x_flat = tf.reshape(x_gsm, [-1, m_len])
  x_rm = tf.gather(x_flat, tf.maximum(src_r, 0) // k_len)
  # Empty rows gathered token 0: zero them (their outputs are never read,
  # but zeros keep the padding rows' FLOPs harmless, e.g. inf * 0).
  x_rm *= tf.cast(valid_r, x_rm.dtype)[:, tf.newaxis]
  x_nbm = tf.reshape(x_rm, [nb, b_len, m_len])
  if loop:
    y_nbm = _BlockLoop(x_nbm, expert_n, num_used, block_expert_fn)
  else:
    y_nbm = block_expert_fn(x_nbm, expert_n)
  y_rm = tf.reshape(y_nbm, [nb * b_len, m_len])
  y_gskm = tf.reshape(tf.gather(y_rm, row_a), [g_len, s_len, k_len, m_len])
  weight_gsk = routing.weight_gsk * tf.cast(
      tf.reshape(valid_a, [g_len, s_len, k_len]), routing.weight_gsk.dtype)
  return tf.reduce_sum(tf.cast(weight_gsk, y_gskm.dtype)[..., tf.newaxis]
                       * y_gskm, axis=2)
