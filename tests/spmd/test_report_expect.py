"""Reading collectives out of partitioned HLO text, and `--expect` rules."""

import pytest

from lingshard.spmd import expect
from lingshard.spmd import report

# A hand-written per-device module in the form HloModule.to_string() prints.
_HLO = """\
HloModule m_spmd, is_scheduled=true, num_partitions=8

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%fused (p0: f32[2,16], p1: u32[]) -> f32[1,16] {
  %p0 = f32[2,16]{1,0} parameter(0)
  %p1 = u32[] parameter(1)
  ROOT %ds = f32[1,16]{1,0} bitcast(%p0)
}

ENTRY %main_spmd (param: f32[2,16], param.1: bf16[4,8], param.2: f32[8]) -> (f32[16,16], bf16[4,8], f32[8]) {
  %partition-id = u32[] partition-id()
  %param = f32[2,16]{1,0} parameter(0), sharding={devices=[8,1]<=[8]}, metadata={op_name="XLA_Args"}
  %param.1 = bf16[4,8]{1,0} parameter(1), sharding={replicated}
  %param.2 = f32[8]{0} parameter(2), sharding={replicated}
  %fusion.1 = f32[1,16]{1,0} fusion(%param, %partition-id), kind=kLoop, calls=%fused
  %ags = (f32[2,16]{1,0}, f32[16,16]{1,0}) all-gather-start(%param), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}, metadata={op_name="moe/einsum/Einsum"}
  %agd = f32[16,16]{1,0} all-gather-done(%ags)
  %a2a = (bf16[1,8]{1,0}, bf16[1,8]{1,0}, bf16[1,8]{1,0}, bf16[1,8]{1,0}) all-to-all(%param.1, %param.1, %param.1, %param.1), channel_id=2, replica_groups={{0,1,2,3},{4,5,6,7}}, metadata={op_name="dispatch/Einsum"}
  %gte = bf16[1,8]{1,0} get-tuple-element(%a2a), index=0
  %ar = f32[8]{0} all-reduce(%param.2), channel_id=3, replica_groups={{0,1},{2,3},{4,5},{6,7}}, to_apply=%add, metadata={op_name="gradient_tape/gating/MatMul"}
  %cp = f32[8]{0} collective-permute(%ar), channel_id=4, source_target_pairs={{0,1},{1,0}}
  %rs = f32[1]{0} reduce-scatter(%cp), channel_id=5, replica_groups=[1,8]<=[8], dimensions={0}, to_apply=%add
  %out = bf16[4,8]{1,0} copy(%param.1)
  ROOT %t = (f32[16,16]{1,0}, bf16[4,8]{1,0}, f32[8]{0}) tuple(%agd, %out, %cp)
}
"""


def test_parse_collectives_kinds_bytes_groups_and_sources():
  cs = report.ParseCollectives(_HLO, ['theta.moe.wi', 'batch.x', 'theta.wg'],
                               ['grads.wi', 'y', 'grads.wg'])
  assert [c.kind for c in cs] == ['all-gather', 'all-to-all', 'all-reduce',
                                  'collective-permute', 'reduce-scatter']
  ag, a2a, ar, cp, rs = cs
  # The async start counts its result only: 16*16 f32.
  assert (ag.name, ag.bytes, ag.moved_bytes, ag.group_size) == (
      'ags', 1024, 896, 8)
  assert ag.op_name == 'moe/einsum/Einsum'
  assert ag.tensor == 'in:theta.moe.wi'
  assert ag.Describe() == ('all-gather %ags (f32[2,16], f32[16,16]) '
                           '(1.0 KiB, group 8) from in:theta.moe.wi, '
                           'moe/einsum/Einsum')
  assert (a2a.shape, a2a.bytes, a2a.moved_bytes, a2a.group_size) == (
      '4 x bf16[1,8]', 64, 48, 4)
  assert a2a.tensor == 'in:batch.x'
  assert (ar.bytes, ar.moved_bytes, ar.group_size) == (32, 32, 2)
  assert ar.op_name == 'gradient_tape/gating/MatMul'
  assert cp.moved_bytes == 32 and cp.group_size == 0
  assert cp.tensor == 'out:grads.wg'
  assert (rs.bytes, rs.moved_bytes, rs.tensor) == (4, 28, '')
  assert report.CountByKind(cs)['all-to-all'] == (1, 64, 48)


def test_shape_bytes_and_format():
  assert report.ShapeBytes('(f32[2,3]{1,0}, bf16[4], pred[])') == 24 + 8 + 1
  assert report.FormatBytes(512) == '512 B'
  assert report.FormatBytes(1536) == '1.5 KiB'
  assert report.FormatBytes(3 * 2**20) == '3.0 MiB'


def _Cs():
  return report.ParseCollectives(
      _HLO, ['theta.moe.wi', 'batch.x', 'theta.wg'], ['g', 'y', 'w'])


def test_expect_rules_pass_and_fail_naming_the_op():
  cs = _Cs()
  assert expect.Check(['has:all-to-all,all-gather', 'no-all-gather:wo$'],
                      cs) == []
  assert expect.Check(['only:all-to-all,all-reduce,collective-permute,'
                       'reduce_scatter', 'no-all-gather:wi|wo'], cs) == [
      "--expect 'only:all-to-all,all-reduce,collective-permute,"
      "reduce_scatter': all-gather %ags (f32[2,16], f32[16,16]) (1.0 KiB, "
      'group 8) from in:theta.moe.wi, moe/einsum/Einsum is not one of '
      'all-to-all, all-reduce, collective-permute, reduce-scatter',
      "--expect 'no-all-gather:wi|wo': all-gather %ags (f32[2,16], "
      'f32[16,16]) (1.0 KiB, group 8) from in:theta.moe.wi, '
      "moe/einsum/Einsum matches 'wi|wo'"]
  # The op name is searched too.
  assert len(expect.Check(['no-all-reduce:gating'], cs)) == 1
  assert expect.Check(['no:all-to-all'], cs)[0].startswith(
      "--expect 'no:all-to-all': all-to-all %a2a")
  assert len(expect.Check(['none'], cs)) == 5
  assert expect.Check(['none'], []) == []
  assert expect.Check(['has:all-reduce'], []) == [
      "--expect 'has:all-reduce': the program has no all-reduce"]


@pytest.mark.parametrize('rule,message', [
    ('', "--expect rule must be a non-empty string, got ''"),
    ('all-to-all', "--expect 'all-to-all': expected none, only:KINDS, "
     'has:KINDS, no:KINDS or no-KIND:REGEX'),
    ('only:all-to-al', "--expect 'only:all-to-al': unknown collective kind "
     "'all-to-al'; one of all-to-all, all-gather, all-reduce, "
     'collective-permute, reduce-scatter'),
    ('only:', "--expect 'only:': no collective kinds given"),
    ('no-all-gather:', "--expect 'no-all-gather:': empty pattern"),
    ('no-all-gather:(wi', "--expect 'no-all-gather:(wi': bad pattern: "
     'missing ), unterminated subpattern at position 0'),
    ('never:all-gather', "--expect 'never:all-gather': unknown rule 'never'; "
     'expected none, only:KINDS, has:KINDS, no:KINDS or no-KIND:REGEX'),
])
def test_bad_rules_fail_with_one_clear_message(rule, message):
  with pytest.raises(expect.ExpectRuleError) as e:
    expect.ParseRule(rule)
  assert str(e.value) == message
