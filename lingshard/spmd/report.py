"""What a partitioned program communicates, read from its HLO text.

`ParseCollectives(hlo_text, input_names, output_names)` lists every
collective the SPMD partitioner inserted (GShard §3.3.1: all-to-all,
all-gather, all-reduce, collective-permute, reduce-scatter), each with its
per-device buffer size, an estimate of the bytes each device sends, the TF
op it came from (the `op_name` metadata XLA keeps through partitioning) and,
when it can be traced through layout-only ops, the named program input it
reads or output it produces. `FormatReport(result)` renders a
`check.CheckResult` as the text the CLI prints.
"""

import collections
import dataclasses
import re

KINDS = ('all-to-all', 'all-gather', 'all-reduce', 'collective-permute',
         'reduce-scatter')
# Async forms count once, at their start.
_OPCODE_KIND = {k: k for k in KINDS}
_OPCODE_KIND.update({f'{k}-start': k for k in KINDS})
_OPCODE_KIND['ragged-all-to-all'] = 'all-to-all'
# Ops that move a tensor without changing what it is (followed when naming
# the input or output a collective touches).
_VIEW_OPS = frozenset({
    'bitcast', 'copy', 'reshape', 'transpose', 'convert', 'slice',
    'dynamic-slice', 'fusion', 'get-tuple-element', 'copy-start',
    'copy-done', 'all-gather-done', 'all-reduce-done',
    'collective-permute-done', 'optimization-barrier'})

_DTYPE_BYTES = {
    'pred': 1, 's4': 1, 'u4': 1, 's8': 1, 'u8': 1, 'f8e4m3fn': 1,
    'f8e5m2': 1, 's16': 2, 'u16': 2, 'f16': 2, 'bf16': 2, 's32': 4,
    'u32': 4, 'f32': 4, 's64': 8, 'u64': 8, 'f64': 8, 'c64': 8, 'c128': 16,
    'token': 0,
}
_ARRAY_RE = re.compile(r'\b([a-z][a-z0-9]*)\[([0-9,]*)\]')
_INSTR_RE = re.compile(r'^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$')
_OPCODE_RE = re.compile(r'\s*([\w\-]+)\(')
_OP_NAME_RE = re.compile(r'op_name="([^"]*)"')
_GROUPS_LIST_RE = re.compile(r'replica_groups=\{(\{[0-9,]*\})')
_GROUPS_IOTA_RE = re.compile(r'replica_groups=\[([0-9,]+)\]<=')


@dataclasses.dataclass(frozen=True)
class Collective:
  """One collective in the partitioned (per-device) program.

  Attributes:
    kind: one of KINDS.
    name: HLO instruction name.
    shape: result shape text, e.g. 'f32[8,2,16]'.
    bytes: size of the result buffer on one device.
    moved_bytes: estimate of the bytes one device sends (ring algorithms):
      all-gather / all-to-all (g-1)/g of the result, all-reduce 2(g-1)/g,
      reduce-scatter (g-1) times the result, collective-permute the result.
    group_size: devices per replica group (0 when not given).
    op_name: the TF op it came from ('' when XLA kept no metadata).
    tensor: 'in:<input name>' or 'out:<output name>' when the collective
      reads an input or produces an output through layout-only ops.
  """
  kind: str
  name: str
  shape: str
  bytes: int
  moved_bytes: int
  group_size: int
  op_name: str
  tensor: str

  @property
  def source(self):
    """The best description of where it came from."""
    parts = [p for p in (self.tensor, self.op_name) if p]
    return ', '.join(parts) if parts else f'%{self.name}'

  def Describe(self):
    return (f'{self.kind} %{self.name} {self.shape} ({FormatBytes(self.bytes)}'
            f', group {self.group_size}) from {self.source}')


@dataclasses.dataclass
class _Instr:
  name: str
  shape: str
  opcode: str
  operands: list
  attrs: str
  is_root: bool
  computation: str
  is_entry: bool


def ShapeBytes(shape_text):
  """Bytes of an HLO shape (arrays of a tuple summed)."""
  total = 0
  for dtype, dims in _ARRAY_RE.findall(shape_text):
    if dtype not in _DTYPE_BYTES:
      continue
    n = 1
    for d in dims.split(','):
      if d:
        n *= int(d)
    total += n * _DTYPE_BYTES[dtype]
  return total


def FormatBytes(n):
  """1536 -> '1.5 KiB'."""
  for unit in ('B', 'KiB', 'MiB', 'GiB'):
    if abs(n) < 1024 or unit == 'GiB':
      return f'{n:.0f} {unit}' if unit == 'B' else f'{n:.1f} {unit}'
    n /= 1024.0
  return f'{n} B'


def _Matching(text, start):
  """Index just past the bracket closing the one at text[start]."""
  pairs = {'(': ')', '{': '}', '[': ']'}
  depth = 0
  for i in range(start, len(text)):
    c = text[i]
    if c in pairs:
      depth += 1
    elif c in pairs.values():
      depth -= 1
      if depth == 0:
        return i + 1
  return len(text)


def _ParseInstr(line, computation, is_entry):
  m = _INSTR_RE.match(line)
  if not m:
    return None
  is_root, name, rest = bool(m.group(1)), m.group(2), m.group(3)
  if rest.startswith('('):
    end = _Matching(rest, 0)
  else:
    end = rest.find(' ')
    end = len(rest) if end < 0 else end
  shape, rest = rest[:end], rest[end:]
  m = _OPCODE_RE.match(rest)
  if not m:
    return None
  open_paren = m.end() - 1
  close = _Matching(rest, open_paren)
  args = rest[open_paren + 1:close - 1]
  operands = re.findall(r'%([\w.\-]+)', args)
  if m.group(1) == 'parameter':
    operands = [args.strip()]
  return _Instr(name, shape, m.group(1), operands, rest[close:], is_root,
                computation, is_entry)


def _ParseModule(hlo_text):
  """{computation: [instructions]}, entry computation name."""
  comps, entry, current, current_entry = {}, None, None, False
  for line in hlo_text.splitlines():
    stripped = line.strip()
    if not stripped or stripped.startswith('HloModule'):
      continue
    if stripped.endswith('{') and '=' not in stripped.split('(')[0]:
      current_entry = stripped.startswith('ENTRY')
      current = stripped.split()[1 if current_entry else 0].lstrip('%')
      comps[current] = []
      if current_entry:
        entry = current
      continue
    if stripped == '}':
      current = None
      continue
    if current is not None:
      instr = _ParseInstr(line, current, current_entry)
      if instr is not None:
        comps[current].append(instr)
  return comps, entry


def _CleanShape(shape_text):
  """Drops layouts and comments; a tuple of k equal arrays -> 'k x f32[..]'.

  '(f32[8]{0}, /*index=1*/f32[2,2]{1,0})' -> '(f32[8], f32[2,2])'.
  """
  text = re.sub(r'\{[^{}]*\}|/\*.*?\*/', '', shape_text)
  if text.startswith('('):
    parts = [p.strip() for p in text[1:-1].split(', ')]
    if len(parts) > 1 and len(set(parts)) == 1:
      return f'{len(parts)} x {parts[0]}'
  return text


def _GroupSize(attrs):
  m = _GROUPS_LIST_RE.search(attrs)
  if m:
    return len([x for x in m.group(1).strip('{}').split(',') if x])
  m = _GROUPS_IOTA_RE.search(attrs)
  if m:
    return int(m.group(1).split(',')[-1])
  return 0


def _Moved(kind, nbytes, g):
  if kind == 'collective-permute':
    return nbytes
  if g <= 1:
    return 0
  if kind == 'all-reduce':
    return 2 * nbytes * (g - 1) // g
  if kind == 'reduce-scatter':
    return nbytes * (g - 1)
  return nbytes * (g - 1) // g


def _Main(instr, by_name):
  """The one non-scalar operand a view op passes on, or None."""
  if instr.opcode not in _VIEW_OPS:
    return None
  big = [by_name[o] for o in instr.operands
         if o in by_name and not _IsScalar(by_name[o].shape)]
  return big[0] if len(big) == 1 else None


def _IsScalar(shape_text):
  return all(not dims for _, dims in _ARRAY_RE.findall(shape_text))


def _TraceTensor(instr, by_name, users, input_names, output_names):
  """'in:<name>' / 'out:<name>' for a collective of the entry computation."""
  # Backwards through view ops to an entry parameter.
  operand = by_name.get(instr.operands[0]) if instr.operands else None
  for _ in range(64):
    if operand is None:
      break
    if operand.opcode == 'parameter':
      k = int(operand.operands[0])
      if k < len(input_names):
        return f'in:{input_names[k]}'
      break
    operand = _Main(operand, by_name)
  # Forwards through view ops to the root tuple.
  node = instr
  for _ in range(64):
    if node.is_root and node.opcode != 'tuple':
      return f'out:{output_names[0]}' if output_names else ''
    nexts = users.get(node.name, [])
    for user in nexts:
      if user.is_root and user.opcode == 'tuple':
        k = user.operands.index(node.name)
        return f'out:{output_names[k]}' if k < len(output_names) else ''
    if len(nexts) != 1 or nexts[0].opcode not in _VIEW_OPS:
      break
    node = nexts[0]
  return ''


def ParseCollectives(hlo_text, input_names=(), output_names=()):
  """Every collective of a partitioned HLO module, in program order.

  Args:
    hlo_text: `HloModule.to_string()` of the partitioned program.
    input_names: names of the entry parameters, in order.
    output_names: names of the outputs (elements of the root tuple).
  """
  comps, entry = _ParseModule(hlo_text)
  out = []
  for comp_name, instrs in comps.items():
    by_name = {i.name: i for i in instrs}
    users = collections.defaultdict(list)
    for i in instrs:
      for o in i.operands:
        users[o].append(i)
    for instr in instrs:
      kind = _OPCODE_KIND.get(instr.opcode)
      if kind is None:
        continue
      nbytes = ShapeBytes(instr.shape)
      if instr.opcode.endswith('-start'):
        # An async start returns (operands..., results...): count results.
        nbytes = ShapeBytes(instr.shape) - sum(
            ShapeBytes(by_name[o].shape) for o in instr.operands
            if o in by_name)
        nbytes = max(nbytes, 0)
      g = _GroupSize(instr.attrs)
      m = _OP_NAME_RE.search(instr.attrs)
      tensor = ''
      if comp_name == entry:
        tensor = _TraceTensor(instr, by_name, users, list(input_names),
                              list(output_names))
      out.append(Collective(
          kind=kind, name=instr.name, shape=_CleanShape(instr.shape),
          bytes=nbytes, moved_bytes=_Moved(kind, nbytes, g), group_size=g,
          op_name=m.group(1) if m else '', tensor=tensor))
  return out


def InstructionCount(hlo_text):
  """Number of instructions in all computations of an HLO module text."""
  comps, _ = _ParseModule(hlo_text)
  return sum(len(v) for v in comps.values())


def CountByKind(collectives):
  """{kind: (count, bytes, moved_bytes)} over KINDS (zeros included)."""
  table = {k: [0, 0, 0] for k in KINDS}
  for c in collectives:
    row = table[c.kind]
    row[0] += 1
    row[1] += c.bytes
    row[2] += c.moved_bytes
  return {k: tuple(v) for k, v in table.items()}


def _Flops(n):
  for unit in ('', 'K', 'M', 'G', 'T'):
    if abs(n) < 1000 or unit == 'T':
      return f'{n:.0f} {unit}FLOP' if not unit else f'{n:.2f} {unit}FLOP'
    n /= 1000.0
  return f'{n} FLOP'


def _KinkLines(kink_errors):
  """The comparison with the kinks' derivatives smoothed (check.py)."""
  bad = [e for e in kink_errors if not e.ok]
  max_abs = max([e.max_abs for e in kink_errors], default=0.0)
  max_rel = max([e.max_rel for e in kink_errors], default=0.0)
  lines = [f'  with the kinks\' derivatives smoothed (relu, max pooling; '
           f'lingshard/layers/kinks.py): '
           f'{"MISMATCH" if bad else "OK"}  max abs err {max_abs:.3g}  '
           f'max rel err {max_rel:.3g}']
  if not bad:
    lines.append('    (the tensors above moved with gradients switched on or '
                 'off at ReLU pre-activations within rounding of 0 or at '
                 'max-pooling inputs within rounding of their window\'s max, '
                 'not by the partitioning)')
  for e in bad:
    lines.append(f'    MISMATCH {e.name} {e.dtype}{list(e.shape)}: abs '
                 f'{e.max_abs:.3g} rel {e.max_rel:.3g} in {e.beyond} of '
                 f'{e.size} elements')
  return lines


def FormatReport(result, max_detail=40):
  """Human-readable text of a `check.CheckResult`."""
  r = result
  mesh = 'x'.join(str(d) for d in r.mesh_shape)
  lines = [f'SPMD check: {r.name} on mesh {mesh} ({r.num_partitions} '
           f'partitions, XLA from jaxlib {r.jaxlib_version})']
  if r.matches is None:
    lines.append('  parity vs single device: not compared (compile only)')
  else:
    kinks_ok = r.kink_errors is not None and r.matches
    status = ('MISMATCH' if not r.matches else
              'OK with kinks smoothed' if kinks_ok else 'OK')
    lines.append(f'  parity vs single device: {status}  max abs err '
                 f'{r.max_abs_error:.3g}  max rel err '
                 f'{r.max_rel_error:.3g}  ({len(r.errors)} tensors)')
  for e in r.errors:
    if not e.ok or e.beyond:
      # An ok tensor listed here differs in isolated elements only
      # (check.ISOLATED_FRACTION: rounding across a discontinuity); a
      # 'kink' one matches once relu's derivative is smoothed.
      label = 'isolated' if e.ok else 'kink' if kinks_ok else 'MISMATCH'
      lines.append(f'    {label} {e.name} '
                   f'{e.dtype}{list(e.shape)}: abs {e.max_abs:.3g} rel '
                   f'{e.max_rel:.3g} (tolerance rel {e.rtol:.1g}) in '
                   f'{e.beyond} of {e.size} elements')
  if r.kink_errors is not None:
    lines.extend(_KinkLines(r.kink_errors))
  lines.append(f'  time: TF export {r.export_seconds:.2f} s, partition+'
               f'compile {r.compile_seconds:.2f} s, run {r.run_seconds:.2f} s')
  lines.append(f'  program: {r.program_size} HLO instructions exported, '
               f'{r.partitioned_size} per device after partitioning')
  m = r.memory
  lines.append(f'  per device: {_Flops(r.flops)}, {r.transcendentals:.0f} '
               f'transcendentals; memory argument '
               f'{FormatBytes(m["argument"])}, output '
               f'{FormatBytes(m["output"])}, temp {FormatBytes(m["temp"])}'
               f', alias {FormatBytes(m["alias"])}')
  counts = CountByKind(r.collectives)
  lines.append(f'  collectives: {len(r.collectives)}')
  lines.append(f'    {"kind":<20}{"count":>6}{"bytes/device":>16}'
               f'{"sent/device":>16}')
  for kind, (n, b, moved) in counts.items():
    lines.append(f'    {kind:<20}{n:>6}{FormatBytes(b):>16}'
                 f'{FormatBytes(moved):>16}')
  for c in r.collectives[:max_detail]:
    lines.append(f'    - {c.Describe()}')
  if len(r.collectives) > max_detail:
    lines.append(f'    ... {len(r.collectives) - max_detail} more')
  if r.expectations:
    lines.append('  expectations:')
    for rule in r.expectations:
      lines.append(f'    {rule}')
  for v in r.violations:
    lines.append(f'  FAILED {v}')
  lines.append(f'  result: {"PASS" if r.ok else "FAIL"}')
  return '\n'.join(lines)
