"""Temperature-based sampling across languages (Arivazhagan et al. 2019).

With n_l examples of language l and N = sum n_l, language l is drawn with
probability p_l proportional to (n_l / N) ** (1 / T): T = 1 is proportional
to data size, T = 5 the M4 recipe (GShard section 4), T = inf uniform.
"""

import math


def TemperatureProbs(counts, temperature):
  """Sampling probabilities per language.

  Args:
    counts: dict {lang: number of examples}; languages with 0 are left out.
    temperature: T > 0; None or math.inf for uniform sampling.

  Returns:
    dict {lang: probability}, languages sorted, probabilities summing to 1.

  Raises:
    ValueError: on a non-positive temperature, negative counts or no data.
  """
  if temperature is not None and not temperature > 0:
    raise ValueError(f'temperature must be > 0 (or None for inf), got '
                     f'{temperature!r}')
  if any(n < 0 for n in counts.values()):
    raise ValueError(f'negative example counts in {counts}')
  langs = sorted(lg for lg, n in counts.items() if n > 0)
  if not langs:
    raise ValueError('no language has any examples to sample from')
  total = float(sum(counts[lg] for lg in langs))
  if temperature is None or math.isinf(temperature):
    weights = [1.0] * len(langs)
  else:
    weights = [(counts[lg] / total) ** (1.0 / temperature) for lg in langs]
  norm = sum(weights)
  return {lg: w / norm for lg, w in zip(langs, weights)}


def EffectiveNumLanguages(probs):
  """exp(entropy) of a sampling distribution: 1 for one language, L uniform."""
  return math.exp(-sum(p * math.log(p) for p in probs.values() if p > 0))
