import subprocess
import sys

HEAVY = ("torch", "transformers", "vllm", "optuna", "peft", "sklearn", "matplotlib")


def test_import_race_is_light():
    code = ("import sys, race, race.config, race.grid, race.flops, race.models, race.report, race.results, "
            "race.records, race.fit, race.regime, race.cli, race.tasks, race.rewards, race.api, race.presets, race.memory, race.backends, race.plot, race.compare\n"
            f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
            "print(','.join(heavy))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"import race pulled in: {out.stdout.strip()}"
