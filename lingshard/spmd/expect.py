"""`--expect` rules: assertions about a partitioned program's communication.

A rule is one string:

  none                  no collectives at all
  only:KIND[,KIND...]   every collective is one of these kinds
  has:KIND[,KIND...]    at least one collective of each of these kinds
  no:KIND[,KIND...]     no collective of these kinds
  no-KIND:REGEX         no collective of KIND whose source matches REGEX
                        (Python re.search over 'in:<input>' / 'out:<output>'
                        and the TF op name), e.g. `no-all-gather:wi|wo`

KIND is one of all-to-all, all-gather, all-reduce, collective-permute,
reduce-scatter ('_' may stand for '-'). A violated rule yields a message
naming the offending op, e.g. for the MoE layer "lowers to all-to-all only":
`only:all-to-all,all-reduce` and `no-all-gather:wi|wo`.
"""

import dataclasses
import re

from lingshard.spmd import report


class ExpectRuleError(ValueError):
  """An `--expect` rule that cannot be parsed."""


def _Kind(text, rule):
  kind = text.strip().lower().replace('_', '-')
  if kind not in report.KINDS:
    raise ExpectRuleError(f'--expect {rule!r}: unknown collective kind '
                          f'{text.strip()!r}; one of {", ".join(report.KINDS)}')
  return kind


def _Kinds(text, rule):
  parts = [p for p in text.split(',') if p.strip()]
  if not parts:
    raise ExpectRuleError(f'--expect {rule!r}: no collective kinds given')
  return tuple(_Kind(p, rule) for p in parts)


@dataclasses.dataclass(frozen=True)
class Rule:
  """A parsed rule; `Violations(collectives)` lists what breaks it."""
  text: str
  op: str                 # 'none' | 'only' | 'has' | 'no' | 'no-kind'
  kinds: tuple = ()
  pattern: str = ''

  def Violations(self, collectives):
    """Messages, one per offending collective (or missing kind)."""
    head = f'--expect {self.text!r}'
    if self.op == 'none':
      return [f'{head}: {c.Describe()}' for c in collectives]
    if self.op == 'only':
      allowed = ', '.join(self.kinds)
      return [f'{head}: {c.Describe()} is not one of {allowed}'
              for c in collectives if c.kind not in self.kinds]
    if self.op == 'no':
      return [f'{head}: {c.Describe()}' for c in collectives
              if c.kind in self.kinds]
    if self.op == 'has':
      present = {c.kind for c in collectives}
      return [f'{head}: the program has no {k}' for k in self.kinds
              if k not in present]
    regex = re.compile(self.pattern)
    return [f'{head}: {c.Describe()} matches {self.pattern!r}'
            for c in collectives if c.kind == self.kinds[0] and (
                regex.search(c.tensor) or regex.search(c.op_name))]

  def __str__(self):
    return self.text


def ParseRule(text):
  """Parses one rule (see the module docstring); ExpectRuleError if bad."""
  if not isinstance(text, str) or not text.strip():
    raise ExpectRuleError(f'--expect rule must be a non-empty string, got '
                          f'{text!r}')
  rule = text.strip()
  if rule == 'none':
    return Rule(rule, 'none')
  head, sep, body = rule.partition(':')
  if not sep:
    raise ExpectRuleError(f'--expect {rule!r}: expected none, only:KINDS, '
                          'has:KINDS, no:KINDS or no-KIND:REGEX')
  head = head.strip()
  if head in ('only', 'has', 'no'):
    return Rule(rule, head, _Kinds(body, rule))
  if head.startswith('no-'):
    kind = _Kind(head[len('no-'):], rule)
    if not body.strip():
      raise ExpectRuleError(f'--expect {rule!r}: empty pattern')
    try:
      re.compile(body)
    except re.error as e:
      raise ExpectRuleError(f'--expect {rule!r}: bad pattern: {e}') from None
    return Rule(rule, 'no-kind', (kind,), body)
  raise ExpectRuleError(f'--expect {rule!r}: unknown rule {head!r}; expected '
                        'none, only:KINDS, has:KINDS, no:KINDS or '
                        'no-KIND:REGEX')


def ParseRules(texts):
  """Rules from strings (or already parsed Rules)."""
  if isinstance(texts, (str, Rule)):
    texts = [texts]
  return [t if isinstance(t, Rule) else ParseRule(t) for t in texts or ()]


def Check(rules, collectives):
  """All violation messages of `rules` over `collectives`."""
  out = []
  for rule in ParseRules(rules):
    out.extend(rule.Violations(collectives))
  return out
