"""The RACE version: one place, below every module that records it (results, pilots, configs)."""
__version__ = "0.1.0"
