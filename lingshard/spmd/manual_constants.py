"""Route constants into manual regions the way GShard §3.2 routes tensors.

In a manually partitioned region (between `SPMDFullToShardShape` and
`SPMDShardToFullShape`, see sharding.auto_to_manual) every value should be a
manual shard. TF's exported HLO, however, feeds constants straight into
manual ops: reduce init values, pad values, the zeros of a segment sum. On
its way to the CPU compiler the module passes through MLIR, whose
canonicalizer folds and deduplicates constants, so one constant ends up
feeding manual ops and automatically partitioned ops alike. XLA's sharding
propagation then gives it `{manual}` and spreads that into the automatic
code: a gradient silently loses its all-reduce, or the compiler aborts with
`Check failed: !IsManualLeaf()`.

`RouteConstantsIntoManualRegions` rewrites the serialized HloModuleProto so
that every non-manual operand of a fully manual instruction enters through
the same pair of custom calls TF emits for `auto_to_manual` of a replicated
tensor (`Sharding {replicated}` -> `SPMDFullToShardShape {manual}`; shapes
are unchanged since a replicated shard is the whole tensor). The constant
itself then only has automatic users and cannot carry `{manual}` anywhere.
The program's values are unchanged. Regions that are manual on only some
mesh axes (subgroup shardings) are left alone.
"""

from lingshard.spmd import xla_runtime

FULL_TO_SHARD = 'SPMDFullToShardShape'
SHARD_TO_FULL = 'SPMDShardToFullShape'


def _IsFullyManual(sharding):
  _, xla_data = xla_runtime.HloProtos()
  return sharding.type == xla_data.OpSharding.MANUAL


def CustomCallTarget(instr):
  """The custom call's target, '' for other instructions."""
  return instr.custom_call_target if instr.opcode == 'custom-call' else ''


def ManualFlags(comp):
  """{id: True} for instructions of a fully manual region (dataflow)."""
  manual = {}
  for instr in comp.instructions:
    target = CustomCallTarget(instr)
    if target == FULL_TO_SHARD:
      manual[instr.id] = _IsFullyManual(instr.sharding)
    elif target == SHARD_TO_FULL:
      manual[instr.id] = False
    else:
      manual[instr.id] = any(manual.get(o, False) for o in instr.operand_ids)
  return manual


def RouteConstantsIntoManualRegions(serialized_hlo):
  """HloModuleProto bytes -> bytes; see the module docstring."""
  hlo_protos, xla_data = xla_runtime.HloProtos()
  module = xla_runtime.ParseHloModule(serialized_hlo)
  next_id = 1 + max((i.id for c in module.computations
                     for i in c.instructions), default=0)
  for comp in module.computations:
    manual = ManualFlags(comp)
    if not any(manual.values()):
      continue
    by_id = {i.id: i for i in comp.instructions}
    entry = {}      # operand id -> id of its manual twin
    inserted = {}   # operand id -> [new instructions placed after it]
    for instr in comp.instructions:
      if not manual[instr.id] or CustomCallTarget(instr) == FULL_TO_SHARD:
        continue
      for k, operand_id in enumerate(instr.operand_ids):
        if manual.get(operand_id, False):
          continue
        if operand_id not in entry:
          operand = by_id[operand_id]
          pair = []
          for target, sharding in (
              ('Sharding', xla_data.OpSharding(
                  type=xla_data.OpSharding.REPLICATED)),
              (FULL_TO_SHARD, xla_data.OpSharding(
                  type=xla_data.OpSharding.MANUAL))):
            call = hlo_protos.HloInstructionProto(
                name=f'{operand.name}.to_manual{next_id}', opcode='custom-call',
                id=next_id, custom_call_target=target)
            call.shape.CopyFrom(operand.shape)
            call.sharding.CopyFrom(sharding)
            call.metadata.CopyFrom(operand.metadata)
            call.operand_ids.append(pair[-1].id if pair else operand_id)
            next_id += 1
            pair.append(call)
          inserted[operand_id] = pair
          entry[operand_id] = pair[-1].id
        instr.operand_ids[k] = entry[operand_id]
    if not inserted:
      continue
    ordered = []
    for instr in list(comp.instructions):
      ordered.append(instr)
      ordered.extend(inserted.get(instr.id, []))
    del comp.instructions[:]
    comp.instructions.extend(ordered)
  return module.SerializeToString()
