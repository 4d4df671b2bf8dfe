"""Runs a tool's `main` with the tool's own (private) FlagValues.

Each tool defines its flags on a private `flags.FlagValues()`, so several
tools can be imported in one process (tests) without duplicate-flag errors.
"""

import sys

from absl import app
from absl import flags


def RunMain(main, flag_values):
  """`app.run(main)` parsing argv into `flag_values` (absl's own flags,
  e.g. --verbosity, stay on the global FLAGS and keep their defaults)."""

  def Parse(argv):
    if any(a in ('-h', '--help', '--helpshort', '--helpfull')
           for a in argv[1:]):
      print(f'{argv[0]}:\n{flag_values.get_help()}')
      sys.exit(0)
    try:
      rest = flag_values(argv)
    except flags.Error as e:
      sys.exit(f'{argv[0]}: error: {e}\nTry --help.')
    flags.FLAGS(rest[:1])  # Marks absl's global flags as parsed.
    return rest

  app.run(main, flags_parser=Parse)
