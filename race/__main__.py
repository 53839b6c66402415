"""``python -m race``: the ``race`` command (race.run.cli)."""
from race.run.cli import main

if __name__ == "__main__":
    main()
