"""torchrun (`python -m torch.distributed.run`) as the launcher (launch.py) starts it: the same
program, quiet when it is stopped. torchrun turns a stop signal into a SignalException: it
stops its workers with that signal, then the exception ends it with a traceback on top of the
run's own last line. Here it ends with exit 128 + the signal's number, torch's log lines only.
"""

import sys

from torch.distributed import run
from torch.distributed.elastic.multiprocessing.api import SignalException


def main() -> int:
    try:
        run.main()  # its arguments: sys.argv[1:]
    except SignalException as e:
        return 128 + int(e.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
