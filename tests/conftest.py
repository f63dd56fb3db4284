import faulthandler
import os
import threading

import pytest

from common import devices

_collected: set[str] = set()  # under xdist, the controller's: every test a worker collected
_reported: set[str] = set()  # and every test a worker reported on


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """A test that kills its pytest-xdist worker (a segfault, an abort) ends the suite, failing,
    unless --max-worker-restart says otherwise: xdist would start another worker, and its
    scheduler can then wait forever for the dead worker's `xdist_group` (tools/suite.py)."""
    if config.pluginmanager.hasplugin("xdist") and config.option.maxworkerrestart is None:
        config.option.maxworkerrestart = "0"


@pytest.hookimpl(optionalhook=True)
def pytest_timeout_set_timer(item, settings):
    """pytest-timeout's thread method, its report on stderr: an xdist worker's stdout, where
    pytest-timeout writes, is /dev/null (execnet talks over a copy of the real one), and the
    suite would only say that the worker crashed. The line and every thread's stack, then the
    process ends, as pytest-timeout ends it."""
    if settings.method != "thread" or not settings.timeout:
        return None

    def timed_out():
        capture = item.config.pluginmanager.getplugin("capturemanager")
        if capture:
            capture.suspend_global_capture(in_=True)  # fd 2 is the real stderr again
        line = f"+++ Timeout: {item.nodeid} ran past its {settings.timeout:g} s limit\n"
        os.write(2, line.encode())
        faulthandler.dump_traceback(all_threads=True)
        os._exit(1)

    timer = threading.Timer(settings.timeout, timed_out)
    timer.daemon = True
    item.cancel_timeout = timer.cancel
    timer.start()
    return True


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    _collected.update(ids)


def pytest_runtest_logreport(report):
    _reported.add(report.nodeid)


def pytest_terminal_summary(terminalreporter):
    """Name the tests that a crashed worker took with it: they neither passed nor failed."""
    lost = sorted(_collected - _reported)
    if lost:
        terminalreporter.write_line(f"{len(lost)} test(s) never ran (a worker crashed):", red=True)
        for nodeid in lost:
            terminalreporter.write_line(f"  {nodeid}")


def pytest_collection_modifyitems(config, items):
    if devices.count_accelerators() > 0:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; this machine has none")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
