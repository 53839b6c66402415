"""The faces and the study: the ``race`` command, ``race.diagnose()``, and a grid run as an optuna study.

Interface:
- ``cli``: the ``race`` command; ``cli_pilot``: its ``pilot`` and ``worker`` commands; ``cli_support``:
  what every command shares (one ``Error:`` line and exit 2, help in groups, safe terminal output).
- ``api``: ``diagnose``, ``run_models``, ``run_probe``: config → grid → diagnosis, raising ``RaceError``.
- ``options``: ``RunOptions``, how a grid runs (workers, engine, adaptive policy and share, …),
  checked once; the one table of engines.
- ``adaptive``: adaptive policies as objects (``informative``, ``halving``, ``budget-halving``) behind one
  protocol.
- ``rungs``: budget halving's record: the points it dropped as the pilots the fit takes, its rungs and
  compute in results.json.
- ``prechecks``: the table of checks a grid passes before anything is written.
- ``sizing``: ``size_pilots``: a config sized from the full run by its pilot design (``race pilot --design``).
- ``study``: ``run_grid``: a grid as an optuna study (create or resume, calibrate and plan, coordinate).
- ``workers``: the queue of a study's pilots a coordinator and ``race worker`` share.
- ``processes``: pilot processes from a fork server, at most N at a time.
- ``extend``: ``race pilot --extend N``; ``newconfig``: ``race init``; ``compare``: grids side by
  side; ``plot``: figures; ``multimodel``: a grid over policies read as one answer.
- ``store``: the optuna storage of a study.

Invariants: the top of the house: nothing in RACE imports it (``race`` resolves its public names
here lazily).
"""
