"""A throwaway Docker engine for tests: Debian's dockerd started by hand (no systemd, no registry).

Everything (data root, exec root, socket, pid file, log) lives under one temp dir; no systemd, no iptables, no
bridge (containers use network "none"). There is no registry here, so the image the tests run,
``portal-test/busybox:latest``, is built from the static busybox binary and imported.

Set ``PORTAL_TEST_DOCKER_HOST=unix:///path/docker.sock`` to use an engine that is already running (e.g. one
started by ``scripts/dockerd-test.sh``); the fixture then builds the image if missing and stops nothing.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import struct
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

IMAGE_REPO = "portal-test/busybox"
IMAGE_TAG = "latest"
IMAGE = f"{IMAGE_REPO}:{IMAGE_TAG}"
BUSYBOX_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox")
ENV_DOCKER_HOST = "PORTAL_TEST_DOCKER_HOST"


class DockerdError(RuntimeError):
    """dockerd is installed but did not come up."""


@dataclass
class Dockerd:
    """A running engine started by ``start_dockerd``."""

    url: str
    root: Path
    process: subprocess.Popen[bytes]
    storage_driver: str

    @property
    def log_path(self) -> Path:
        return self.root / "dockerd.log"


def find_static_busybox() -> str | None:
    for path in BUSYBOX_CANDIDATES:
        if os.path.isfile(path) and is_static_elf(path):
            return path
    return None


def is_static_elf(path: str) -> bool:
    """True for an ELF without a program interpreter: it runs in a rootfs that has no libc."""
    with open(path, "rb") as f:
        header = f.read(64)
        if header[:4] != b"\x7fELF" or header[4] != 2:  # 64-bit only; the test hosts are x86_64/aarch64
            return False
        endian = "<" if header[5] == 1 else ">"
        (phoff,) = struct.unpack_from(endian + "Q", header, 0x20)
        phentsize, phnum = struct.unpack_from(endian + "HH", header, 0x36)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    pt_interp = 3
    return all(struct.unpack_from(endian + "I", table, i * phentsize)[0] != pt_interp for i in range(phnum))


def unavailable_reason() -> str | None:
    """Why a local dockerd cannot be started here, or None if it can."""
    if shutil.which("dockerd") is None:
        return "dockerd is not installed (apt-get install docker.io)"
    if os.geteuid() != 0:
        return "starting dockerd needs root"
    if find_static_busybox() is None:
        return "no static busybox to build the test image (apt-get install busybox-static)"
    return None


def _ping(url: str) -> bool:
    import docker

    try:
        client = docker.DockerClient(base_url=url, version="auto", timeout=5)
    except Exception:
        return False
    try:
        return bool(client.ping())
    except Exception:
        return False
    finally:
        client.close()


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _launch(root: Path, storage_driver: str, timeout_s: float) -> Dockerd:
    sock = root / "docker.sock"
    url = f"unix://{sock}"
    config = root / "daemon.json"
    # An empty config file: the host's /etc/docker/daemon.json must not change the test engine.
    config.write_text("{}")
    data_root = root / f"data-{storage_driver}"
    command = [
        "dockerd",
        "--config-file", str(config),
        "--data-root", str(data_root),
        "--exec-root", str(root / "exec"),
        "-H", url,
        "--pidfile", str(root / "dockerd.pid"),
        "--storage-driver", storage_driver,
        "--iptables=false",
        "--ip6tables=false",
        "--ip-masq=false",
        "--bridge=none",
    ]  # fmt: skip
    log = open(root / "dockerd.log", "ab")  # noqa: SIM115 - handed to the child, closed right after
    try:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        log.close()
    engine = Dockerd(url=url, root=root, process=process, storage_driver=storage_driver)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise DockerdError(
                f"dockerd ({storage_driver}) exited with {process.returncode}:\n{_tail(engine.log_path)}"
            )
        if sock.exists() and _ping(url):
            return engine
        time.sleep(0.1)
    _terminate(engine)
    raise DockerdError(f"dockerd ({storage_driver}) did not answer in {timeout_s:g} s:\n{_tail(engine.log_path)}")


def start_dockerd(root: Path, *, timeout_s: float = 30.0) -> Dockerd:
    """Start dockerd under ``root``: overlay2, or vfs where overlay2 fails (e.g. overlay on overlay)."""
    try:
        return _launch(root, "overlay2", timeout_s)
    except DockerdError as first:
        try:
            return _launch(root, "vfs", timeout_s)
        except DockerdError as second:
            raise DockerdError(f"{first}\n-- then with vfs --\n{second}") from second


def _terminate(engine: Dockerd, timeout_s: float = 20.0) -> None:
    if engine.process.poll() is None:
        engine.process.send_signal(signal.SIGTERM)
        try:
            engine.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # dockerd's own containerd child is in its session; take the whole group down.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(engine.process.pid, signal.SIGKILL)
            engine.process.wait(timeout=10)


def _unmount_under(root: Path) -> None:
    # overlay2 and the exec root leave mounts behind if dockerd died hard; rmtree cannot remove those.
    prefix = str(root) + "/"
    with open("/proc/self/mounts") as f:
        points = [line.split()[1] for line in f if line.split()[1].startswith(prefix)]
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


def stop_dockerd(engine: Dockerd) -> None:
    """Remove every container (so no shim lingers), SIGTERM dockerd, wait, and delete its files."""
    import docker

    with contextlib.suppress(Exception):
        client = docker.DockerClient(base_url=engine.url, version="auto", timeout=30)
        try:
            for container in client.containers.list(all=True):
                with contextlib.suppress(Exception):
                    container.remove(force=True)
        finally:
            client.close()
    _terminate(engine)
    _unmount_under(engine.root)
    shutil.rmtree(engine.root, ignore_errors=True)


def busybox_rootfs_tar(busybox: str) -> bytes:
    """A tar of a minimal rootfs: /bin/busybox, a symlink per applet, and a world-writable /tmp."""
    applets = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True).stdout.split()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, mode in (("bin", 0o755), ("tmp", 0o1777), ("etc", 0o755)):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)
        with open(busybox, "rb") as f:
            data = f.read()
        info = tarfile.TarInfo("bin/busybox")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
        for applet in applets:
            if applet == "busybox" or "/" in applet:
                continue
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname, info.mode = tarfile.SYMTYPE, "busybox", 0o777
            tar.addfile(info)
        passwd = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"
        info = tarfile.TarInfo("etc/passwd")
        info.size, info.mode = len(passwd), 0o644
        tar.addfile(info, io.BytesIO(passwd))
    return buffer.getvalue()


def build_busybox_image(url: str, busybox: str | None = None) -> str:
    """Import ``portal-test/busybox:latest`` into the engine at ``url`` unless present; return its name."""
    import docker
    from docker.errors import ImageNotFound

    client = docker.DockerClient(base_url=url, version="auto", timeout=120)
    try:
        try:
            client.images.get(IMAGE)
            return IMAGE
        except ImageNotFound:
            pass
        path = busybox or find_static_busybox()
        if path is None:
            raise DockerdError("no static busybox to build the test image")
        # The SDK's docker import: ENV PATH=/bin because the image has no shell profile to set one.
        client.api.import_image_from_data(
            busybox_rootfs_tar(path), repository=IMAGE_REPO, tag=IMAGE_TAG, changes=["ENV PATH=/bin"]
        )
        client.images.get(IMAGE)
        return IMAGE
    finally:
        client.close()


@pytest.fixture(scope="session")
def dockerd() -> Iterator[str]:
    """The URL (``unix:///...``) of a Docker engine holding ``portal-test/busybox:latest``.

    Skips where dockerd cannot run here (not installed, not root, no static busybox); fails if it is
    installed but does not start, so CI (which installs docker.io) never skips silently.
    """
    existing = os.environ.get(ENV_DOCKER_HOST)
    if existing:
        build_busybox_image(existing)
        yield existing
        return
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    # Under /tmp with a short name: a unix socket path must stay under 108 bytes.
    root = Path(tempfile.mkdtemp(prefix="pdockerd-", dir="/tmp"))
    try:
        engine = start_dockerd(root)
    except DockerdError as exc:
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(f"dockerd is installed but did not start: {exc}")
    try:
        build_busybox_image(engine.url)
        yield engine.url
    finally:
        stop_dockerd(engine)
