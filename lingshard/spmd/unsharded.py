"""The single-device reference of an annotated program: the same HLO with
every sharding annotation removed.

A sharding annotation (`sharding.split` / `mesh_split`, TF's XlaSharding
op) is an identity: in the exported HLO it is a `custom-call` to
`Sharding` plus `sharding` attributes on instructions. Removing both gives
exactly the program a trace under `sharding.Unannotated()` would give,
without tracing and lowering the step a second time (for a pipelined model
that second export was a quarter of `spmd_check`'s time). The reference
then differs from the partitioned program in nothing but the annotations.

Manual regions (`sharding.auto_to_manual`, GShard §3.2) are not
identities: their shapes depend on the device count, and one device's
trace of the same code takes other shapes. `StripShardings` refuses them
(`ManualRegionError`); the checker then traces such a program again
without annotations.
"""

from lingshard.spmd import manual_constants
from lingshard.spmd import xla_runtime

_SHARDING = 'Sharding'
_MANUAL_TARGETS = (manual_constants.FULL_TO_SHARD,
                   manual_constants.SHARD_TO_FULL)


class ManualRegionError(ValueError):
  """The program enters or leaves manual partitioning."""


def HasManualRegions(serialized_hlo):
  """True if the HloModuleProto bytes enter or leave manual partitioning."""
  module = xla_runtime.ParseHloModule(serialized_hlo)
  return any(manual_constants.CustomCallTarget(i) in _MANUAL_TARGETS
             for c in module.computations for i in c.instructions)


def StripShardings(serialized_hlo):
  """HloModuleProto bytes -> bytes without `Sharding` custom calls (each
  use reads the call's operand instead) or sharding attributes.

  Raises:
    ManualRegionError: the module has manual regions.
  """
  module = xla_runtime.ParseHloModule(serialized_hlo)
  for comp in module.computations:
    alias = {}  # id of a Sharding call -> the id it forwards.
    for instr in comp.instructions:
      target = manual_constants.CustomCallTarget(instr)
      if target in _MANUAL_TARGETS:
        raise ManualRegionError(f'{instr.name}: a manual region ({target}) '
                                'is not an identity without its annotations')
      if target == _SHARDING:
        if len(instr.operand_ids) != 1:
          raise ValueError(f'{instr.name}: a Sharding call with '
                           f'{len(instr.operand_ids)} operands')
        alias[instr.id] = alias.get(instr.operand_ids[0],
                                    instr.operand_ids[0])
    kept = [i for i in comp.instructions if i.id not in alias]
    for instr in kept:
      for k, operand_id in enumerate(instr.operand_ids):
        instr.operand_ids[k] = alias.get(operand_id, operand_id)
      preds = [alias.get(p, p) for p in instr.control_predecessor_ids]
      del instr.control_predecessor_ids[:]
      instr.control_predecessor_ids.extend(dict.fromkeys(preds))
      instr.ClearField('sharding')
    comp.root_id = alias.get(comp.root_id, comp.root_id)
    del comp.instructions[:]
    comp.instructions.extend(kept)
  module.ClearField('spmd_output_sharding')
  module.ClearField('spmd_parameters_shardings')
  module.ClearField('schedule')
  return module.SerializeToString()
