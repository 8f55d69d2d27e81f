"""What one sandbox may use: memory, processes, CPU, disk, open files, output and grace time."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import MiB, Settings


@dataclass(frozen=True)
class Limits:
    memory_bytes: int
    pids: int
    cpus: float
    disk_bytes: int
    disk_reserve_bytes: int  # left free on the data directory's file system
    tmp_bytes: int
    open_files: int
    output_bytes: int
    grace: float


def limits_from(settings: Settings) -> Limits:
    return Limits(
        memory_bytes=settings.memory_limit_mb * MiB,
        pids=settings.pids_limit,
        cpus=settings.cpu_limit,
        disk_bytes=settings.disk_limit_mb * MiB,
        disk_reserve_bytes=settings.disk_reserve_mb * MiB,
        tmp_bytes=settings.tmp_limit_mb * MiB,
        open_files=settings.open_files_limit,
        output_bytes=settings.output_limit_bytes,
        grace=settings.interrupt_grace_seconds,
    )
