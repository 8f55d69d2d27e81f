"""A session's files: presigned transfers, the local upload/download endpoints, quotas, records."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from sandbank.config import MiB, Settings
from sandbank.errors import BadRequest, Forbidden, NotFound, PayloadTooLarge, QuotaExceeded
from sandbank.files import ObjectStore, PresignedPost, UploadReceiver, object_key, session_prefix
from sandbank.http.multipart import read_field
from sandbank.store import FileRecord, Origin, Store

SIGNED_FIELDS = ("key", "policy", "signature")
MAX_FIELD = 8192
MULTIPART_SLACK = 64 * 1024  # boundaries and fields beside the file, in a declared length
# What a metric counts: an upload recorded, a file a run produced, a download URL handed out.
FileOp = Literal["upload", "produced", "download"]
FormParts = AsyncIterator[tuple[str, str | None, AsyncIterator[bytes]]]


def session_of_key(key: str) -> tuple[str, str]:
    """(session id, filename) of an object key made by `object_key`."""
    prefix, _, rest = key.partition("/")
    sid, _, filename = rest.partition("/")
    if prefix != "sessions" or not sid or not filename:
        raise Forbidden("the upload key is not a session's file")
    return sid, filename


@dataclass
class Download:
    chunks: AsyncIterator[bytes]
    filename: str


class SessionFiles:
    """Uploads (origin `user`) and files produced by runs (origin `assistant`) of sessions."""

    def __init__(
        self,
        store: Store,
        objects: ObjectStore,
        settings: Settings,
        on_file: Callable[[FileOp, int], None] | None = None,
    ) -> None:
        self.store = store
        self.objects = objects
        self.settings = settings
        self.on_file = on_file  # (operation, bytes) of each file stored or handed out: metrics
        # An upload can never exceed what a sandbox accepts: PutFile's cap and its disk.
        self.upload_cap = min(settings.put_file_max_bytes, settings.disk_limit_mb * MiB)
        # S3 calls nobody back after an upload: forms handed out are noted in the database
        # until they expire (so every replica sees them) and reconciled with the objects.

    @property
    def receiver(self) -> UploadReceiver | None:
        return self.objects if isinstance(self.objects, UploadReceiver) else None

    async def remaining_quota(self, user_id: str) -> int:
        used = await self.store.file_records.stored_bytes(user_id)
        return self.settings.max_stored_bytes_per_user - used

    async def upload_form(self, user_id: str, session_id: str, filename: str) -> PresignedPost:
        remaining = await self.remaining_quota(user_id)
        existing = await self.store.file_records.get(session_id, filename)
        if existing is not None:
            remaining += existing.size  # it will be replaced
        if remaining <= 0:
            raise QuotaExceeded(
                f"your files use all of the {self.settings.max_stored_bytes_per_user} bytes "
                "you may store; delete sessions to make room"
            )
        expiry = self.settings.presigned_url_expiry_seconds
        form = await self.objects.presign_post(
            object_key(session_id, filename), min(self.upload_cap, remaining), expiry
        )
        if self.receiver is None:
            await self.store.file_records.note_upload(session_id, filename, time.time() + expiry)
        return form

    async def reconcile(self, session_id: str) -> None:
        """Record uploads that went straight to the object store (S3)."""
        if self.receiver is not None:
            return
        now = time.time()
        records = self.store.file_records
        for filename, expires in (await records.pending_uploads(session_id)).items():
            size = await self.objects.size(object_key(session_id, filename))
            if size is not None:
                await self.record(session_id, filename, size, "user")
            if expires < now:
                await records.drop_upload(session_id, filename)  # no upload can start now

    async def record(self, session_id: str, filename: str, size: int, origin: Origin) -> FileRecord:
        """Record a file stored in the object store: an upload, or a file a run produced."""
        record = await self.store.file_records.upsert(session_id, filename, size, origin)
        if self.on_file is not None:
            self.on_file("upload" if origin == "user" else "produced", size)
        return record

    async def list(self, session_id: str) -> list[FileRecord]:
        await self.reconcile(session_id)
        return await self.store.file_records.of_session(session_id)

    async def download_url(self, session_id: str, filename: str) -> str:
        await self.reconcile(session_id)
        record = await self.store.file_records.get(session_id, filename)
        if record is None:
            raise NotFound(f"no file {filename!r} in this session")
        if self.on_file is not None:
            self.on_file("download", record.size)
        shown = filename.rsplit("/", 1)[-1]
        return await self.objects.presign_get(
            object_key(session_id, filename), shown, self.settings.presigned_url_expiry_seconds
        )

    async def forget(self, session_id: str) -> None:
        await self.objects.delete_prefix(session_prefix(session_id))

    # --- this server's own upload and download endpoints (local object store) -----------------
    def _local(self) -> UploadReceiver:
        receiver = self.receiver
        if receiver is None:
            raise NotFound("uploads go to the object store directly here")
        return receiver

    async def receive(self, parts: FormParts, declared: int | None) -> None:
        """A presigned POST form: the signed fields, then the `file` part, stored whole or not."""
        receiver = self._local()
        fields: dict[str, str] = {}
        async for name, _filename, chunks in parts:
            if name != "file":
                fields[name] = await read_field(name, chunks, MAX_FIELD)
                continue
            # As with S3, the signed fields come first, so nothing is stored before checking.
            key, max_size = receiver.verify_upload(fields)
            if declared is not None and declared > max_size + MULTIPART_SLACK:
                raise PayloadTooLarge(f"the file is larger than the form allows ({max_size} bytes)")
            session_id, filename = session_of_key(key)
            if await self.store.chats.get(session_id) is None:
                raise NotFound("the session of this upload no longer exists")
            size = await receiver.receive_upload(key, chunks, max_size)
            if await self.store.chats.get(session_id) is None:
                await self.objects.delete(key)  # deleted while uploading
                raise NotFound("the session of this upload no longer exists")
            await self.record(session_id, filename, size, "user")
            return
        raise BadRequest("the form has no `file` part")

    async def download(self, query: Mapping[str, str]) -> Download:
        key, filename = self._local().verify_download(query)
        return Download(await self.objects.open(key), filename)
