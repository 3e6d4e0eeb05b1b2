"""The local stack's processes: free ports, and the PID files of what it starts (:mod:`khipu.process_group`, which
the production launcher uses too), so that it stops only what it started; a component may be kept running by
:mod:`khipu.localstack.keeper`.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from collections.abc import Mapping
from pathlib import Path

from khipu import process_group
from khipu.localstack.keeper import exits_path
from khipu.process_group import Started as Started  # re-exported: the local stack's callers import them from here
from khipu.process_group import stop_process_group as stop_process_group


def find_java() -> str | None:
    """The ``java`` of ``JAVA_HOME``, else the one on PATH; None when there is neither."""
    home = os.environ.get("JAVA_HOME")
    candidate = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return candidate if candidate and Path(candidate).exists() else None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_open(host: str, port: int, timeout_s: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout_s):
            return True
    except OSError:
        return False


class ProcessTable(process_group.ProcessTable):
    """The ``<state>/run/<name>.json`` files of the local stack: :class:`khipu.process_group.ProcessTable`, whose
    components may also be kept running by :mod:`khipu.localstack.keeper`."""

    def spawn(
        self,
        name: str,
        argv: list[str],
        env: Mapping[str, str],
        log_path: Path,
        detail: str,
        cwd: Path | None = None,
        keep: bool = False,
    ) -> Started:
        """Start ``argv`` in a new process group, logging to ``log_path``, and record it. ``keep``: under
        :mod:`khipu.localstack.keeper`, which starts it again when it exits on its own and records why."""
        if keep:
            state_dir = self.directory.parent
            argv = [sys.executable, "-m", "khipu.localstack.keeper", "--name", name, "--state", str(state_dir), "--",
                    *argv]  # fmt: skip
            exits_path(state_dir, name).unlink(missing_ok=True)  # a new start: earlier restarts are history
        return super().spawn(name, argv, env, log_path, detail, cwd)


def child_env(extra: Mapping[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    return env
