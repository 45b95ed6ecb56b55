"""The command line's own process freezes its imports before its work (emulate/release.py
freeze_imports): once, only there, and what it makes afterwards is still collected."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import gc, weakref
    from quantscope.emulate import release

    loaded = []
    print(release.freeze_imports(lambda: loaded.append(1)), loaded, gc.get_freeze_count() > 0)
    release.own_process()
    if {frozen_before}:
        gc.freeze()
    print(release.freeze_imports(lambda: loaded.append(2)), loaded, gc.get_freeze_count() > 0)
    print(release.freeze_imports(lambda: loaded.append(3)), loaded)

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle made after the freeze
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    print(gone() is None)
""")


def _run(frozen_before: bool) -> list[str]:
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(frozen_before=frozen_before)],
                          capture_output=True, text=True, timeout=120, check=True)
    return done.stdout.splitlines()


def test_the_command_lines_own_process_freezes_once_before_its_work():
    out = _run(frozen_before=False)
    assert out[0] == "False [] False"  # not the command line's own process: nothing frozen
    assert out[1] == "True [2] True"  # its own: loaded, then frozen
    assert out[2] == "False [2]"  # once
    assert out[3] == "True"  # a cycle made afterwards is still collected


def test_a_process_that_froze_before_is_left_as_it_is():
    out = _run(frozen_before=True)
    assert out[1] == "False [] True"  # a test worker's own freeze: nothing loaded or frozen
