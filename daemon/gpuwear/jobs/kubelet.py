"""Which pod each GPU is allocated to: the kubelet's pod-resources API, as dcgm-exporter asks it.

The kubelet serves ``v1.PodResourcesLister`` over gRPC on a unix socket
(``/var/lib/kubelet/pod-resources/kubelet.sock``); ``List`` names, for every pod of the node, the
devices each of its containers holds. gpuwear keeps the ``nvidia.com/gpu`` and ``nvidia.com/mig-*``
(and time-sliced ``nvidia.com/gpu.shared``) devices, by the UUID of the GPU they are on:

- ``GPU-<uuid>``: the GPU itself; ``GPU-<uuid>::<n>``: a time-slicing replica of it (the device
  plugin's shared GPUs);
- ``MIG-GPU-<uuid>/<gi>/<ci>`` (drivers before R470): a MIG instance, its GPU in its name;
  ``MIG-<uuid>``: a MIG instance whose GPU only NVML knows (``mig_parent``; left out without it);
- GKE's own ids (``nvidia0/gi0``, ``.../vgpu0``) name no UUID and are left out.

No generated protobuf code: the two messages are decoded here from the wire format (every length
checked, strings clipped like the cgroup names), and ``grpcio`` itself is imported only when a
socket exists (the ``kubernetes`` extra). The kubelet is asked at most every ``refresh_seconds``,
each time for at most ``timeout_seconds``; while it does not answer (down, socket gone, an error, a
broken answer) the allocations are None and pods keep their UID names. That is logged once, and
once again when it answers again.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuwear.jobs.resolve import MAX_FIELD, Allocation, clip

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD = "/v1.PodResourcesLister/List"
MAX_ANSWER_BYTES = 4 << 20  # gRPC's own default limit for a received message
MAX_DEVICE_IDS = 4096  # device ids kept from one answer (a node: 8 GPUs x 7 MIG instances, or replicas)
GPU_RESOURCES = frozenset({"nvidia.com/gpu", "nvidia.com/gpu.shared"})
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"

_GPU_UUID = re.compile(r"GPU-[0-9a-fA-F-]{8,64}")
_OLD_MIG = re.compile(r"MIG-(GPU-[0-9a-fA-F-]{8,64})/\d+/\d+")


class ProtoError(ValueError):
    """Bytes that are not the protobuf message expected."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise ProtoError("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift >= 64:
            raise ProtoError("varint longer than 10 bytes")


def _fields(buf: bytes) -> Iterator[tuple[int, bytes | None]]:
    """(field number, bytes) of each field of one message: the bytes of a length-delimited field, None for
    the others (varints and fixed-size numbers: nothing gpuwear reads)."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ProtoError("field number 0")
        if wire == 0:
            _, pos = _varint(buf, pos)
            yield number, None
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
            if pos > len(buf):
                raise ProtoError("truncated fixed-size field")
            yield number, None
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if pos + size > len(buf):
                raise ProtoError(f"field {number} runs {pos + size - len(buf)} bytes past the end")
            yield number, buf[pos:pos + size]
            pos += size
        else:
            raise ProtoError(f"unsupported wire type {wire} (field {number})")


def _strings(buf: bytes, want: dict[int, str]) -> tuple[dict[str, str], dict[int, list[bytes]]]:
    """A message's string fields named in ``want`` (number -> name; clipped, printable; the last one
    wins, as in protobuf) and its other length-delimited fields (number -> each occurrence)."""
    strings: dict[str, str] = {}
    nested: dict[int, list[bytes]] = {}
    for number, value in _fields(buf):
        if number in want:
            if value is None:
                raise ProtoError(f"field {number} ({want[number]}) is not a string")
            strings[want[number]] = clip(value.decode("utf-8", errors="replace"))
        elif value is not None:
            nested.setdefault(number, []).append(value)
    return strings, nested


def decode_list(answer: bytes) -> list[tuple[Allocation, str, list[str]]]:
    """A ``v1.ListPodResourcesResponse``: (allocation, resource name, device ids) for each device group of
    each container of each pod. Raises :class:`ProtoError` on bytes that are not one. Device ids longer
    than the clip limit are dropped (a GPU or MIG UUID is 40 characters), as are those past
    MAX_DEVICE_IDS."""
    out: list[tuple[Allocation, str, list[str]]] = []
    kept = 0
    _, top = _strings(answer, {})
    for pod_bytes in top.get(1, []):  # repeated PodResources pod_resources = 1
        pod, pod_nested = _strings(pod_bytes, {1: "name", 2: "namespace"})
        for container_bytes in pod_nested.get(3, []):  # repeated ContainerResources containers = 3
            container, container_nested = _strings(container_bytes, {1: "name"})
            allocation = Allocation(pod.get("namespace", ""), pod.get("name", ""), container.get("name", ""))
            for devices_bytes in container_nested.get(2, []):  # repeated ContainerDevices devices = 2
                devices, ids_bytes = _strings(devices_bytes, {1: "resource_name"})
                ids = []
                for raw in ids_bytes.get(2, []):  # repeated string device_ids = 2
                    text = raw.decode("utf-8", errors="replace")
                    if len(text) <= MAX_FIELD and text.isprintable() and kept < MAX_DEVICE_IDS:
                        ids.append(text)
                        kept += 1
                out.append((allocation, devices.get("resource_name", ""), ids))
    return out


def gpu_of(device_id: str, mig_parent: Callable[[str], str | None] | None = None) -> str | None:
    """The UUID of the GPU a device id of the NVIDIA device plugin is on, or None (see the module's doc)."""
    if m := _OLD_MIG.fullmatch(device_id):
        return m.group(1)
    if device_id.startswith("MIG-"):
        return mig_parent(device_id) if mig_parent is not None else None
    uuid = device_id.split("::", 1)[0]
    return uuid if _GPU_UUID.fullmatch(uuid) else None


def by_gpu(groups: list[tuple[Allocation, str, list[str]]],
           mig_parent: Callable[[str], str | None] | None = None) -> dict[str, frozenset[Allocation]]:
    """GPU UUID -> the containers its devices are allocated to, from :func:`decode_list`'s groups (GPU and
    MIG resources only, pods with a name and namespace only)."""
    out: dict[str, set[Allocation]] = {}
    for allocation, resource, ids in groups:
        if not (resource in GPU_RESOURCES or resource.startswith(MIG_RESOURCE_PREFIX)):
            continue
        if not (allocation.namespace and allocation.pod):
            continue
        for device_id in ids:
            uuid = gpu_of(device_id, mig_parent)
            if uuid is not None:
                out.setdefault(uuid, set()).add(replace(allocation, device=device_id))
    return {uuid: frozenset(allocations) for uuid, allocations in out.items()}


class PodResources:
    """The kubelet's GPU allocations, asked at most every ``refresh_seconds`` (monotonic seconds) for at
    most ``timeout_seconds`` over the socket ``path``; ``mig_parent`` maps a MIG UUID to its GPU's UUID.
    Imports ``grpc`` (ImportError without grpcio: see :func:`open_pod_resources`)."""

    def __init__(self, path: str, refresh_seconds: float = 10.0, timeout_seconds: float = 1.0,
                 mig_parent: Callable[[str], str | None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        import grpc

        self._grpc: Any = grpc
        self.path = path
        self.refresh_seconds = refresh_seconds
        self.timeout_seconds = timeout_seconds
        self._mig_parent = mig_parent
        self._clock = clock
        self._channel: Any = None
        self._list: Any = None
        self._asked: float | None = None  # monotonic time of the last question
        self._answer: dict[str, frozenset[Allocation]] | None = None
        self._failing: bool | None = None  # None: not asked yet
        self.questions = 0  # how many times the kubelet was asked

    def by_gpu(self) -> Mapping[str, frozenset[Allocation]] | None:
        """GPU UUID -> allocations, from the kubelet's last answer if it is recent, else asked now; None
        while the kubelet does not answer."""
        now = self._clock()
        if self._asked is None or now - self._asked >= self.refresh_seconds:
            self._asked = now
            self._answer = self._ask()
        return self._answer

    def _ask(self) -> dict[str, frozenset[Allocation]] | None:
        self.questions += 1
        grpc = self._grpc
        try:
            answered_before = self._list is not None
            try:
                reply = self._call()
            except grpc.RpcError as exc:
                # a channel that had answered: the kubelet may have restarted since, its connection gone ("Stream
                # removed"), a race with gRPC noticing it; one more try on a fresh channel
                if not answered_before or not hasattr(exc, "code") or exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                self.close()
                reply = self._call()
            answer = by_gpu(decode_list(reply), self._mig_parent)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            details = exc.details() if hasattr(exc, "details") else ""
            self._failed(f"{getattr(code, 'name', code)}: {details}")
            return None
        except ProtoError as exc:
            self._failed(f"an answer that is not a ListPodResourcesResponse: {exc}")
            return None
        except Exception as exc:  # nothing the kubelet (or grpc) does may stop the sampling
            self._failed(f"{type(exc).__name__}: {exc}")
            return None
        if self._failing is not False:
            log.info("kubelet pod-resources API at %s %s: %d GPU(s) allocated to pods", self.path,
                     "answers again" if self._failing else "answers", len(answer))
        self._failing = False
        return answer

    def _call(self) -> bytes:
        """The List call, on the channel kept from the last answer or on a new one."""
        if self._list is None:
            # a subchannel of its own: gRPC's global pool would hand the new channel the old one's subchannel, still
            # in its reconnect back-off after the kubelet went away, and the ask would fail at once (seen in CI)
            self._channel = self._grpc.insecure_channel(
                f"unix:{self.path}", options=[("grpc.max_receive_message_length", MAX_ANSWER_BYTES),
                                              ("grpc.enable_http_proxy", 0), ("grpc.use_local_subchannel_pool", 1)])
            self._list = self._channel.unary_unary(LIST_METHOD, request_serializer=lambda _: b"",
                                                   response_deserializer=bytes)
        return bytes(self._list(b"", timeout=self.timeout_seconds))

    def _failed(self, problem: str) -> None:
        """Drop the channel (a new one reconnects at once, where gRPC's would back off) and log the first
        failure of a run of them."""
        if self._channel is not None:
            self._channel.close()
        self._channel = self._list = None
        if self._failing is not True:
            log.warning("kubelet pod-resources API at %s does not answer (%s); pods are named by UID until it "
                        "does", self.path, clip(problem))
        self._failing = True

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._list = None


def open_pod_resources(path: str, refresh_seconds: float = 10.0,
                       mig_parent: Callable[[str], str | None] | None = None) -> PodResources | None:
    """A :class:`PodResources` when ``path`` is a socket this process may connect to and grpcio is installed;
    else None, with one log line saying why (nothing where there is no socket: not a Kubernetes node)."""
    if not path or not Path(path).exists():
        return None
    if not os.access(path, os.W_OK):
        log.warning("kubelet pod-resources socket %s is not writable by this user (uid %d; connecting needs "
                    "write permission, and the socket is root's): pods are named by UID only; see "
                    "docs/deployment.md", path, os.getuid())
        return None
    try:
        return PodResources(path, refresh_seconds, mig_parent=mig_parent)
    except ImportError:
        log.warning("kubelet pod-resources socket %s found, but grpcio is not installed (pip install "
                    "'gpuwear[kubernetes]'): pods are named by UID only", path)
        return None


class PodResourcesWatch:
    """:func:`open_pod_resources` again, while its socket is absent, at most every ``refresh_seconds`` (one stat):
    a daemon started before the kubelet (gpuwear.service ahead of kubelet.service at boot, or Kubernetes set up on
    the node later) names pods from the moment the socket appears, not from its next restart. A socket found but
    not usable (not writable, no grpcio) is said once and not tried again, as at start. ``clock``: monotonic
    seconds; ``mig_parent``: a MIG device's GPU (the daemon's, from NVML's MIG devices)."""

    def __init__(self, path: str, refresh_seconds: float = 10.0, clock: Callable[[], float] = time.monotonic,
                 mig_parent: Callable[[str], str | None] | None = None) -> None:
        self.path, self.refresh_seconds, self._clock = path, refresh_seconds, clock
        self._mig_parent = mig_parent
        self.pods: PodResources | None = None
        self._looked: float | None = None  # monotonic time of the last look for the socket
        self._found = not path  # the socket was found (or none is configured): no more looking

    def by_gpu(self) -> Mapping[str, frozenset[Allocation]] | None:
        """As :meth:`PodResources.by_gpu`; None while there is no socket."""
        if not self._found:
            now = self._clock()
            if self._looked is None or now - self._looked >= self.refresh_seconds:
                if Path(self.path).exists():
                    self._found = True
                    if self._looked is not None:
                        log.info("kubelet pod-resources socket %s appeared", self.path)
                    self.pods = open_pod_resources(self.path, self.refresh_seconds, self._mig_parent)
                self._looked = now
        return None if self.pods is None else self.pods.by_gpu()

    def close(self) -> None:
        if self.pods is not None:
            self.pods.close()
