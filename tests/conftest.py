import pytest

from common import devices


def pytest_collection_modifyitems(config, items):
    if devices.count_accelerators() > 0:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; this machine has none")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
