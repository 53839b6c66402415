import subprocess
import sys

HEAVY = ("torch", "transformers", "vllm", "optuna", "peft", "sklearn", "matplotlib", "scipy")


def test_import_race_is_light():
    code = ("import sys, race, race.config.configfile, race.flops.grid, race.flops.formulas, race.flops.catalog, race.stats.report, race.stats.results, "
            "race.core.records, race.stats.fit, race.stats.regime, race.run.cli, race.tasks, race.tasks.rewards, race.run.api, race.config.presets, race.flops.memory, race.engine.backends, race.run.plot, race.run.compare, race.stats.instability, race.stats.forecast\n"
            f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
            "print(','.join(heavy))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"import race pulled in: {out.stdout.strip()}"


def test_planning_a_real_model_stays_light():
    """race plan / race init plan from config.json and formulas alone: no torch (it used to come
    in through the lean backend's list of model types, 2.5 s of a 1.5B plan)."""
    code = ("import sys, os\n"
            "from race.config.configfile import load_config\nfrom race.flops.grid import plan_grid\n"
            "plan_grid(load_config(os.path.join('pilots', 'qwen2.5-1.5b-sparse.yaml')))\n"
            f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))\n")
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.strip() == "", f"planning pulled in: {out.stdout.strip()}"
