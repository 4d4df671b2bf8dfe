"""Is an MoE layer's training-mode routing causal? The decoder/LM guard.

A decoder or language model is trained with teacher forcing: every
position sees the whole target at once, and only causal attention keeps a
token's output a function of itself and earlier tokens. Routing that
selects at group level breaks that: a later token (of the same sequence,
or of another sequence cut into the same group) can change which experts
an earlier token gets, so the training loss can read the future. Each MoE
layer class declares it with `RoutingLeaks(p) -> reason or None`
(`MoEBase.RoutingLeaks`), judged on its training-mode params:

- token choice (GShard top-2, noisy top-k, hierarchical): a token's own
  choices depend on itself only; capacity queues do not. With C >= S no
  choice is ever dropped (a token's choices are distinct experts, so an
  expert gets at most S of a group's choices), and routing is causal. With
  C < S possible, queues are per group and choices queue rank-major (GShard
  Algorithm 1 lines 7, 18): a later token's first choice can take the slot
  of an earlier token's second choice.
- strictly balanced gating (Shazeer et al. App. F) and expert choice (Zhou
  et al. 2022): each expert selects tokens from the whole group.
- groups of one token (`group_size=1`) are causal whatever the gate.

`CheckCausalRouting` is the guard the decoder-building tasks call
(`TransformerMTModel`'s decoder, `LMTask`): one line naming the layer and
the reason, unless the task's `allow_noncausal_routing` accepts it.
"""

import math


def CapacityCanDrop(p, top_k):
  """Whether training capacity can be below the group size (C < S).

  `p`: MoE params; `top_k`: the k in C = ceil(cf * k * S / E). With
  `num_groups` set, S is unknown until the batch: C >= S must then hold
  for every S (cf * k >= E, or dropless).
  """
  if p.group_size == 1:
    return False
  s = p.group_size
  if p.expert_capacity is not None:
    return s is None or int(p.expert_capacity) < s
  cf = p.capacity_factor
  if cf is None:
    return False  # Dropless: C = S.
  if s is None:
    return cf * top_k < p.num_experts
  return max(1, int(math.ceil(cf * top_k * s / p.num_experts))) < s


def TokenChoiceLeak(p, top_k):
  """RoutingLeaks of a token-choice gate with k = top_k (module doc)."""
  if not CapacityCanDrop(p, top_k):
    return None
  return ('its capacity can drop tokens (C < S): expert slots are filled '
          'per group, so a later token (first choices queue before '
          'second choices, GShard Algorithm 1) or another sequence in the '
          "group can take an earlier token's slot")


def CheckCausalRouting(moe_params, layer_names, what, allow):
  """Raises the guard's one-line ValueError if the layer's routing leaks.

  Args:
    moe_params: the MoE layer params (their `cls` declares RoutingLeaks).
    layer_names: the paths of the layers built from them, e.g.
      ['dec/layer_001/moe'].
    what: 'a decoder' | 'a language model'.
    allow: the task's `allow_noncausal_routing`.
  """
  if allow or moe_params is None or not layer_names:
    return
  reason = moe_params.cls.RoutingLeaks(moe_params)
  if reason is None:
    return
  names = ', '.join(layer_names)
  raise ValueError(f'{names}: {moe_params.cls.__name__} routing is not '
                   f'causal in training ({reason}); {what} must not see '
                   'later tokens: set allow_noncausal_routing=True to '
                   'accept it')
