"""The MoE family (GShard §2, Shazeer et al. 2017): one package.

  base.py          MoEBase: grouping, expert FFNs, dispatch/combine, the FFN
                   contract, `aux_loss_weights` and platform/inference hooks
  routing.py       the one `Routing` type, token-choice / mask routing,
                   expert capacity, `GateStats` (what every gate reports)
  dispatch.py      GShard Algorithm 2 einsums and the index-based gather
  metrics.py       routing metrics (load, importance, drops, CV)
  record.py        an off-by-default record of each layer's routing per
                   [B, T] token, for analysis (tools/expert_usage.py)
  top2.py          GShard top-2 gating and `MoELayer`
  noisy_top_k.py   Shazeer noisy top-k gating and `NoisyTopKMoELayer`
  balanced.py      strictly balanced gating (Shazeer App. F)
  expert_choice.py expert-choice routing (Zhou et al. 2022), encoder-only
  causality.py     whether a layer's routing is causal; the decoder/LM guard
  hierarchical.py  hierarchical MoE (Shazeer App. B) over the gates above
  bias_balance.py  aux-loss-free balancing (DeepSeek-V3 §2.1.2): the
                   per-expert selection bias and its count update rule
  shared.py        shared experts (DeepSeekMoE §3.2): always-on FFNs beside
                   the routed ones

Import the module you need (`from lingshard.layers.moe import top2`); this
file imports nothing, so importing one module stays cheap. Routing
randomness is `lingshard/layers/rng.py` (shared with dropout).
"""
