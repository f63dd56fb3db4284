"""torch's all-reduce benchmark (torch_impl/allreduce.py), 2 ranks on loopback: each checks its
sums (common/collectives.py) and rank 0 records the times; and a peer lost inside it
(tests/fixtures/lost_peer.py)."""

import pytest

from tests.fixtures import lost_peer
from tests.fixtures.collectives import two_loopback_ranks

FRAMEWORK = "torch"


@pytest.mark.multi_device
def test_two_loopback_ranks_time_every_size(tmp_path):
    assert two_loopback_ranks("torch", tmp_path)["collective"] == "dist.all_reduce (gloo)"


@pytest.mark.slow
@pytest.mark.multi_device
def test_a_peer_lost_inside_the_benchmark_ends_the_other_node_by_itself(tmp_path):
    lost_peer.check_benchmark(FRAMEWORK, tmp_path)
