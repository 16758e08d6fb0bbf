# sbx_pystack: run inside a Python process (gdb calls PyRun_SimpleString in
# it: see sbx-agent pystack) to write the stack of each of its threads, with
# each frame's locals, to the file OUT, which the caller passes in the globals
# it runs this with. Like a traceback: the outermost frame first. The frames of
# this script and of the call that runs it are left out. If the process kept a
# failure in sys.last_traceback (the sbx_freeze plugin does), its frames follow.
import linecache
import sys
import threading

_MAX_REPR = 400
_MAX_LOCALS = 60
_ME = __file__ if "__file__" in globals() else "<sbx_pystack>"


def _repr(v):
    try:
        r = repr(v)
    except Exception as e:  # a broken __repr__ says so, and the dump goes on
        r = "<repr failed: %s>" % type(e).__name__
    if len(r) > _MAX_REPR:
        r = r[:_MAX_REPR] + "..."
    return r


def _frame(out, fr, lineno=None):
    co = fr.f_code
    lineno = fr.f_lineno if lineno is None else lineno
    out.append('  File "%s", line %s, in %s\n' % (co.co_filename, lineno, co.co_name))
    line = linecache.getline(co.co_filename, lineno or 0).strip()
    if line:
        out.append("    %s\n" % line)
    try:
        items = list(fr.f_locals.items())
    except Exception as e:
        out.append("      <locals unreadable: %s>\n" % type(e).__name__)
        return
    if co.co_name == "<module>":
        return  # a module's globals are not its locals
    for i, (k, v) in enumerate(items):
        if i >= _MAX_LOCALS:
            out.append("      ... %d more\n" % (len(items) - i))
            break
        out.append("      %s = %s\n" % (k, _repr(v)))


def _dump():
    out = []
    names = {t.ident: t.name for t in threading.enumerate()}
    for tid, fr in sys._current_frames().items():
        stack = []
        while fr is not None:
            stack.append(fr)
            fr = fr.f_back
        stack.reverse()
        # the injected call's frames (this script, the "<string>" that runs
        # it) are the innermost ones of the thread gdb called in
        while stack and (stack[-1].f_code.co_filename in (_ME, "<string>")):
            stack.pop()
        out.append("Thread %d (%s), most recent call last:\n" % (tid, names.get(tid, "?")))
        for f in stack:
            _frame(out, f)
        out.append("\n")
    tb = getattr(sys, "last_traceback", None)
    if tb is not None:
        out.append("The failure this process kept (sys.last_traceback): %s\n" % _repr(getattr(sys, "last_value", None)))
        while tb is not None:
            _frame(out, tb.tb_frame, tb.tb_lineno)
            tb = tb.tb_next
    return "".join(out)


with open(OUT, "w") as _f:  # noqa: F821 (given by the caller)
    _f.write(_dump())
