"""`python -m mxnet_impl --workload lenet --gpus 2`: see common/cli.py for the arguments."""

import sys

from common import cli

if __name__ == "__main__":
    sys.exit(cli.run("mxnet"))
