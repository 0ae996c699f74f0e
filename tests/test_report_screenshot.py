"""scripts/report_screenshot.sh: a PNG of a run's report from headless Chromium (where installed),
and the install command where it is not."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "report_screenshot.sh"
BROWSER = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)


def test_without_chromium_it_prints_the_apt_command(tmp_path):
    r = subprocess.run(["/bin/bash", str(SCRIPT), str(tmp_path), str(tmp_path / "out.png")],
                       env={"PATH": str(tmp_path)}, capture_output=True, text=True)
    assert r.returncode == 1 and "apt-get install -y chromium" in r.stderr, r.stderr


@pytest.mark.skipif(BROWSER is None, reason="needs Chromium (apt-get install -y chromium)")
def test_screenshot_of_a_report(tmp_path):
    from PIL import Image

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "critic/score/mean": s / 50,
                                                           "actor/entropy": 1 - s / 100}) + "\n" for s in range(1, 51)))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}  # reinforge
    r = subprocess.run([str(SCRIPT), str(run), str(tmp_path / "shot.png"), "900", "700"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(tmp_path / "shot.png") and (run / "report" / "index.html").exists()
    with Image.open(tmp_path / "shot.png") as img:
        assert img.size == (900, 700) and img.mode == "P"  # the window size; a 256-colour palette
        # not a blank page: the plots put many colours on screen
        assert len(img.convert("RGB").getcolors(maxcolors=1 << 16) or []) > 20
