"""Shared numpy references of the image-model tests."""


def WholeBatch(parts):
  """numpy (mean, population variance) of the union of moment parts
  (NestedMap(count, mean, m2) each, e.g. per micro-batch or per replica)."""
  count = sum(float(p.count) for p in parts)
  mean = sum(float(p.count) * p.mean.numpy() for p in parts) / count
  m2 = sum(p.m2.numpy() + float(p.count) * (p.mean.numpy() - mean)**2
           for p in parts)
  return mean, m2 / count
