"""`sandbank doctor`: checks of this machine and these settings, each with ok/FAIL and the fix.

It creates nothing: no data directory, database, objects directory or signing key that was
not there (what it writes to try them, in a scratch directory or as a test object, it removes).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import io
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from .config import Settings
from .errors import SandbankError

# Without the image's list of its packages (a runtime built before there was one): the data stack.
DATA_STACK = (
    "numpy, pandas, scipy, sklearn, statsmodels, matplotlib, seaborn, PIL, openpyxl, pyarrow"
)
SANDBOX_TIMEOUT_S = 300  # every module of the image, in groups: ~20 s on an idle machine


@dataclass
class Outcome:
    name: str
    status: str  # "ok", "FAIL", "warn" or "skip"
    detail: str
    fix: str = ""


class Failed(Exception):
    """A check's failure: what is wrong and how to fix it."""

    def __init__(self, detail: str, fix: str = "") -> None:
        super().__init__(detail)
        self.detail = detail
        self.fix = fix


class Warned(Failed):
    """Worth knowing, not a failure."""


class Skipped(Failed):
    """A check that does not apply here (and says why)."""

    pass


# A check returns what it saw, or raises `Failed`; blocking checks are plain functions.
Check = Callable[[Settings], str | Awaitable[str]]


def check_root(settings: Settings) -> str:
    if os.geteuid() == 0:
        return "running as root"
    if settings.isolation == "none":
        raise Warned("not root; fine with SANDBANK_ISOLATION=none (unisolated)")
    raise Failed(
        f"running as uid {os.geteuid()}: the isolated runtime creates cgroups and loop mounts",
        "run sandbank as root",
    )


def check_isolation_tools(settings: Settings) -> str:
    from .sandbox.host.layout import HOST_PATH

    if settings.isolation == "none":
        raise Skipped("SANDBANK_ISOLATION=none: no isolation is used")
    every = {
        "bwrap": (("bwrap", "bubblewrap"), ("setpriv", "util-linux")),
        "fork": (("unshare", "util-linux"), ("mount", "mount")),
        "gvisor": (("runsc", "runsc"),),
    }
    offered = settings.isolations()
    tools = [tool for isolation in offered for tool in every[isolation]]
    missing = [package for tool, package in tools if shutil.which(tool, path=HOST_PATH) is None]
    if missing:
        raise Failed(f"missing: {', '.join(missing)}", f"apt-get install {' '.join(missing)}")
    found = f"{', '.join(offered)}: " + ", ".join(
        str(shutil.which(tool, path=HOST_PATH)) for tool, _ in tools
    )
    if "gvisor" in offered:
        return f"{found}; {gvisor_platform(settings)}"
    return found


def gvisor_platform(settings: Settings) -> str:
    """Which runsc platform the server would use here, and what it costs."""
    from .sandbox.backends.gvisor import probe_platform

    platform = settings.gvisor_platform
    chosen = probe_platform() if platform == "auto" else platform
    how = (
        "probed: systrap and kvm tried first" if platform == "auto" else "SANDBANK_GVISOR_PLATFORM"
    )
    cost = {
        "systrap": "system calls trap into the Sentry by seccomp signals (the fast platform)",
        "kvm": "system calls trap into the Sentry through KVM (the cheaper platform)",
        "ptrace": "every system call is a ptrace stop (~2-3x slower system calls, README)",
    }[chosen]
    return f"runsc platform {chosen} ({how}): {cost}"


def check_cgroups(settings: Settings) -> str:
    from .sandbox.host.cgroups import FAVOR_DYNMODS, ROOT, V1_CONTROLLERS, cgroup2_mount

    if settings.isolation == "none":
        raise Skipped("SANDBANK_ISOLATION=none: no limits are applied")
    missing = [c for c in V1_CONTROLLERS if not (ROOT / c / "cgroup.procs").exists()]
    if missing:
        raise Failed(
            f"cgroup v1 controllers not mounted under {ROOT}: {', '.join(missing)}",
            f"mount them, e.g. `mount -t cgroup -o {missing[0]} cgroup {ROOT}/{missing[0]}`",
        )
    found = cgroup2_mount(Path("/proc/self/mountinfo").read_text(), ROOT)
    if found is not None and FAVOR_DYNMODS not in found[1].split(","):
        fix = (
            "unset SANDBANK_CGROUP_FAVOR_DYNMODS so the server remounts it at start, or "
            f"`mount -o remount,{FAVOR_DYNMODS} {found[0]}`"
        )
        if not settings.cgroup_favor_dynmods:
            raise Warned(
                f"{found[0]} lacks {FAVOR_DYNMODS}: each sandbox start waits ~10 ms to join "
                "its cgroup",
                fix,
            )
        return f"{', '.join(V1_CONTROLLERS)} under {ROOT}; {FAVOR_DYNMODS} set at server start"
    dynmods = f"; {found[0]} has {FAVOR_DYNMODS}" if found is not None else ""
    return f"{', '.join(V1_CONTROLLERS)} under {ROOT}{dynmods}"


def check_loop_devices(settings: Settings) -> str:
    if settings.isolation == "none":
        raise Skipped("SANDBANK_ISOLATION=none: workspaces are plain directories")
    tools = [t for t in ("mkfs.ext4", "mount", "umount") if shutil.which(t) is None]
    if tools:
        raise Failed(f"missing: {', '.join(tools)}", "apt-get install e2fsprogs mount")
    if not Path("/dev/loop-control").exists():
        raise Failed(
            "/dev/loop-control is missing: workspaces are loop-mounted disk images",
            "`modprobe loop` (in a container: give it access to loop devices)",
        )
    return "/dev/loop-control, mkfs.ext4 and mount present"


def modules_to_import(settings: Settings) -> list[str]:
    """Every module of the runtime image, from its own list (scripts/seal-runtime wrote it)."""
    from .sandbox.host import manifest

    found = manifest.modules(manifest.load(settings.runtime_dir))
    return found or [m.strip() for m in DATA_STACK.split(",")]


async def check_runtime(settings: Settings) -> str:
    """Start a real sandbox (in a data directory of its own) and import every package there."""
    from .protocol.calls import PythonCall
    from .sandbox.host import manifest
    from .sandbox.local import LocalSandboxes

    python = settings.runtime_dir / "bin" / "python3"
    if not await asyncio.to_thread(python.exists):
        raise Failed(
            f"no runtime image at {settings.runtime_dir}",
            "run `make install`, or set SANDBANK_RUNTIME_DIR",
        )
    # A directory of its own: a running server's sandboxes are never touched.
    scratch = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="sandbank-doctor-"))
    await asyncio.to_thread(os.chmod, scratch, 0o711)
    own = settings.model_copy(update={"data_dir": scratch, "pool_size": 0, "pool_size_max": 0})
    runtime = LocalSandboxes(own)
    try:
        await runtime.start()
        session = await runtime.create("doctor")
        names = await asyncio.to_thread(modules_to_import, settings)
        code = manifest.import_check_code(names)
        result = await runtime.execute(session.id, "doctor", PythonCall(code), SANDBOX_TIMEOUT_S)
    except SandbankError as error:
        raise Failed(f"a sandbox cannot start: {error.message}") from None
    finally:
        with contextlib.suppress(SandbankError, OSError):
            await runtime.close()
        await asyncio.to_thread(shutil.rmtree, scratch, ignore_errors=True)
    failed = [
        line[len("FAILED ") :] for line in result.stdout.splitlines() if line.startswith("FAILED ")
    ]
    if result.return_code != 0 or failed or f"imported {len(names)} of" not in result.stdout:
        last = (failed or result.stderr.strip().splitlines() or ["(no output)"])[-1]
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        raise Failed(
            f"the runtime's packages do not all import in a sandbox (return code "
            f"{result.return_code}): {last}{more}",
            "rebuild the runtime image: `make clean install`",
        )
    imported = f"a sandbox imports all {len(names)} modules of the image ({result.duration_ms} ms)"
    if settings.isolation == "fork":
        from .sandbox.backends.fork import INIT_PROGRAM

        if not await asyncio.to_thread((settings.runtime_dir / INIT_PROGRAM).exists):
            raise Warned(
                f"{imported}, but the runtime has no {INIT_PROGRAM}: each sandbox's init "
                "runs in Python and holds ~2 MiB more",
                "`make install` compiles it (it needs gcc and libc6-dev)",
            )
    return imported


def check_data_dir(settings: Settings) -> str:
    from .errors import ConfigError
    from .startup import check_data_dir as check

    path = Path(os.path.abspath(settings.data_dir))
    try:
        check(settings, create=False)  # what would stop it, without making it
    except ConfigError as error:
        raise Failed(error.message) from None
    reach = "reachable by sandboxes" if settings.isolation != "none" else "usable"
    if path.is_dir():
        try:
            with tempfile.TemporaryFile(dir=path):
                pass
        except OSError as error:
            raise Failed(
                f"{path} is not writable ({error.strerror})", "fix its owner or permissions"
            ) from None
        return f"{path} is writable and {reach}"
    parent = next(p for p in path.parents if p.exists())
    if not os.access(parent, os.W_OK | os.X_OK):
        raise Failed(
            f"{path} does not exist and {parent} is not writable, so it cannot be created",
            f"create it (`mkdir -p {path}`) or choose another SANDBANK_DATA_DIR",
        )
    return f"{path} does not exist yet; `sandbank serve` creates it ({parent} is writable)"


@contextlib.contextmanager
def _opening(kind: str, setting: str) -> Iterator[None]:
    """Opening what `setting` names: its refusal, or the data dir's, is the check's failure."""
    try:
        yield
    except SandbankError as error:
        raise Failed(f"{kind}: {error.message}", f"fix {setting}") from None
    except OSError as error:
        raise Failed(f"{kind}: {error}", f"fix {setting} or the data dir") from None


def check_database(settings: Settings) -> str:
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory
    from sqlalchemy.exc import SQLAlchemyError

    from .startup import database_kind
    from .store import database_url
    from .store.engine import MIGRATIONS, create_engines

    url = database_url(settings)
    kind = database_kind(settings)
    if url == "memory://":
        raise Warned("in memory: nothing survives a restart")
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        return f"{kind}: no database yet; `sandbank serve` creates it"
    head = ScriptDirectory(str(MIGRATIONS)).get_current_head()
    with _opening(kind, "SANDBANK_DATABASE_URL"):
        engines = create_engines(url)
    try:
        with engines.reader.connect() as conn:
            current = MigrationContext.configure(conn).get_current_revision()
    except SQLAlchemyError as error:
        raise Failed(
            f"{kind}: cannot connect ({type(error).__name__})",
            "check SANDBANK_DATABASE_URL and that the database server runs",
        ) from None
    finally:
        engines.dispose()
    if current == head:
        return f"{kind}: migrations current ({head})"
    if current is None:
        return f"{kind}: empty; `sandbank serve` creates the schema"
    known = {s.revision for s in ScriptDirectory(str(MIGRATIONS)).walk_revisions()}
    if current not in known:
        raise Failed(
            f"{kind}: at revision {current}, unknown to this version (newer?)",
            "upgrade sandbank to the version that migrated it",
        )
    raise Warned(f"{kind}: at {current}; `sandbank serve` migrates it to {head}")


async def check_storage(settings: Settings) -> str:
    from .files import ObjectStore, open_object_store
    from .startup import storage_kind

    kind = storage_kind(settings)
    key = f"doctor/{os.getpid()}-{time.time_ns()}"
    payload = b"sandbank doctor\n"
    local = not settings.storage_url.strip()
    root = settings.data_dir / "objects"
    if local and not root.is_dir():
        return f"{kind}: not there yet; `sandbank serve` creates it"
    objects: ObjectStore
    with _opening(kind, "SANDBANK_STORAGE_URL"):
        if local:
            from .files.local import LocalObjectStore
            from .files.signing import UrlSigner

            # Signed by a throwaway key: the data dir's own is never made here.
            objects = LocalObjectStore(root, UrlSigner(os.urandom(32), "http://doctor"))
        else:
            objects = open_object_store(settings)
    try:
        await objects.put(key, io.BytesIO(payload), len(payload))
        back = b"".join([chunk async for chunk in await objects.open(key)])
        await objects.delete(key)
    except (SandbankError, OSError) as error:
        raise Failed(
            f"{kind}: a round trip failed: {error}",
            "check SANDBANK_STORAGE_URL, the S3 settings and the bucket's permissions",
        ) from None
    except Exception as error:  # noqa: BLE001 - any SDK's failure is the check's answer
        raise Failed(
            f"{kind}: a round trip failed: {type(error).__name__}: {error}",
            "check SANDBANK_STORAGE_URL, the S3 settings and the bucket's permissions",
        ) from None
    finally:
        await objects.close()
        if local:
            with contextlib.suppress(OSError):
                (root / "doctor").rmdir()  # the test object's folder, when no other is in it
    if back != payload:
        raise Failed(f"{kind}: read back other bytes than were written")
    return f"{kind}: write, read and delete work"


def model_check(ask: bool) -> Check:
    async def check_model(settings: Settings) -> str:
        from .agent.model import UserMessage
        from .errors import ConfigError
        from .startup import check_model as check_spec

        if not settings.llm_model:
            raise Warned("no SANDBANK_LLM_MODEL: the agent is off, questions are refused")
        try:
            check_spec(settings)
        except ConfigError as error:
            raise Failed(error.message) from None
        where = settings.llm_base_url or "the provider's endpoint"
        if not ask:
            raise Skipped(f"{settings.llm_model} at {where} (`--model` sends a one-token request)")
        from .agent.anyllm import AnyLLMModel

        one = settings.model_copy(update={"llm_max_output_tokens": 1, "llm_max_retries": 0})
        try:
            model = AnyLLMModel(one)
        except SandbankError as error:
            raise Failed(error.message) from None
        started = time.monotonic()
        try:
            await model.complete([UserMessage(content="Say OK.")], [])
        except SandbankError as error:
            raise Failed(
                error.message, "check SANDBANK_LLM_BASE_URL, the API key and the model name"
            ) from None
        finally:
            await model.aclose()
        return f"{settings.llm_model} at {where} answered in {time.monotonic() - started:.1f} s"

    return check_model


def check_listening(settings: Settings) -> str:
    from .http.auth import load_tokens
    from .startup import check_exposure

    try:
        tokens = load_tokens(settings)
    except OSError as error:
        raise Failed(
            f"SANDBANK_EXEC_TOKENS_FILE cannot be read: {error.strerror}",
            "point it at a readable file of tokens, one per line",
        ) from None
    try:
        open_doors = check_exposure(settings, [] if settings.role == "node" else tokens)
    except SandbankError as error:
        raise Failed(error.message) from None
    listeners = [(settings.host, settings.port)]
    if settings.exec_api == "separate":
        listeners.append((settings.exec_api_host, settings.exec_api_port))
    busy = [f"{h}:{p}" for h, p in listeners if not _can_bind(h, p)]
    auth = f"{len(tokens)} exec token(s)" if tokens else "no exec tokens (loopback only)"
    if busy:
        raise Warned(f"{', '.join(busy)} in use (a server running already?); {auth}")
    if open_doors:
        raise Warned("; ".join(open_doors))
    return f"{', '.join(f'{h}:{p}' for h, p in listeners)} free; {auth}"


def _can_bind(host: str, port: int) -> bool:
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    except OSError:
        return False
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError:
            return False
    return True


def checks(model: bool) -> list[tuple[str, Check]]:
    return [
        ("root", check_root),
        ("isolation tools", check_isolation_tools),
        ("cgroups", check_cgroups),
        ("loop devices", check_loop_devices),
        ("data dir", check_data_dir),
        ("runtime image", check_runtime),
        ("database", check_database),
        ("storage", check_storage),
        ("model", model_check(model)),
        ("listening", check_listening),
    ]


async def _run(settings: Settings, model: bool, out: TextIO) -> list[Outcome]:
    outcomes = []
    for name, check in checks(model):
        try:
            seen = check(settings)
            outcome = Outcome(name, "ok", await seen if inspect.isawaitable(seen) else seen)
        except Skipped as s:
            outcome = Outcome(name, "skip", s.detail, s.fix)
        except Warned as w:
            outcome = Outcome(name, "warn", w.detail, w.fix)
        except Failed as f:
            outcome = Outcome(name, "FAIL", f.detail, f.fix)
        except SandbankError as e:
            outcome = Outcome(name, "FAIL", e.message)
        except Exception as e:  # noqa: BLE001 - one broken check must not hide the others
            outcome = Outcome(name, "FAIL", f"{type(e).__name__}: {e}")
        outcomes.append(outcome)
        print(f"{outcome.status:<4}  {name:<13}  {outcome.detail}", file=out, flush=True)
        if outcome.fix:
            print(f"{'':<4}  {'':<13}  fix: {outcome.fix}", file=out, flush=True)
    return outcomes


def run_checks(settings: Settings, model: bool, out: TextIO) -> int:
    """Run every check, print one line each (and the fix); 1 when any failed."""
    outcomes = asyncio.run(_run(settings, model, out))
    failed = [o.name for o in outcomes if o.status == "FAIL"]
    if failed:
        print(f"{len(failed)} check(s) failed: {', '.join(failed)}", file=out)
        return 1
    print("all checks passed", file=out)
    return 0
