"""A session's files: presigned transfers, the local upload/download endpoints, quotas, records."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import Request

from sandbank.config import MiB, Settings
from sandbank.errors import BadRequest, Forbidden, NotFound, PayloadTooLarge, QuotaExceeded
from sandbank.files import ObjectStore, PresignedPost, UploadReceiver, object_key, session_prefix
from sandbank.store import FileRecord, Store

SIGNED_FIELDS = ("key", "policy", "signature")
MAX_FIELD = 8192
MULTIPART_SLACK = 64 * 1024  # boundaries and fields beside the file, in a declared length


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

    def __init__(self, store: Store, objects: ObjectStore, settings: Settings) -> None:
        self.store = store
        self.objects = objects
        self.settings = settings
        # An upload can never exceed what a sandbox accepts: PutFile's cap and its disk.
        self.upload_cap = min(settings.put_file_max_bytes, settings.disk_limit_mb * MiB)
        # S3 calls nobody back after an upload: forms handed out are noted in the database
        # until they expire (so every replica sees them) and reconciled with the objects.

    @property
    def receiver(self) -> UploadReceiver | None:
        return self.objects if isinstance(self.objects, UploadReceiver) else None

    async def remaining_quota(self, user_id: str) -> int:
        used = await self.store.user_stored_bytes(user_id)
        return self.settings.max_stored_bytes_per_user - used

    async def upload_form(self, user_id: str, session_id: str, filename: str) -> PresignedPost:
        remaining = await self.remaining_quota(user_id)
        existing = await self.store.get_file(session_id, filename)
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
            await self.store.note_upload(session_id, filename, time.time() + expiry)
        return form

    async def reconcile(self, session_id: str) -> None:
        """Record uploads that went straight to the object store (S3)."""
        if self.receiver is not None:
            return
        now = time.time()
        for filename, expires in (await self.store.pending_uploads(session_id)).items():
            size = await self.objects.size(object_key(session_id, filename))
            if size is not None:
                await self.store.upsert_file(session_id, filename, size, "user")
            if expires < now:
                await self.store.drop_upload(session_id, filename)  # no upload can start now

    async def list(self, session_id: str) -> list[FileRecord]:
        await self.reconcile(session_id)
        return await self.store.list_files(session_id)

    async def download_url(self, session_id: str, filename: str) -> str:
        await self.reconcile(session_id)
        if await self.store.get_file(session_id, filename) is None:
            raise NotFound(f"no file {filename!r} in this session")
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

    async def receive(self, request: Request) -> None:
        """A presigned POST form: the signed fields, then the `file` part, stored whole or not."""
        receiver = self._local()
        ctype, params = parse_options_header(request.headers.get("content-type"))
        if ctype != b"multipart/form-data" or b"boundary" not in params:
            raise BadRequest("uploads are multipart/form-data: the form's fields, then `file`")
        form = _Form()
        parser = MultipartParser(params[b"boundary"], form.callbacks())
        stream = request.stream()
        try:
            async for chunk in stream:
                parser.write(chunk)
                if form.file_started:
                    break
            if not form.file_started:
                parser.finalize()
                raise BadRequest("the form has no `file` part")
            key, max_size = receiver.verify_upload(form.fields)
            declared = request.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > max_size + MULTIPART_SLACK:
                raise PayloadTooLarge(f"the file is larger than the form allows ({max_size} bytes)")
            session_id, filename = session_of_key(key)
            if await self.store.get_session(session_id) is None:
                raise NotFound("the session of this upload no longer exists")

            async def body() -> AsyncIterator[bytes]:
                while True:
                    while form.out:
                        yield form.out.pop(0)
                    if form.file_ended:
                        return
                    try:
                        chunk = await stream.__anext__()
                    except StopAsyncIteration:
                        parser.finalize()
                        if not form.file_ended:
                            raise BadRequest("the upload ended before its file did") from None
                        continue
                    parser.write(chunk)

            size = await receiver.receive_upload(key, body(), max_size)
        except ValueError as e:  # the multipart parser's complaints
            raise BadRequest(f"malformed multipart body: {e}") from None
        if await self.store.get_session(session_id) is None:
            await self.objects.delete(key)  # deleted while uploading
            raise NotFound("the session of this upload no longer exists")
        await self.store.upsert_file(session_id, filename, size, "user")

    async def download(self, query: Mapping[str, str]) -> Download:
        key, filename = self._local().verify_download(query)
        return Download(await self.objects.open(key), filename)


class _Form:
    """Collects text fields; the `file` part's bytes queue in `out` for the object store."""

    def __init__(self) -> None:
        self.fields: dict[str, str] = {}
        self.out: list[bytes] = []
        self.file_started = False
        self.file_ended = False
        self._headers: dict[str, bytes] = {}
        self._hname = b""
        self._hvalue = b""
        self._name = ""
        self._in_file = False
        self._value = bytearray()

    def callbacks(self) -> Any:
        return {
            "on_part_begin": self._part_begin,
            "on_header_field": self._header_field,
            "on_header_value": self._header_value,
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._part_data,
            "on_part_end": self._part_end,
        }

    def _part_begin(self) -> None:
        self._headers, self._value = {}, bytearray()

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._hname += data[start:end]

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        self._hvalue += data[start:end]

    def _header_end(self) -> None:
        self._headers[self._hname.decode("latin-1").lower()] = self._hvalue
        self._hname = self._hvalue = b""

    def _headers_finished(self) -> None:
        _, params = parse_options_header(self._headers.get("content-disposition"))
        self._name = params.get(b"name", b"").decode("utf-8", "replace")
        self._in_file = self._name == "file"
        if self._in_file:
            if self.file_started:
                raise BadRequest("only one `file` part is accepted")
            # As with S3, the signed fields come first, so nothing is stored before checking.
            self.file_started = True

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._in_file:
            self.out.append(data[start:end])
        else:
            self._value += data[start:end]
            if len(self._value) > MAX_FIELD:
                raise BadRequest(f"form field {self._name!r} is too long")

    def _part_end(self) -> None:
        if self._in_file:
            self.file_ended = True
            self._in_file = False
        elif self._name:
            self.fields[self._name] = self._value.decode("utf-8", "replace")
