"""jetson/: the systemd unit, config template and install script."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from edgeocr.serve_config import read_config_file

JET = Path(__file__).resolve().parents[1] / "jetson"


def test_unit_passes_systemd_analyze_verify(tmp_path):
    assert shutil.which("systemd-analyze"), "install systemd (scripts/setup.sh does)"
    unit = (JET / "edgeocr.service").read_text()
    # the venv path exists only on an installed device: point ExecStart at this Python instead
    unit = re.sub(r"^ExecStart=\S+", f"ExecStart={sys.executable} -m edgeocr", unit, flags=re.M)
    p = tmp_path / "edgeocr.service"
    p.write_text(unit)
    r = subprocess.run(["systemd-analyze", "verify", str(p)], capture_output=True, text=True)
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr
    r = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(p)], capture_output=True, text=True)
    score = float(re.search(r"Overall exposure level for \S+: ([\d.]+)", r.stdout).group(1))
    assert score <= 2.5, r.stdout[-2000:]
    for key in ("Type=notify", "WatchdogSec=", "PrivateDevices=no", "RuntimeDirectory=edgeocr",
                "StateDirectory=edgeocr", "CacheDirectory=edgeocr", "SupplementaryGroups=video render"):
        assert key in unit


def test_config_template_is_valid():
    cfg = read_config_file(JET / "edgeocr.conf")
    assert cfg["artifact"] == "/var/lib/edgeocr/artifact" and cfg["socket"] == "/run/edgeocr/edgeocr.sock"
    assert cfg["socket_mode"] == 0o660 and cfg["device"] == "cuda"


def test_install_script_syntax_and_help():
    assert subprocess.run(["bash", "-n", str(JET / "install.sh")]).returncode == 0
    r = subprocess.run(["bash", str(JET / "install.sh"), "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--uninstall" in r.stdout
    r = subprocess.run(["bash", str(JET / "install.sh"), "--bogus"], capture_output=True, text=True)
    assert r.returncode == 2 and "unknown argument" in r.stderr
