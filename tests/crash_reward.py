"""A reward that kills its pilot once: the test double for a pilot dying mid-run (OOM kill).

Custom rewards run in a child process of the pilot (race.tasks.rewards.isolated), so the OOM killer
is played by SIGKILL on the parent. Pilot processes fork from a server started earlier, so they
do not see environment variables set by a test later; the trigger is a marker file at a fixed
path instead.
"""
import os
import signal
import tempfile

MARKER = os.path.join(tempfile.gettempdir(), "race-test-crash-once")


def reward(prompt: str, completion: str, reference: str) -> float:
    try:
        os.rename(MARKER, MARKER + ".taken")          # exactly one process wins the rename
    except OSError:
        pass
    else:
        os.kill(os.getppid(), signal.SIGKILL)         # no cleanup, no message: like the OOM killer
        os._exit(137)
    return 1.0 if completion.split("</s>")[0].strip() == reference else 0.0
