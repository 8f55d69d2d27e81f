"""A session's state as one file, written and read only inside its own sandbox.

`save` pickles (cloudpickle) the Python namespace, modules by name, the bash shell's directory,
exports, functions and aliases, and the editor's undo history into a file of the workspace;
`restore` loads such a file into a fresh worker. What cannot be kept (an object that refuses to
pickle, a thread, a background process, a context) is named with its reason, never dropped
silently. The server only copies, authenticates and places the file: it never unpickles it.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import threading
import types
from typing import Any

VERSION = 1
# IPython's own names in a fresh namespace (its history, exit helpers): never the user's state.
SKIPPED = frozenset({"In", "Out", "exit", "quit", "get_ipython", "open"})


def _user_names(ns: dict[str, Any], hidden: dict[str, Any]) -> dict[str, Any]:
    found = {}
    for name, value in ns.items():
        if name in SKIPPED or name.startswith("_"):
            continue
        if name in hidden and hidden[name] is value:
            continue
        found[name] = value
    return found


def _why(e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text}"[:200] if text else type(e).__name__


def pickle_namespace(ns: dict[str, Any]) -> tuple[bytes, dict[str, str], dict[str, str]]:
    """(the pickled values, {name: module} imported by name, {name: why it was not kept})."""
    import cloudpickle

    modules: dict[str, str] = {}
    values: dict[str, Any] = {}
    lost: dict[str, str] = {}
    for name, value in ns.items():
        if isinstance(value, types.ModuleType):
            modules[name] = value.__name__
        else:
            values[name] = value
    try:  # one pickle: references shared between names stay shared
        return cloudpickle.dumps(values, protocol=5), modules, lost
    except Exception:  # noqa: S110 - named one by one below
        pass
    kept = {}
    for name, value in values.items():
        try:
            cloudpickle.dumps(value, protocol=5)
        except Exception as e:
            lost[name] = f"cannot be serialized ({_why(e)})"
        else:
            kept[name] = value
    return cloudpickle.dumps(kept, protocol=5), modules, lost


def _threads() -> dict[str, str]:
    main = threading.main_thread()
    return {
        f"thread {t.name}": "threads do not survive a pause"
        for t in threading.enumerate()
        if t is not main and not t.daemon
    }


def save(worker: Any, path: str) -> dict[str, str]:
    """Write the worker's state to `path` (a temporary name, then renamed); what was lost."""
    shell = worker.python.shell
    ns = _user_names(shell.user_ns, shell.user_ns_hidden)
    blob, modules, lost = pickle_namespace(ns)
    lost.update(_threads())
    for context in worker.contexts.runners:
        lost[f"context {context}"] = "Python contexts other than the main one are not kept"
    for proc in worker.services.processes.listing():
        lost[f"process {proc.get('pid')}"] = "background processes do not survive a pause"
    state = {
        "version": VERSION,
        "namespace": blob,
        "modules": modules,
        "shell": worker.shell.state(),
        "editor": dict(worker.editor.history),
        "lost": lost,
    }
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        pickle.dump(state, f, protocol=5)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)
    return lost


def restore(worker: Any, path: str) -> dict[str, str]:
    """Load a state `save` wrote (then remove the file); what was lost, then or now."""
    import cloudpickle

    with open(path, "rb") as f:
        state = pickle.load(f)  # noqa: S301 - written by this session's own worker
    with contextlib.suppress(OSError):
        os.unlink(path)
    lost: dict[str, str] = dict(state.get("lost") or {})
    shell = worker.python.shell
    try:
        values = cloudpickle.loads(state["namespace"])
    except Exception as e:
        values = {}
        lost["the namespace"] = f"could not be loaded ({_why(e)})"
    for name, module in (state.get("modules") or {}).items():
        try:
            values[name] = importlib.import_module(module)
        except Exception as e:
            lost[name] = f"module {module} could not be imported again ({_why(e)})"
    shell.user_ns.update(values)
    worker.editor.history.update(state.get("editor") or {})
    if state.get("shell"):
        worker.shell.restore(state["shell"])
    return lost
