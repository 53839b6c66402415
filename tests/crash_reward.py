"""A reward that kills its process once: the test double for a pilot dying mid-run (OOM kill).

Pilot processes fork from a server started earlier, so they do not see environment
variables set by a test later; the trigger is a marker file at a fixed path instead.
"""
import os
import tempfile

MARKER = os.path.join(tempfile.gettempdir(), "race-test-crash-once")


def reward(prompt: str, completion: str, reference: str) -> float:
    try:
        os.rename(MARKER, MARKER + ".taken")          # exactly one process wins the rename
    except OSError:
        pass
    else:
        os._exit(137)                                 # no cleanup, no message: like the OOM killer
    return 1.0 if completion.split("</s>")[0].strip() == reference else 0.0
