"""``python -m cli`` (or ``python cli.py``) from a checkout: the ``eagle2-local`` command line, whose commands
live in ``eagle2_local/commands/``."""

from eagle2_local.commands import main

if __name__ == "__main__":
    main()
