"""Pilot storage on optuna: one study per diagnosis, one trial per pilot (the layout:
``race.run.store.study``). The only RACE package that imports optuna (``import race`` never loads it).

By concept: ``engine`` opens a storage from a URL, ``codec`` packs values into attributes,
``liveness`` tells whether a trial's process is gone, ``trials`` maps trials to pilots,
``study`` is the ``Store`` of one study, over ``coordinator`` (its one coordinator),
``heartbeats`` (its trials' heartbeats and the sweep of abandoned ones) and ``info`` (``StudyInfo``,
``Claim``, config comparisons); ``base`` holds the constants and ``StoreError``.
Storage URLs are parsed and masked by ``race.core.urls``.
"""
from __future__ import annotations

import warnings

import optuna

from race.run.store.base import (ATTR_LIMIT, COORDINATOR, CURVE_POINTS, DEFAULT_HEARTBEAT, ENCODED, GRACE_FACTOR,
                             HEARTBEAT, OWNER, SCHEMA, StoreError, UnreadyStudy)
from race.run.store.codec import decode_floats, encode_floats
from race.run.store.engine import default_url, mask_url, open_storage
from race.run.store.liveness import owner_info, owner_is_dead
from race.run.store.study import Claim, Store, StudyInfo, load_results, require_storage_file
from race.run.store.trials import Key, is_pilot_failure, key_of, pilot_attrs, pilot_from_attrs

warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
optuna.logging.set_verbosity(optuna.logging.WARNING)

__all__ = ["ATTR_LIMIT", "COORDINATOR", "CURVE_POINTS", "Claim", "DEFAULT_HEARTBEAT", "ENCODED", "GRACE_FACTOR",
           "HEARTBEAT", "Key", "OWNER", "SCHEMA", "Store", "StoreError", "StudyInfo", "decode_floats", "default_url",
           "encode_floats", "is_pilot_failure", "key_of", "load_results", "mask_url", "open_storage", "owner_info",
           "owner_is_dead", "pilot_attrs", "pilot_from_attrs", "require_storage_file", "UnreadyStudy"]
