import mxnet as mx

from common import devices, results
from mxnet_impl import devices as mdev
from tests.fixtures import locks


def test_cpu_contexts_are_distinct():
    devs = mdev.get_devices(devices.DevicePlan(2, "cpu", True))
    assert devs == [mx.cpu(0), mx.cpu(1)]
    x = mx.nd.ones((2,), ctx=devs[1])
    mdev.sync()
    assert x.context == mx.cpu(1)
    assert mdev.versions()["mxnet"] == "1.9.1"


def test_the_record_names_the_locked_versions():
    versions, _ = results.environment(mdev.versions())
    locks.check_versions(versions, ["mxnet", "numpy"])
    locks.check_environment()
