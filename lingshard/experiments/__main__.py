"""`python -m lingshard.experiments`: see reproduce.py."""

from lingshard.experiments import reproduce

if __name__ == '__main__':
  reproduce.main()
