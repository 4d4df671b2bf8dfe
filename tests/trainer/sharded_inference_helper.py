"""Subprocess helper of test_sharded_inference.py: the trainer's
`--mode=eval` then `--mode=decode` (trainer.Execute, in one process) under
MirroredStrategy over 2 virtual CPU devices. Arguments: the trainer flags
both runs share. Prints the lines the trainer printed."""

from lingshard import startup

if __name__ == '__main__':  # A program: its start-up before TF's import.
  startup.Install()

import sys

from lingshard.train import strategies

# Before TF initialises (the trainer splits the CPU at most once a process).
strategies.ConfigureCpuDevices(2)

# pylint: disable=g-import-not-at-top,wrong-import-position
from lingshard import trainer  # noqa: E402
from tests.trainer import trainer_testlib  # noqa: E402


def main(args):
  for mode in ('eval', 'decode'):
    trainer.Execute(trainer_testlib.ParseFlags(
        *args, f'--mode={mode}', '--strategy=mirrored'), printer=print)


if __name__ == '__main__':
  main(sys.argv[1:])
