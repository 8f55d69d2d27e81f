"""A session's files: presigned transfers, the local upload/download endpoints, quotas, records.

The storage quota is a reservation taken before any byte is written (`Reservation`): counted
with the user's files and every other file on its way in, in one transaction of the store,
grown as the bytes arrive, committed as the file's record or released. Concurrent uploads
(and files a run saves meanwhile) can never store more than the quota together.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Literal

import anyio

from sandbank.config import MiB, Settings
from sandbank.errors import BadRequest, Forbidden, NotFound, PayloadTooLarge, QuotaExceeded
from sandbank.files import ObjectStore, PresignedPost, UploadReceiver, object_key, session_prefix
from sandbank.http.multipart import read_field
from sandbank.store import FileRecord, Origin, Store

SIGNED_FIELDS = ("key", "policy", "signature")
MAX_FIELD = 8192
MULTIPART_SLACK = 64 * 1024  # boundaries and fields beside the file, in a declared length
RESERVE_STEP = 1 * MiB  # a reservation grows by at least this much at a time
RESERVATION_SECONDS = 600.0  # a reservation its server stopped renewing stops counting then
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


@dataclass(frozen=True)
class UploadGrant:
    """What a presigned upload URL allows: one file of a session, up to `max_size` bytes."""

    key: str
    max_size: int
    fields: Mapping[str, str]

    @property
    def session_id(self) -> str:
        return session_of_key(self.key)[0]

    @property
    def filename(self) -> str:
        return session_of_key(self.key)[1]


class Reservation:
    """Storage reserved for one file on its way in; `ensure` grows it as bytes arrive."""

    def __init__(self, files: SessionFiles, session_id: str, filename: str, cap: int) -> None:
        self.files = files
        self.id = "r" + secrets.token_hex(12)
        self.session_id = session_id
        self.filename = filename
        self.cap = cap  # the file can never be larger: the reservation never grows past it
        self.size = 0
        self.done = False

    async def ensure(self, total: int) -> None:
        """Room for `total` bytes, or `QuotaExceeded` (the reservation stays as it was)."""
        if total <= self.size:
            return
        want = max(total, min(self.size + RESERVE_STEP, self.cap))
        quota = self.files.settings.max_stored_bytes_per_user
        expires = time.time() + RESERVATION_SECONDS
        records = self.files.store.file_records
        if not await records.reserve(self.id, self.session_id, self.filename, want, quota, expires):
            raise QuotaExceeded(
                f"your files would pass the {quota} bytes you may store; delete sessions to "
                "make room"
            )
        self.size = want

    async def metered(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """The chunks, each one reserved before it is handed on."""
        total = 0
        async for chunk in chunks:
            total += len(chunk)
            await self.ensure(total)
            yield chunk

    async def commit(self, size: int, origin: Origin) -> FileRecord:
        record = await self.files.store.file_records.commit(
            self.id, self.session_id, self.filename, size, origin
        )
        self.done = True
        if self.files.on_file is not None:
            self.files.on_file("upload" if origin == "user" else "produced", size)
        return record

    async def release(self) -> None:
        if not self.done:
            self.done = True
            with anyio.CancelScope(shield=True):
                await self.files.store.file_records.release(self.id)


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

    @contextlib.asynccontextmanager
    async def reserving(
        self, session_id: str, filename: str, first: int, cap: int
    ) -> AsyncIterator[Reservation]:
        """A reservation of `first` bytes (growing up to `cap`), released unless committed."""
        reservation = Reservation(self, session_id, filename, cap)
        try:
            await reservation.ensure(min(first, cap))
            yield reservation
        finally:
            await reservation.release()

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
        max_size = min(self.upload_cap, remaining)
        if self.receiver is None:
            # The object store takes the bytes straight from the client: the form's whole
            # size is reserved until the object is seen or the form expires.
            quota = self.settings.max_stored_bytes_per_user
            reserved = await self.store.file_records.reserve(
                _form_reservation(session_id, filename), session_id, filename, max_size,
                quota, time.time() + expiry + RESERVATION_SECONDS,
            )  # fmt: skip
            if not reserved:
                raise QuotaExceeded(
                    f"your files and uploads under way use the {quota} bytes you may store; "
                    "wait for them or delete sessions to make room"
                )
        form = await self.objects.presign_post(object_key(session_id, filename), max_size, expiry)
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
            reservation = _form_reservation(session_id, filename)
            if size is not None:
                await records.commit(reservation, session_id, filename, size, "user")
                if self.on_file is not None:
                    self.on_file("upload", size)
            if expires < now:
                await records.drop_upload(session_id, filename)  # no upload can start now
                await records.release(reservation)

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

    async def delete(self, session_id: str, filename: str) -> None:
        """Forget one file: its record, then its object (`NotFound` when it has neither)."""
        await self.reconcile(session_id)
        recorded = await self.store.file_records.delete(session_id, filename)
        if not recorded:
            raise NotFound(f"no file {filename!r} in this session")
        await self.objects.delete(object_key(session_id, filename))

    async def forget(self, session_id: str) -> None:
        await self.objects.delete_prefix(session_prefix(session_id))

    # --- this server's own upload and download endpoints (local object store) -----------------
    def _local(self) -> UploadReceiver:
        receiver = self.receiver
        if receiver is None:
            raise NotFound("uploads go to the object store directly here")
        return receiver

    def authorize_upload(self, query: Mapping[str, str]) -> UploadGrant:
        """What the upload URL's signature allows, checked before any byte of the body."""
        receiver = self._local()
        if not all(query.get(name) for name in SIGNED_FIELDS):
            raise Forbidden(
                "this upload URL is not signed: post to the `url` of a form from "
                "GET /api/sessions/{session_id}/files/upload"
            )
        key, max_size = receiver.verify_upload(query)
        session_of_key(key)
        return UploadGrant(key, max_size, {name: query[name] for name in SIGNED_FIELDS})

    def upload_body_cap(self, grant: UploadGrant) -> int:
        return grant.max_size + MULTIPART_SLACK

    async def receive(self, grant: UploadGrant, parts: FormParts, declared: int | None) -> None:
        """The form's fields (the signed ones must be the URL's), then the `file` part,
        stored whole within the storage quota, or not at all."""
        receiver = self._local()
        if declared is not None and declared > self.upload_body_cap(grant):
            raise PayloadTooLarge(
                f"the file is larger than the form allows ({grant.max_size} bytes)"
            )
        session_id, filename = grant.session_id, grant.filename
        async for name, _filename, chunks in parts:
            if name != "file":
                value = await read_field(name, chunks, MAX_FIELD)
                if name in SIGNED_FIELDS and value != grant.fields[name]:
                    raise Forbidden("the form's signed fields are not those of its URL")
                continue
            if await self.store.chats.get(session_id) is None:
                raise NotFound("the session of this upload no longer exists")
            first = min(declared or 0, grant.max_size)
            async with self.reserving(session_id, filename, first, grant.max_size) as reserved:
                size = await receiver.receive_upload(
                    grant.key, reserved.metered(chunks), grant.max_size
                )
                if await self.store.chats.get(session_id) is None:
                    await self.objects.delete(grant.key)  # deleted while uploading
                    raise NotFound("the session of this upload no longer exists")
                await reserved.commit(size, "user")
            return
        raise BadRequest("the form has no `file` part")

    async def download(self, query: Mapping[str, str]) -> Download:
        key, filename = self._local().verify_download(query)
        return Download(await self.objects.open(key), filename)


def _form_reservation(session_id: str, filename: str) -> str:
    """The id of what an S3 upload form reserves (one per file a form is out for)."""
    return "form/" + hashlib.sha256(f"{session_id}/{filename}".encode()).hexdigest()[:40]
