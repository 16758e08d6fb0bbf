"""sbx_freeze: a pytest plugin that freezes the sandbox at the first failing test.

    python3 -m pytest -p sbx_freeze ...

In an sbx sandbox (where /.sbx/freeze exists), the first test that fails is
frozen at its failure, before its teardown runs: the sandbox's whole state --
this process stopped in the failing test's frame at the failing line, with its
locals, its fixtures and whatever they started -- becomes a named snapshot
(`sbx new --from NAME` resumes a copy). In the original, pytest goes on as it
would have. In a copy, this process holds in the failing frame for good, to be
looked at from outside (gdb; sbx hunt --freeze reads its Python stack).

How: while a test function runs, a trace function watches the test's own frame
for an exception that no handler in that frame will catch (its exception
table says so): that is the test failing, at that line, and the freeze happens
there, inside the frame. A test that fails another way (in a fixture; inside a
try or with block of its own; with tracing taken by a debugger or coverage) is
frozen when pytest reports the failure, still before the teardown; its failing
frames are then in sys.last_traceback.

Nothing happens outside sbx, or with SBX_FREEZE=0.
"""

import dis
import os
import subprocess
import sys
import time

import pytest

FREEZE = os.environ.get("SBX_FREEZE_COMMAND", "/.sbx/freeze")
# the freeze command's exit code in a copy resumed from the freeze
_COPY = 3

_state = {"tried": False, "message": None}


def _enabled():
    return os.environ.get("SBX_FREEZE", "1") != "0" and os.path.exists(FREEZE)


def _expected_to_fail(item):
    return item.get_closest_marker("xfail") is not None and not item.config.getoption("runxfail", False)


def _is_failure(exc):
    """Whether an exception escaping a test fails it (a skip, an xfail or an
    exit does not; pytest.fail does)."""
    try:
        from _pytest.outcomes import Failed, OutcomeException
    except ImportError:  # pragma: no cover
        Failed = OutcomeException = ()
    if isinstance(exc, Failed):
        return True
    if OutcomeException and isinstance(exc, OutcomeException):
        return False
    return isinstance(exc, Exception)


def _caught_here(frame):
    """Whether a handler of frame covers its current instruction: an
    exception there may be caught, so it is not yet a failure."""
    try:
        table = dis._parse_exception_table(frame.f_code)
    except Exception:
        return True  # no exception table (before 3.11): leave it to the report
    lasti = frame.f_lasti
    return any(e.start <= lasti < e.end for e in table)


def _hold():
    """A copy's hold: this process stays where it froze. A debugger's call
    into it may cut a sleep short; that is no reason to move on."""
    sys.settrace(None)
    while True:
        try:
            time.sleep(3600)
        except OSError:
            pass


def _freeze(reason, failed_at):
    _state["tried"] = True
    try:
        r = subprocess.run(
            [FREEZE, "--no-hold", "--reason", reason, "--failed-at", "%.9f" % failed_at],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
    except OSError as e:
        _state["message"] = "sbx freeze: cannot run %s: %s" % (FREEZE, e)
        return
    if r.returncode == _COPY:
        _hold()
    _state["message"] = r.stderr.decode("utf-8", "replace").strip() or (
        "sbx freeze: %s exited %d" % (FREEZE, r.returncode))


def _code_of(func):
    func = getattr(func, "__func__", func)
    while hasattr(func, "__wrapped__"):
        func = func.__wrapped__
    return getattr(func, "__code__", None)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    code = _code_of(pyfuncitem.obj)
    if (_state["tried"] or code is None or not _enabled() or sys.gettrace() is not None
            or _expected_to_fail(pyfuncitem)):
        yield
        return
    reason = pyfuncitem.nodeid

    def local(frame, event, arg):
        if event == "exception" and not _state["tried"]:
            exc = arg[1]
            if _is_failure(exc) and not _caught_here(frame):
                # the test fails here: freeze in its frame, before anything unwinds
                _freeze(reason, time.time())
        return local

    def calls(frame, event, arg):
        if frame.f_code is code:
            frame.f_trace_lines = False
            return local
        return None

    sys.settrace(calls)
    try:
        yield
    finally:
        sys.settrace(None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed and not _state["tried"] and _enabled() and not _expected_to_fail(item):
        if call.excinfo is not None:
            # the failing frames, for whoever looks at the copy
            sys.last_type, sys.last_value, sys.last_traceback = (
                call.excinfo.type, call.excinfo.value, call.excinfo.tb)
        _freeze("%s (%s)" % (item.nodeid, rep.when), call.stop or time.time())
    if rep.failed and _state["message"] and not getattr(item, "_sbx_freeze_told", False):
        item._sbx_freeze_told = True
        rep.sections.append(("sbx freeze", _state["message"]))


def pytest_terminal_summary(terminalreporter):
    if _state["message"]:
        terminalreporter.write_line(_state["message"])
