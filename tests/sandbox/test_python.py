"""The persistent Python interpreter: notebook semantics, fd-level capture, clean failures."""

from __future__ import annotations

import anyio
import pytest

from sandbank.protocol.calls import PythonCall
from sandbank.sandbox.backends.base import INTERPRETERS, ISOLATION
from sandbank.sandbox.local import LocalSandboxes
from tests.sandbox.conftest import Shell
from tests.support import data_dir, settings

pytestmark = [pytest.mark.anyio, pytest.mark.claims(INTERPRETERS)]


async def test_namespace_imports_files_and_threads_survive_across_calls(sb: Shell) -> None:
    r = await sb.py(
        "import json, threading, time\n"
        "x = 41\n"
        "fh = open('keep.txt', 'w')\n"
        "ticks = []\n"
        "t = threading.Thread(target=lambda: [ticks.append(1) or time.sleep(0.01) for _ in range(1000)], daemon=True)\n"
        "t.start()"
    )
    assert r.return_code == 0, r.stderr
    r = await sb.py(
        "fh.write('still open'); fh.flush(); print(x + 1, json.dumps([1]), t.is_alive(), len(ticks) > 0)"
    )
    assert r.stdout == "42 [1] True True\n"
    assert (await sb.py("print(open('keep.txt').read())")).stdout == "still open\n"


async def test_last_expression_repr_is_printed_unless_none(sb: Shell) -> None:
    assert (await sb.py("a = [1, 2]\na")).stdout == "[1, 2]\n"
    assert (await sb.py("'text'")).stdout == "'text'\n"
    assert (await sb.py("None")).stdout == ""
    assert (await sb.py("print('p')")).stdout == "p\n"  # print's None is not echoed
    assert (await sb.py("x = 5")).stdout == ""
    assert (await sb.py("x + 1;")).stdout == ""  # a trailing semicolon silences it, as in Jupyter
    assert (await sb.py("x + 1  # no semicolon here;")).stdout == "6\n"


async def test_output_of_subprocesses_and_c_level_writes_is_captured(sb: Shell) -> None:
    r = await sb.py(
        "import os, subprocess, sys\n"
        "os.system('echo from-system; echo sys-err >&2')\n"
        "subprocess.run(['echo', 'from-subprocess'])\n"
        "os.write(1, b'raw-fd\\n')\n"
        "print('to-stderr', file=sys.stderr)"
    )
    assert "from-system" in r.stdout and "from-subprocess" in r.stdout and "raw-fd" in r.stdout
    assert "sys-err" in r.stderr and "to-stderr" in r.stderr


async def test_python_s_own_output_and_its_children_s_keep_their_order(sb: Shell) -> None:
    # Python's prints join the call's output directly, the children's come through the pipe:
    # each print first takes what the pipe holds, so neither overtakes the other.
    r = await sb.py(
        "import os, subprocess, sys\n"
        "for i in range(3):\n"
        "    print(f'py{i}', flush=True)\n"
        "    os.system(f'echo sh{i}')\n"
        "    os.write(1, f'fd{i}\\n'.encode())\n"
        "print('err-py', file=sys.stderr, flush=True)\n"
        "subprocess.run(['sh', '-c', 'echo err-sh >&2'])\n"
        "print('last')"
    )
    assert r.stdout == "".join(f"py{i}\nsh{i}\nfd{i}\n" for i in range(3)) + "last\n"
    assert r.stderr == "err-py\nerr-sh\n"


async def test_a_fork_of_user_code_prints_into_the_call(sb: Shell) -> None:
    r = await sb.py(
        "import os\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    print('from-child', flush=True)\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "print('from-parent')"
    )
    assert r.stdout == "from-child\nfrom-parent\n", r.stderr


async def test_output_written_between_calls_is_never_given_to_a_later_call(sb: Shell) -> None:
    # A thread and a child process write after their call returned; the next call (which the
    # sandbox may start without a marker when its pipes are empty) shows only its own output.
    r = await sb.py(
        "import os, subprocess, threading, time\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), print('late-thread')), daemon=True).start()\n"
        "subprocess.Popen(['sh', '-c', 'sleep 0.2; echo late-child; echo late-err >&2'])"
    )
    assert r.return_code == 0, r.stderr
    await anyio.sleep(0.6)  # the late writers write while no call runs
    for _ in range(3):
        r = await sb.py("print('own')")
        assert (r.stdout, r.stderr) == ("own\n", ""), r


async def test_exception_gives_clean_traceback_and_code_1_and_interpreter_survives(
    sb: Shell,
) -> None:
    await sb.py("kept = 'yes'")
    r = await sb.py("def f():\n    return 1 / 0\nf()")
    assert r.return_code == 1
    assert "ZeroDivisionError: division by zero" in r.stderr
    assert "return 1 / 0" in r.stderr  # the user's own line is shown
    assert "worker.py" not in r.stderr and "sandbank" not in r.stderr
    assert (await sb.py("print(kept)")).stdout == "yes\n"


async def test_syntax_error_is_a_result(sb: Shell) -> None:
    r = await sb.py("def broken(:\n  pass")
    assert r.return_code == 1 and "SyntaxError" in r.stderr


async def test_system_exit_gives_its_code_and_interpreter_survives(sb: Shell) -> None:
    await sb.py("kept = 7")
    assert (await sb.py("raise SystemExit(3)")).return_code == 3
    assert (await sb.py("import sys; sys.exit()")).return_code == 0
    r = await sb.py("import sys; sys.exit('bye')")
    assert r.return_code == 1 and "bye" in r.stderr
    assert (await sb.py("kept")).stdout == "7\n"


async def test_produced_files_are_reported_relative_to_the_workspace(sb: Shell) -> None:
    await sb.py("open('before.txt', 'w').write('x')")
    r = await sb.py(
        "import os\nos.makedirs('out/deep', exist_ok=True)\n"
        "open('out/deep/r.csv', 'w').write('a,b')\nopen('before.txt', 'a').write('y')"
    )
    assert r.files == ["before.txt", "out/deep/r.csv"]
    assert (await sb.py("print(open('before.txt').read())")).files == []


@pytest.mark.claims(ISOLATION)  # /workspace exists in a root of its own only
async def test_workspace_is_cwd_and_home(sb: Shell) -> None:
    r = await sb.py("import os; print(os.getcwd(), os.environ['HOME'])")
    assert r.stdout == "/workspace /workspace\n"


async def test_a_figure_the_code_saved_itself_is_not_saved_twice(sb: Shell) -> None:
    r = await sb.py(
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3]); plt.savefig('chart.png')\n"  # left open: once, as chart.png
        "import io; plt.figure(); plt.bar([1], [2]); plt.savefig(io.BytesIO())"  # in memory
    )
    assert r.return_code == 0, r.stderr
    assert r.files == ["chart.png", "figure_1.png"]
    r = await sb.py("import matplotlib.pyplot as plt; print(plt.get_fignums())")
    assert r.stdout == "[]\n"  # every figure closed at the end of the call, as before


async def test_matplotlib_figures_are_saved_as_png_and_reported(sb: Shell) -> None:
    r = await sb.py(
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3])\nplt.show()\n"
        "plt.figure(); plt.bar([1], [2])"
    )
    assert r.return_code == 0, r.stderr
    assert r.files == ["figure_1.png", "figure_2.png"]
    r = await sb.py(
        "import matplotlib.pyplot as plt\n"
        "print(plt.get_fignums(), open('figure_1.png', 'rb').read(8))"
    )
    assert r.stdout == "[] b'\\x89PNG\\r\\n\\x1a\\n'\n"
    r = await sb.py("plt.plot([0]); 'third'")
    assert r.files == ["figure_3.png"]  # fresh names, never overwriting


async def test_output_beyond_the_cap_is_truncated_with_a_marker(sb: Shell) -> None:
    limit = sb.runtime.settings.output_limit_bytes
    r = await sb.py(
        f"import sys\nsys.stdout.write('x' * {limit * 3})\nprint('e' * 10, file=sys.stderr)"
    )
    assert r.stdout.startswith("x" * 1000)
    assert len(r.stdout) < limit + 200
    assert "[output truncated:" in r.stdout
    assert r.stderr == "e" * 10 + "\n"


async def test_code_that_closes_or_redirects_its_stdout_does_not_break_the_session(
    sb: Shell,
) -> None:
    r = await sb.py("import os\nos.close(1)\nos.dup2(os.open('/dev/null', os.O_WRONLY), 2)")
    assert r.return_code == 0
    r = await sb.py("import sys\nprint('back')\nprint('err', file=sys.stderr)")
    assert (r.stdout, r.stderr) == ("back\n", "err\n")
    # ...and the fds are the session's pipes again, for its children too.
    r = await sb.py("import os\n_ = os.system('echo child; echo child-err >&2')")
    assert (r.stdout, r.stderr) == ("child\n", "child-err\n")


async def test_a_stream_held_since_before_its_fd_was_renewed_still_writes_into_calls(
    sb: Shell,
) -> None:
    r = await sb.py(
        "import logging, os, sys\n"
        "log = logging.getLogger('held'); log.propagate = False\n"
        "log.addHandler(logging.StreamHandler(sys.stderr))\n"
        "os.close(2)"
    )
    assert r.return_code == 0
    r = await sb.py("log.warning('still here')\n_ = os.system('echo child-err >&2')")
    assert r.stderr == "still here\nchild-err\n"


async def test_the_runtime_image_has_the_data_stack(machine: None) -> None:
    # Importing the whole stack needs more than the suite's small memory limit.
    with data_dir() as d:
        rt = LocalSandboxes(settings(d, memory_limit_mb=1024))
        await rt.start()
        try:
            s = await rt.create("t")
            r = await rt.execute(
                s.id, "t",
                PythonCall(
                    "import numpy, pandas, scipy, sklearn, statsmodels, matplotlib, seaborn, PIL, openpyxl, pyarrow, sympy, plotly\n"
                    "print(sympy.integrate(sympy.Symbol('x'), sympy.Symbol('x')))"
                ),
                60,
            )  # fmt: skip
            assert (r.stdout, r.stderr, r.return_code) == ("x**2/2\n", "", 0)
        finally:
            await rt.close()
