"""mxnet's all-reduce benchmark (mxnet_impl/allreduce.py), 2 ranks on loopback: each checks its
sums (common/collectives.py) and rank 0 records the times."""

import pytest

from tests.fixtures.collectives import two_loopback_ranks


@pytest.mark.multi_device
def test_two_loopback_ranks_time_every_size(tmp_path):
    assert two_loopback_ranks("mxnet", tmp_path)["collective"] == "kvstore pushpull (dist_sync)"
