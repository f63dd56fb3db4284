"""jax's multi-node engine across two network namespaces (cluster/train.py), each node with its
own address, interface and core, the host name resolving to loopback as it is: the record and
the bytes its link carried; and a fault on node 1 (kill, in the middle of the run) that ends
every node within a minute with one line (the other faults: tests/common/test_cluster.py)."""

import pytest

from tests.fixtures import cluster_runs

pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("netns"),  # one at a time: nodes on cores and links of their own
    pytest.mark.multi_device,
    pytest.mark.skipif(bool(cluster_runs.why_not()), reason=f"{cluster_runs.why_not()}"),
]


def test_two_nodes_train_over_their_link(tmp_path):
    cluster_runs.two_nodes("jax", tmp_path)


def test_a_fault_on_one_node_ends_every_node(tmp_path):
    cluster_runs.fault("jax", tmp_path, "kill", "epoch 1/")


@pytest.mark.parametrize("kind", ["kill", "link"])
def test_each_node_ends_by_itself_when_a_peer_or_the_link_goes(tmp_path, kind):
    cluster_runs.alone("jax", tmp_path, kind)
