"""Optimizers and learning-rate schedules as pure functions of tensors.

An optimizer maps (theta, grads, state, learning rate, step) to
(theta', state') with no hidden variables, so the trainer's step stays a pure
function that XLA can compile and partition whole.
"""
