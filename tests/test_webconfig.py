"""TLS and basic auth on /metrics with the exporter web-config format, checked with real clients."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from base64 import b64encode
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest

from helpers import free_port, wait_for

NO_PROXY = urllib.request.ProxyHandler({})


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tls")
    openssl = shutil.which("openssl")
    assert openssl, "openssl is needed to make a test certificate"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(folder / "tls.key"),
                    "-out", str(folder / "tls.crt"), "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"], check=True, capture_output=True)
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=10)).decode()
    (folder / "web.yml").write_text(f"tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n"
                                    f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    return folder


@pytest.fixture
def daemon(tls: Path, tmp_path: Path) -> Iterator[int]:
    port = free_port()
    config = tmp_path / "config.yaml"
    config.write_text(f"web_config_file: {tls / 'web.yml'}\n")
    proc = subprocess.Popen([sys.executable, "-m", "gpuwear", "run", "--simulate", "--config", str(config),
                             "--listen", f"127.0.0.1:{port}"], stderr=subprocess.DEVNULL)
    try:
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=5)


def get(url: str, context: ssl.SSLContext | None, auth: str | None = None) -> tuple[int, str]:
    opener = urllib.request.build_opener(NO_PROXY, urllib.request.HTTPSHandler(context=context))
    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic " + b64encode(auth.encode()).decode())
    try:
        with opener.open(request, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_tls_and_basic_auth(daemon: int, tls: Path) -> None:
    port = daemon
    context = ssl.create_default_context(cafile=str(tls / "tls.crt"))
    base = f"https://127.0.0.1:{port}"
    body = ""
    for _ in range(100):  # until the daemon serves
        try:
            body = get(base + "/healthz", context)[1]
            break
        except OSError:
            time.sleep(0.1)
    assert body == "ok\n"  # probes need no credentials
    assert get(base + "/metrics", context)[0] == 401
    assert get(base + "/metrics", context, "prometheus:wrong")[0] == 401
    assert get(base + "/metrics", context, "nobody:s3cret")[0] == 401
    status, body = get(base + "/metrics", context, "prometheus:s3cret")
    assert status == 200 and "gpuwear_temperature_celsius" in body
    assert get(base + "/metrics", context, "prometheus:s3cret")[0] == 200  # the remembered credential
    with pytest.raises(OSError):  # plain HTTP on the TLS port gets nowhere
        urllib.request.build_opener(NO_PROXY).open(f"http://127.0.0.1:{port}/metrics", timeout=5)
    curl = shutil.which("curl")
    if curl:  # another real client
        out = subprocess.run([curl, "-sS", "--cacert", str(tls / "tls.crt"), "-u", "prometheus:s3cret",
                              f"{base}/metrics"], capture_output=True, text=True, timeout=10)
        assert out.returncode == 0 and "gpuwear_power_watts" in out.stdout


def test_a_password_instead_of_a_hash_is_refused(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users:\n  prometheus: plaintext\n")
    config = tmp_path / "config.yaml"
    config.write_text(f"web_config_file: {web}\n")
    result = subprocess.run([sys.executable, "-m", "gpuwear", "run", "--simulate", "--config", str(config),
                             "--listen", f"127.0.0.1:{free_port()}"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "expected a bcrypt hash" in result.stderr and "Traceback" not in result.stderr


def test_plain_http_by_default_on_loopback() -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gpuwear", "run", "--simulate", "--listen", f"127.0.0.1:{port}"],
                            stderr=subprocess.DEVNULL)
    try:
        assert "gpuwear_gpu_up" in wait_for(f"http://127.0.0.1:{port}/metrics", "gpuwear_gpu_up")
    finally:
        proc.terminate()
        proc.wait(timeout=5)
