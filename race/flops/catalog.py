"""Model architectures by name: the public ``config.json`` files RACE ships, or yours.

Pure (stdlib only). The shipped files in ``race/assets/configs/`` are the configs as
published on the Hugging Face hub, named ``<org>--<name>.json``, so planning works
offline and without downloading weights::

    >>> load_arch("qwen/qwen2.5-1.5b-instruct").num_layers
    28
"""
from __future__ import annotations

import json
from pathlib import Path

from race.core.errors import ConfigError
from race.flops.architectures import ArchReading, read_arch
from race.flops.formulas import ArchSpec, RewardModelSpec

ASSETS_DIR = Path(__file__).resolve().parents[1] / "assets"
CONFIG_DIR = ASSETS_DIR / "configs"
SHIPPED_PREFIX = "race/"          # race/<name>: a tiny model shipped in race/assets/<name>/


def shipped_models() -> list[str]:
    """Names of the tiny models RACE ships with weights (``race/tiny-arith``, ...)."""
    return sorted(SHIPPED_PREFIX + p.parent.name for p in ASSETS_DIR.glob("*/config.json")
                  if p.parent.name != "configs")


def _is(kind: str, path: Path, name: str) -> bool:
    """``path.is_dir()`` / ``path.is_file()`` (``kind``), with a path the system cannot even look up
    (a name over 255 bytes, a path past PATH_MAX: ``OSError``) a one-line ``ConfigError`` naming
    ``name`` (shortened) instead of a traceback."""
    try:
        return path.is_dir() if kind == "dir" else path.is_file()
    except OSError as e:
        from race.core.errors import ConfigError
        from race.core.safeio import quote

        raise ConfigError(f"model {quote(name, 80)} cannot be looked up as a path ({e.strerror or type(e).__name__}): "
                          "expected a Hugging Face id, a shipped race/<name> model or a folder with a config.json"
                          ) from None


def resolve_model_path(name_or_path: str) -> str:
    """What ``from_pretrained`` should load: the folder of a shipped ``race/<name>`` model,
    an existing local path as given, or the Hugging Face id unchanged."""
    if isinstance(name_or_path, str) and name_or_path.lower().startswith(SHIPPED_PREFIX):
        folder = ASSETS_DIR / name_or_path[len(SHIPPED_PREFIX):]
        if _is("file", folder / "config.json", name_or_path):
            return str(folder)
    return name_or_path


def load_error(name: str, error: OSError, what: str = "model"):
    """The one-line ``ConfigError`` for weights or a tokenizer ``from_pretrained`` could not load
    (``error``: its OSError: not in the local cache while the hub is out of reach, a misspelt or
    gated id, a folder without weights), naming ``name`` and the ways to give it; raise it ``from None``."""
    import os
    import re

    from race.core.errors import ConfigError
    from race.core.safeio import quote

    why = re.split(r"(?<=[.!?])\s", " ".join(str(error).split()), maxsplit=1)[0]     # its first sentence
    why = (why[:200] + " …") if len(why) > 200 else why
    local = Path(str(name)).expanduser().is_absolute() or str(name).startswith((".", "~"))
    how = ("check that the folder holds its config.json, weights and tokenizer files" if local else
           f"give a folder that holds it (model: /path/to/it), or fetch it into the Hugging Face cache on a "
           f"machine that reaches the hub (`hf download {name}`)")
    if not local and os.environ.get("HF_HUB_OFFLINE", "").lower() not in ("1", "true", "yes", "on"):
        how += "; HF_HUB_OFFLINE=1 skips the hub's retries where there is no network"
    return ConfigError(f"{what} {quote(str(name), 120)} could not be loaded ({why or type(error).__name__}): {how}")


def check_loadable(name_or_path: str, setting: str) -> None:
    """A one-line ``ConfigError`` when ``name_or_path`` can be neither a shipped model, an
    existing folder with a ``config.json``, nor a Hugging Face id (``namespace/name``)."""
    import re

    from race.core.errors import ConfigError

    path = resolve_model_path(name_or_path)
    if _is("dir", Path(path).expanduser(), name_or_path):
        if not _is("file", Path(path).expanduser() / "config.json", name_or_path):
            raise ConfigError(f"{setting} {name_or_path!r} is a folder without a config.json")
        return
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?", name_or_path) or name_or_path.startswith("race/"):
        raise ConfigError(f"{setting} {name_or_path!r} is not a folder, a shipped race/<name> model or a "
                          f"Hugging Face id (namespace/name)")


def known_models() -> list[str]:
    """Hugging Face ids of the shipped configs, sorted."""
    return sorted(p.stem.replace("--", "/", 1) for p in CONFIG_DIR.glob("*.json"))


def _read_json(path: Path) -> dict:
    from race.core.safeio import MAX_CONFIG_BYTES, UnsafeInput, read_capped

    try:
        cfg = json.loads(read_capped(str(path), limit=4 * MAX_CONFIG_BYTES, what=f"model config {str(path)!r}"))
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path} is not valid JSON: {err}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not UTF-8 text: expected a model's config.json") from None
    except UnsafeInput as e:
        raise ConfigError(str(e)) from None
    except ValueError as e:      # an integer past Python's 4,300 digits
        raise ConfigError(f"{path} holds a number Python cannot read: {str(e)[:80]}") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path} holds a {type(cfg).__name__}, expected a JSON object")
    return cfg


def _resolve(name_or_path: str) -> tuple[str, dict]:
    """(display name, config dict). A path that exists wins over a shipped id."""
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise ConfigError(f"expected a model id or a path, got {name_or_path!r}")
    shipped = resolve_model_path(name_or_path)
    if shipped != name_or_path:
        return SHIPPED_PREFIX + Path(shipped).name, _read_json(Path(shipped) / "config.json")
    path = Path(name_or_path).expanduser()
    if _is("dir", path, name_or_path):
        if not _is("file", path / "config.json", name_or_path):
            raise ConfigError(f"folder {str(path)!r} has no config.json")
        return path.name, _read_json(path / "config.json")
    if _is("file", path, name_or_path) and path.suffix == ".json":
        return path.stem, _read_json(path)
    wanted = name_or_path.strip().lower()
    for hf_id in known_models():
        if hf_id.lower() == wanted:
            return hf_id, _read_json(CONFIG_DIR / (hf_id.replace("/", "--", 1) + ".json"))
    raise ConfigError(f"unknown model {name_or_path!r}: expected one of "
                     f"{', '.join(known_models() + shipped_models())} or a folder with a config.json")


def load_hf_config(name_or_path: str) -> dict:
    """The ``config.json`` dict for a shipped HF id (any letter case), a folder that
    contains ``config.json``, or a path to a ``.json`` file."""
    return _resolve(name_or_path)[1]


def load_arch_reading(name_or_path: str, *, allow_approximate: bool = False, what: str = "model") -> ArchReading:
    """``race.flops.architectures.read_arch`` of a model named like `load_hf_config`: the spec, the
    family it was read as, and warnings. An architecture outside the table is refused
    (``UnsupportedArchitecture``, one line) unless ``allow_approximate``."""
    name, cfg = _resolve(name_or_path)
    return read_arch(cfg, name=name, allow_approximate=allow_approximate, what=what)


def load_arch(name_or_path: str, *, allow_approximate: bool = False) -> ArchSpec:
    """``ArchSpec`` of a model, named like `load_hf_config`; its name is the HF id
    (as shipped) or the folder / file name."""
    return load_arch_reading(name_or_path, allow_approximate=allow_approximate).arch


def reward_model_spec(cfg: dict, name: str, *, allow_approximate: bool = False) -> RewardModelSpec:
    """``RewardModelSpec`` from a reward model's config dict, by its ``architectures``:

    - ``*ForProcessRewardModel`` (Qwen2.5-Math-PRM): head Linear(h, h), ReLU,
      Linear(h, 2) on every token;
    - ``*ForRewardModel`` (Qwen2.5-Math-RM): the same head with 1 label;
    - ``*ForSequenceClassification`` / ``*ForTokenClassification``: Linear(h, labels),
      labels from ``num_labels`` or ``id2label`` (transformers' default: 2);
    - anything else: a scalar head Linear(h, 1) on the model's body.
    """
    arch = read_arch(cfg, name=name, allow_approximate=allow_approximate, what="reward model").arch
    architecture = (cfg.get("architectures") or [""])[0]
    if architecture.endswith("ForProcessRewardModel"):
        return RewardModelSpec(arch, num_labels=2, head_hidden_size=arch.hidden_size)
    if architecture.endswith("ForRewardModel"):
        return RewardModelSpec(arch, num_labels=1, head_hidden_size=arch.hidden_size)
    if architecture.endswith(("ForSequenceClassification", "ForTokenClassification")):
        labels = cfg.get("num_labels") or len(cfg.get("id2label") or {}) or 2
        return RewardModelSpec(arch, num_labels=int(labels))
    return RewardModelSpec(arch, num_labels=1)


def load_reward_model(name_or_path: str, *, allow_approximate: bool = False) -> RewardModelSpec:
    """``RewardModelSpec`` of a reward model named like `load_hf_config` (`reward_model_spec`)."""
    name, cfg = _resolve(name_or_path)
    return reward_model_spec(cfg, name, allow_approximate=allow_approximate)
