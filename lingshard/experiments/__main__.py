"""`python -m lingshard.experiments`: see reproduce.py."""

from lingshard import startup

if __name__ == '__main__':  # A program: its start-up before TF's import.
  startup.Install()

from lingshard.experiments import reproduce

if __name__ == '__main__':
  reproduce.main()
