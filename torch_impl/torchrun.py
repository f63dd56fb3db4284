"""torchrun (`python -m torch.distributed.run`) as the launcher (launch.py) starts it: the same
program, quiet when it stops. torchrun turns a stop signal into a SignalException (it stops its
workers with that signal, then the exception ends it with a traceback), and a failed worker into
a ChildFailedError (a traceback and a box under the worker's own output). Here a stop ends with
exit 128 + the signal's number, and a failed worker with one line saying which and how; a
worker that failed on bad input left its line for the launcher (launch.worker_main), which ends
on it.
"""

import logging
import sys

from torch.distributed import run
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from common import signals


def main() -> int:
    # Its launcher gone, even SIGKILLed (before this process could look, too): a SIGTERM to
    # itself, which torchrun passes to its workers before it ends, as when the launcher stops it.
    signals.watch_launcher()
    # Its warning per worker it stops ("Sending process N closing signal SIGTERM"): the
    # launcher says what happened, in one line.
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.ERROR)
    try:
        run.main()  # its arguments: sys.argv[1:]
    except SignalException as e:
        return 128 + int(e.sigval)
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        how = f"exit code {failure.exitcode}"
        if failure.exitcode < 0:  # killed: nothing of its own said why
            how = f"signal {failure.signal_name()}"
        print(f"torchrun: worker rank {rank} ended with {how}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
