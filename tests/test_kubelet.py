"""Pod names from the kubelet's pod-resources API, against a fake kubelet speaking the real API.

The fake is a real gRPC server on a unix socket, serving ``v1.PodResourcesLister`` from the
kubelet's own api.proto (tests/fixtures/podresources, compiled here by grpcio-tools): its answers
are the real protobuf encoding, independent of gpuwear's hand-written decoder.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest
from grpc_tools import protoc
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_rig
from gpuwear.collector import encode
from gpuwear.config import WearConfig
from gpuwear.jobs.kubelet import (
    PodResources,
    PodResourcesWatch,
    ProtoError,
    by_gpu,
    decode_list,
    gpu_of,
    open_pod_resources,
)
from gpuwear.jobs.resolve import Allocation, Job, JobWatcher, ProcessResolver, Unseen
from gpuwear.metrics import DaemonInfo, Published
from gpuwear.tracker import WearTracker
from helpers import examples

PROTO = Path(__file__).parent / "fixtures" / "podresources" / "api.proto"
LOGGER = "gpuwear.jobs.kubelet"

GPU_A = "GPU-6f1c2b2e-3d4a-4b5c-9d8e-0f1a2b3c4d5e"
GPU_B = "GPU-11111111-2222-3333-4444-555555555555"
GPU_C = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
GPU_D = "GPU-99999999-8888-7777-6666-555555555555"
MIG = "MIG-0b2b7a1e-5d5c-5f6a-9d1e-3c4b5a697887"  # R470+: the GPU is not in the name
POD_UID = "6f1c2b2e-3d4a-4b5c-9d8e-0f1a2b3c4d5e"
OTHER_UID = "0a0a0a0a-1b1b-2c2c-3d3d-4e4e4e4e4e4e"


def pod_cgroup(uid: str) -> str:
    """/proc/PID/cgroup of a process in a pod (cgroup v2, systemd driver)."""
    return (f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid.replace('-', '_')}.slice/"
            f"cri-containerd-{'ab' * 32}.scope\n")


@pytest.fixture(scope="session")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ModuleType, ModuleType]]:
    """api_pb2 and api_pb2_grpc, compiled from the kubelet's api.proto."""
    out = tmp_path_factory.mktemp("podresources")
    include = Path(protoc.__file__).parent / "_proto"
    status = protoc.main(["protoc", f"-I{PROTO.parent}", f"-I{include}", f"--python_out={out}",
                          f"--grpc_python_out={out}", str(PROTO)])
    assert status == 0, "protoc failed on api.proto"
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(out))  # api_pb2_grpc imports api_pb2 by name
        modules = []
        for name in ("api_pb2", "api_pb2_grpc"):
            spec = importlib.util.spec_from_file_location(name, out / f"{name}.py")
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            mp.setitem(sys.modules, name, module)
            spec.loader.exec_module(module)
            modules.append(module)
        yield modules[0], modules[1]


# (namespace, pod, [(container, [(resource, [device ids])])])
Pods = list[tuple[str, str, list[tuple[str, list[tuple[str, list[str]]]]]]]


class FakeKubelet:
    """A real gRPC server on a unix socket answering List with ``pods``, or as ``mode`` says: "error" (an
    INTERNAL status), "slow" (answers after 3 s), "garbage" (bytes that are no ListPodResourcesResponse) or
    "unavailable once" (UNAVAILABLE, as a connection to a kubelet since restarted ends a call, then answers)."""

    def __init__(self, api: tuple[ModuleType, ModuleType], path: Path, pods: Pods | None = None) -> None:
        self.pb, self.pb_grpc = api
        self.path = path
        self.pods: Pods = pods or []
        self.mode = "ok"
        self.calls = 0
        self.server: Any = None

    def response(self) -> Any:
        pb = self.pb
        return pb.ListPodResourcesResponse(pod_resources=[
            pb.PodResources(name=name, namespace=namespace, containers=[
                pb.ContainerResources(
                    name=container, cpu_ids=[2, 3],
                    memory=[pb.ContainerMemory(memory_type="memory", size=1 << 30)],
                    devices=[pb.ContainerDevices(resource_name=resource, device_ids=ids,
                                                 topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=0)]))
                             for resource, ids in devices])
                for container, devices in containers])
            for namespace, name, containers in self.pods])

    def list(self, request: Any, context: Any) -> Any:
        self.calls += 1
        if self.mode == "error":
            context.abort(grpc.StatusCode.INTERNAL, "pod resources unavailable")
        if self.mode == "unavailable once":
            self.mode = "ok"
            context.abort(grpc.StatusCode.UNAVAILABLE, "Stream removed")
        if self.mode == "slow":
            time.sleep(3)
        return self.response()

    def start(self) -> FakeKubelet:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        if self.mode == "garbage":
            def garbage(request: bytes, context: Any) -> bytes:
                self.calls += 1
                return b"\x0a\xff\xff\xff\x0f" + b"\x00" * 8  # pod_resources claims 4 GiB, then ends

            self.server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
                "v1.PodResourcesLister", {"List": grpc.unary_unary_rpc_method_handler(
                    garbage, request_deserializer=bytes, response_serializer=bytes)})])
        else:
            fake = self

            class Servicer(self.pb_grpc.PodResourcesListerServicer):
                """The generated servicer: List answers; the other methods are UNIMPLEMENTED."""

                def List(self, request: Any, context: Any) -> Any:  # noqa: N802  (the gRPC method's name)
                    return fake.list(request, context)

            self.pb_grpc.add_PodResourcesListerServicer_to_server(Servicer(), self.server)
        assert self.server.add_insecure_port(f"unix:{self.path}") == 1
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop(None).wait()
        self.path.unlink(missing_ok=True)


@pytest.fixture
def kubelet(api: tuple[ModuleType, ModuleType], tmp_path: Path) -> Iterator[FakeKubelet]:
    fake = FakeKubelet(api, tmp_path / "kubelet.sock")
    yield fake
    if fake.server is not None:
        fake.server.stop(None)


def allocations(fake: FakeKubelet, **kwargs: Any) -> Any:
    client = PodResources(str(fake.path), **kwargs)
    try:
        return client.by_gpu()
    finally:
        client.close()


def test_gpus_mig_devices_and_replicas_map_to_their_pods(kubelet: FakeKubelet) -> None:
    kubelet.pods = [
        ("ml", "train-0", [("trainer", [("nvidia.com/gpu", [GPU_A])])]),
        ("serve", "infer-7", [("server", [("nvidia.com/mig-1g.10gb", [MIG])])]),
        ("legacy", "old-mig", [("main", [("nvidia.com/mig-3g.40gb", [f"MIG-{GPU_C}/1/0"])])]),
        ("batch", "shared", [("job", [("nvidia.com/gpu", [f"{GPU_D}::3"])])]),  # a time-slicing replica
        ("other", "not-a-gpu", [("x", [("example.com/fpga", [GPU_B]), ("cpu", [])])]),
        ("gke", "gke-mig", [("x", [("nvidia.com/gpu", ["nvidia0/gi0", "nvidia1/vgpu0"])])]),
        ("idle", "no-devices", [("x", [])]),
    ]
    kubelet.start()
    answer = allocations(kubelet, mig_parent={MIG: GPU_B}.get)
    assert answer == {
        GPU_A: frozenset({Allocation("ml", "train-0", "trainer", GPU_A)}),
        GPU_B: frozenset({Allocation("serve", "infer-7", "server", MIG)}),
        GPU_C: frozenset({Allocation("legacy", "old-mig", "main", f"MIG-{GPU_C}/1/0")}),
        GPU_D: frozenset({Allocation("batch", "shared", "job", f"{GPU_D}::3")}),
    }
    # without NVML to name a new-style MIG instance's GPU, that instance is left out (its pod keeps its UID)
    assert GPU_B not in allocations(kubelet)


def test_a_pod_with_two_containers_on_two_gpus_and_a_pod_on_an_unallocated_gpu(kubelet: FakeKubelet) -> None:
    kubelet.pods = [("research", "ddp-0", [("rank-0", [("nvidia.com/gpu", [GPU_A])]),
                                            ("rank-1", [("nvidia.com/gpu", [GPU_B])])])]
    kubelet.start()
    client = PodResources(str(kubelet.path))
    me = os.getpid()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        resolver = ProcessResolver(cgroup=lambda pid: pod_cgroup(POD_UID))
        jobs = JobWatcher(resolver.resolve, client.by_gpu).jobs([(GPU_A, [me]), (GPU_B, [child.pid]),
                                                                 (GPU_C, [me])])
    finally:
        child.kill()
        child.wait()
        client.close()
    (a,), (b,), (c,) = jobs[GPU_A], jobs[GPU_B], jobs[GPU_C]
    assert (a.namespace, a.pod, a.container, a.name) == ("research", "ddp-0", "rank-0", "research/ddp-0")
    assert (b.namespace, b.pod, b.container, b.name) == ("research", "ddp-0", "rank-1", "research/ddp-0")
    assert a.key == b.key == c.key == f"kubernetes:{POD_UID}"  # the key stays the pod UID
    # GPU C is not allocated to the pod (a pod that sees every GPU): named by UID as without a kubelet
    assert (c.namespace, c.pod, c.container) == (None, None, None) and c.name == resolver.resolve(me).name


def test_a_gpu_shared_by_pods_or_used_by_two_pods_names_none() -> None:
    """The v1 API names no pod UID: where the device does not single out one pod, no name is given."""
    pod, other = Job("kubernetes", POD_UID, name="python"), Job("kubernetes", OTHER_UID, name="python")
    shared = [Allocation("a", "one", "c"), Allocation("b", "two", "c")]
    from gpuwear.jobs.resolve import with_pod_names

    assert with_pod_names([pod], shared) == [pod]
    assert with_pod_names([pod, other], [Allocation("a", "one", "c")]) == [pod, other]
    two_containers = with_pod_names([pod], [Allocation("a", "one", "c1"), Allocation("a", "one", "c2")])
    assert [(j.name, j.container) for j in two_containers] == [("a/one", None)]
    slurm = Job("slurm", "42")
    assert with_pod_names([slurm, pod], [Allocation("a", "one", "c")])[0] == slurm


def test_pods_on_mig_devices_of_one_gpu_are_each_named_after_their_own() -> None:
    """With MIG, one GPU holds several pods' devices: each job is matched by the MIG devices its processes run on
    (NVML's gpuInstanceId / computeInstanceId), never by the GPU alone, which names none."""
    from gpuwear.jobs.resolve import with_pod_names

    pod, other = Job("kubernetes", POD_UID, name="python"), Job("kubernetes", OTHER_UID, name="python")
    mig_b = "MIG-1c1c1c1c-0001-5a1c-8e2f-000000000001"
    held = [Allocation("a", "one", "c", MIG), Allocation("b", "two", "d", mig_b)]
    assert with_pod_names([pod, other], held) == [pod, other]  # by GPU: two pods, no name (the code before)
    named = with_pod_names([pod, other], held, {pod.key: frozenset({MIG}), other.key: frozenset({mig_b})})
    assert [(j.name, j.namespace, j.pod, j.container) for j in named] == [("a/one", "a", "one", "c"),
                                                                         ("b/two", "b", "two", "d")]
    # two pods' processes on one MIG device: neither is named; a job on no allocated device keeps its UID
    both = with_pod_names([pod, other], held, {pod.key: frozenset({MIG}), other.key: frozenset({MIG})})
    assert both == [pod, other]
    assert with_pod_names([pod], held, {pod.key: frozenset({"MIG-not-allocated"})}) == [pod]


@pytest.mark.parametrize("privileged", [True, False], ids=["root", "unprivileged"])
def test_pods_on_mig_devices_are_named_through_nvml_and_the_kubelet(kubelet: FakeKubelet, privileged: bool) -> None:
    """Through the fake NVML (an A100 with two MIG devices, a real process on each), the kubelet naming each MIG
    device by its MIG UUID, and the daemon's own pairing (service.mig_places, mig_parent): each pod's job is named
    after its own pod. Unprivileged too (the shipped unit): the GPU's list needs root, but each MIG device answers
    its own (nvml.h: "Per-instance information can be queried by using specific MIG device handles"); before, the
    daemon read only the GPU's and booked the time unattributed."""
    from gpuwear.service import mig_places

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        rig = make_rig({"privileged": privileged, "gpus": [{"product": "a100-sxm", "mig": True,
                                                      "mig_devices": ["3g.40gb", "4g.40gb"], "schedule": [
                                                          {"kind": "train", "seconds": 600,
                                                           "pids": [os.getpid(), child.pid]}]}]})
        sample = rig.run(11).gpus[0].sample  # past the first slow read: the MIG devices are known
        assert sample is not None and sample.mig_devices is not None
        uuid = rig.sampler.snapshot.gpus[0].identity.uuid
        (_, _, first), (_, _, second) = sample.mig_devices
        kubelet.pods = [("vision", "resnet", [("pytorch", [("nvidia.com/mig-3g.40gb", [first])])]),
                        ("nlp", "bert", [("trainer", [("nvidia.com/mig-4g.40gb", [second])])])]
        kubelet.start()
        parents = {mig: uuid for _, _, mig in sample.mig_devices}
        client = PodResources(str(kubelet.path), mig_parent=parents.get)
        uids = {os.getpid(): POD_UID, child.pid: OTHER_UID}
        watcher = JobWatcher(ProcessResolver(cgroup=lambda pid: pod_cgroup(uids[pid])).resolve, client.by_gpu)
        jobs = watcher.jobs([(uuid, [pid for pid, _ in sample.processes or ()])], {uuid: mig_places(sample)})
        client.close()
    finally:
        child.kill()
        child.wait()
    assert mig_places(sample) == {os.getpid(): first, child.pid: second}
    listed = jobs[uuid]
    assert not isinstance(listed, Unseen)
    assert sorted((j.id, j.name, j.container) for j in listed) == sorted(
        [(POD_UID, "vision/resnet", "pytorch"), (OTHER_UID, "nlp/bert", "trainer")])


@pytest.mark.slow
def test_kubelet_down_removed_broken_or_slow_falls_back_and_logs_once_then_recovers(
        kubelet: FakeKubelet, caplog: pytest.LogCaptureFixture) -> None:
    kubelet.pods = [("ml", "train-0", [("trainer", [("nvidia.com/gpu", [GPU_A])])])]
    kubelet.start()
    now = [0.0]
    # a generous deadline for a kubelet that answers (a new channel's connection under a loaded machine's pytest
    # took over 0.5 s), a short one for the slow kubelet: its asks are to be cut at it
    answering, slow = 5.0, 0.5
    client = PodResources(str(kubelet.path), refresh_seconds=10.0, timeout_seconds=answering, clock=lambda: now[0])
    watcher = JobWatcher(ProcessResolver(cgroup=lambda pid: pod_cgroup(POD_UID)).resolve, client.by_gpu)

    def names() -> str | None:
        now[0] += 10.0
        return watcher.jobs([(GPU_A, [os.getpid()])])[GPU_A][0].pod

    caplog.set_level(logging.INFO, logger=LOGGER)
    assert names() == "train-0"
    kubelet.stop()  # down, its socket gone
    assert [names() for _ in range(3)] == [None, None, None]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "does not answer" in warnings[0].getMessage()
    assert "UNAVAILABLE" in warnings[0].getMessage()

    kubelet.start()  # back on the same path: a new channel connects at once
    assert names() == "train-0"
    assert "answers again" in caplog.records[-1].getMessage()

    for mode, said in (("error", "INTERNAL: pod resources unavailable"), ("garbage", "not a ListPodResourcesResponse"),
                       ("slow", "DEADLINE_EXCEEDED")):
        kubelet.stop()
        kubelet.mode = mode
        kubelet.start()
        caplog.clear()
        client.timeout_seconds = slow if mode == "slow" else answering
        started = time.monotonic()
        assert [names() for _ in range(2)] == [None, None], mode
        if mode == "slow":
            assert time.monotonic() - started < 2 * slow + 1.0  # two tries, each cut at the timeout (not 2 x 3 s)
        client.timeout_seconds = answering
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and said in warnings[0].getMessage(), (mode, caplog.text)
        kubelet.stop()
        kubelet.mode = "ok"
        kubelet.start()
        assert names() == "train-0", mode
    client.close()


def test_a_kubelet_restarted_between_two_asks_is_answered_without_a_warning(
        kubelet: FakeKubelet, caplog: pytest.LogCaptureFixture) -> None:
    """A kubelet restarts (an upgrade, a config change) between two asks: the channel still holds the old one's
    connection, and the first call on it can fail UNAVAILABLE ("Stream removed (sendmsg: Broken pipe)": the clean CI
    run met it, a race with gRPC noticing the old server gone). Before, that was a warning that the kubelet does not
    answer and a refresh interval of pods named by UID; now an UNAVAILABLE on a channel that had answered is asked
    once more on a fresh channel. The restarts themselves, then the race made certain ("unavailable once")."""
    kubelet.pods = [("ml", "train-0", [("trainer", [("nvidia.com/gpu", [GPU_A])])])]
    kubelet.start()
    now = [0.0]
    client = PodResources(str(kubelet.path), refresh_seconds=10.0, timeout_seconds=5.0, clock=lambda: now[0])
    caplog.set_level(logging.INFO, logger=LOGGER)
    try:
        for _ in range(5):
            now[0] += 10.0
            answer = client.by_gpu()
            assert answer is not None and GPU_A in answer
            kubelet.stop()
            kubelet.start()
        kubelet.mode = "unavailable once"
        now[0] += 10.0
        answer = client.by_gpu()
        assert answer is not None and GPU_A in answer and kubelet.mode == "ok"
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
        kubelet.stop()  # down: still said, once, after the one more try
        now[0] += 10.0
        assert client.by_gpu() is None
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1 and "UNAVAILABLE" in warnings[0].getMessage()
    finally:
        client.close()


def test_the_kubelet_is_asked_at_most_every_refresh_interval(kubelet: FakeKubelet) -> None:
    kubelet.pods = [("ml", "train-0", [("trainer", [("nvidia.com/gpu", [GPU_A])])])]
    kubelet.start()
    now = [100.0]
    client = PodResources(str(kubelet.path), refresh_seconds=10.0, clock=lambda: now[0])
    watcher = JobWatcher(ProcessResolver(cgroup=lambda pid: pod_cgroup(POD_UID)).resolve, client.by_gpu)
    for _ in range(5):  # five ticks within the interval: one question
        now[0] += 1.0
        watcher.jobs([(GPU_A, [os.getpid()]), (GPU_B, [os.getpid()])])
    assert (kubelet.calls, client.questions) == (1, 1)
    now[0] += 6.0
    watcher.jobs([(GPU_A, [os.getpid()])])
    assert kubelet.calls == 2
    # a snapshot with no pod on any GPU asks nothing
    plain = JobWatcher(ProcessResolver(cgroup=lambda pid: "0::/system.slice/train.service\n").resolve,
                       client.by_gpu)
    now[0] += 60.0
    plain.jobs([(GPU_A, [os.getpid()])])
    assert kubelet.calls == 2
    client.close()


def test_pod_names_reach_the_tracker_and_the_ledger_record(kubelet: FakeKubelet) -> None:
    """Through the fake NVML (a real process on a simulated GPU), the job watcher and the wear tracker: the
    info metric's jobs carry the names, the job record saved for `gpuwear jobs` is named namespace/pod."""
    rig = make_rig({"gpus": [{"product": "h100-sxm", "schedule": [
        {"kind": "train", "seconds": 600, "pids": [os.getpid()]}]}]})
    uuid = rig.sampler.snapshot.gpus[0].identity.uuid
    kubelet.pods = [("vision", "resnet-trainer", [("pytorch", [("nvidia.com/gpu", [uuid])])])]
    kubelet.start()
    client = PodResources(str(kubelet.path))
    watcher = JobWatcher(ProcessResolver(cgroup=lambda pid: pod_cgroup(POD_UID)).resolve, client.by_gpu)
    tracker = WearTracker({}, WearConfig(), job_grace_seconds=60)
    for _ in range(30):
        snap = rig.run(1)
        jobs = watcher.jobs((g.identity.uuid, [pid for pid, _ in g.sample.processes or ()])
                            for g in snap.gpus if g.sample is not None)
        tracker.observe(snap, rig.clock.monotonic(), rig.clock.wall(), jobs)
    client.close()
    (shown,) = tracker.views[uuid].jobs
    assert (shown.kind, shown.id) == ("kubernetes", POD_UID)
    assert (shown.namespace, shown.pod, shown.container, shown.name) == (
        "vision", "resnet-trainer", "pytorch", "vision/resnet-trainer")
    (record,) = [r for r in tracker.jobs.take() if r["kind"] == "kubernetes"]
    assert record["name"] == "vision/resnet-trainer" and record["id"] == POD_UID
    # and in /metrics, with dcgm-exporter's label names
    info = DaemonInfo(version="test", python_version="test", backend="nvml", scenario="")
    text = encode(Published(rig.sampler.snapshot, tracker.views, None, info), False).decode()
    (line,) = [line for line in text.splitlines() if line.startswith("gpuwear_job_info{")]
    assert 'container="pytorch"' in line and 'namespace="vision"' in line and 'pod="resnet-trainer"' in line
    assert f'job_id="{POD_UID}"' in line and 'job_kind="kubernetes"' in line
    assert "namespace" not in record  # the ledger's job schema is unchanged


def test_names_learnt_after_the_job_started_replace_the_process_name() -> None:
    from gpuwear.jobs.attribute import JobAccounts
    from gpuwear.wear.accumulate import GpuWear, Interval

    accounts = JobAccounts(60.0)
    wear = GpuWear(GPU_A, "H100", None)
    unnamed = Job("kubernetes", POD_UID, None, "python")
    named = Job("kubernetes", POD_UID, None, "ml/train-0", "ml", "train-0", "trainer")
    accounts.account(GPU_A, 1001.0, Interval(dt=1.0, cycles=[]), {}, [unnamed], wear)
    assert accounts.active[unnamed.key].name == "python"
    accounts.account(GPU_A, 1002.0, Interval(dt=1.0, cycles=[]), {}, [named], wear)
    accounts.account(GPU_A, 1003.0, Interval(dt=1.0, cycles=[]), {}, [unnamed], wear)  # the kubelet stopped answering
    rec = accounts.active[unnamed.key]
    assert (rec.name, rec.namespace, rec.pod, rec.gpus[GPU_A].container) == ("ml/train-0", "ml", "train-0", "trainer")


# -- the decoder against the real encoding, and against anything else -----------------------------------


def test_decoder_reads_the_real_encoding_and_skips_what_it_does_not_use(api: tuple[ModuleType, ModuleType],
                                                                         tmp_path: Path) -> None:
    fake = FakeKubelet(api, tmp_path / "unused.sock", [
        ("ns", "p" * 300, [("c\x1b[31m", [("nvidia.com/gpu", [GPU_A, "G" * 500, "GPU-\x00bad"])])])])
    groups = decode_list(fake.response().SerializeToString())
    ((allocation, resource, ids),) = groups
    assert allocation == Allocation("ns", "p" * 128, "c?[31m")  # clipped, printable
    assert (resource, ids) == ("nvidia.com/gpu", [GPU_A])  # an over-long or unprintable id is dropped
    assert decode_list(b"") == []


@pytest.mark.parametrize("data", [
    b"\x0a\x05abc",  # a length past the end
    b"\x0a\x02\x0a",  # a nested message cut short
    b"\x0b",  # a group (wire type 3)
    b"\x08",  # a truncated varint
    b"\x0a" + b"\xff" * 11,  # a varint longer than 10 bytes
    b"\x0a\x04\x08\x01\x10\x01",  # PodResources.name (1) as a varint
    b"\x00\x00",  # field number 0
])
def test_decoder_refuses_broken_answers(data: bytes) -> None:
    with pytest.raises(ProtoError):
        decode_list(data)


@settings(max_examples=examples(300), deadline=None)
@given(st.binary(max_size=512))
def test_decoder_never_raises_anything_but_a_proto_error(data: bytes) -> None:
    try:
        groups = decode_list(data)
    except ProtoError:
        return
    assert isinstance(by_gpu(groups), dict)


def test_device_ids_to_gpu_uuids() -> None:
    assert gpu_of(GPU_A) == GPU_A
    assert gpu_of(f"{GPU_A}::12") == GPU_A
    assert gpu_of(f"MIG-{GPU_A}/7/0") == GPU_A
    assert gpu_of(MIG) is None and gpu_of(MIG, {MIG: GPU_B}.get) == GPU_B
    assert gpu_of("nvidia0/gi1") is None and gpu_of("0") is None and gpu_of("GPU-zz") is None


# -- where there is no kubelet, or no grpcio --------------------------------------------------------------


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)


def test_the_daemon_imports_no_grpc_without_a_socket(tmp_path: Path) -> None:
    result = _python(f"""
import sys
import gpuwear.cli, gpuwear.service
from gpuwear.jobs.kubelet import open_pod_resources
assert open_pod_resources({str(tmp_path / "absent.sock")!r}) is None
assert open_pod_resources("") is None
print(sorted(m for m in sys.modules if m == "grpc" or m.startswith("grpc.")))
""")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_a_socket_without_grpcio_says_so_once_and_names_by_uid(tmp_path: Path) -> None:
    path = tmp_path / "kubelet.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    try:
        result = _python(f"""
import logging, sys
sys.modules["grpc"] = None  # as if grpcio were not installed
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
from gpuwear.jobs.kubelet import open_pod_resources
print(open_pod_resources({str(path)!r}))
""")
    finally:
        listener.close()
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "None"
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("WARNING") and "grpcio is not installed" in line and "gpuwear[kubernetes]" in line


def test_open_pod_resources_on_a_live_socket(kubelet: FakeKubelet) -> None:
    kubelet.pods = [("ml", "train-0", [("trainer", [("nvidia.com/gpu", [GPU_A])])])]
    kubelet.start()
    client = open_pod_resources(str(kubelet.path), 5.0)
    assert client is not None and client.refresh_seconds == 5.0
    answer = client.by_gpu()
    client.close()
    assert answer is not None and answer[GPU_A] == frozenset({Allocation("ml", "train-0", "trainer", GPU_A)})


def test_a_socket_that_appears_after_the_start_is_used_from_then_on(kubelet: FakeKubelet,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """A daemon started before the kubelet (gpuwear.service ahead of kubelet.service at boot): the socket is looked
    for again at most every refresh interval, and its pods are named once it is there."""
    now = [1000.0]
    watch = PodResourcesWatch(str(kubelet.path), refresh_seconds=10.0, clock=lambda: now[0])
    try:
        assert watch.by_gpu() is None and watch.pods is None  # no kubelet yet
        kubelet.pods = [("ml", "train-0", [("trainer", [("nvidia.com/gpu", [GPU_A])])])]
        kubelet.start()
        now[0] += 9.0
        assert watch.by_gpu() is None and watch.pods is None  # there, but not looked for again within the interval
        now[0] += 1.0
        with caplog.at_level(logging.INFO, logger="gpuwear.jobs.kubelet"):
            assert watch.by_gpu() == {GPU_A: frozenset({Allocation("ml", "train-0", "trainer", GPU_A)})}
        assert watch.pods is not None and watch.pods.refresh_seconds == 10.0
        assert [r.getMessage() for r in caplog.records if "appeared" in r.getMessage()] == [
            f"kubelet pod-resources socket {kubelet.path} appeared"]
    finally:
        watch.close()
    assert PodResourcesWatch("").by_gpu() is None  # "" (off): nothing looked for
