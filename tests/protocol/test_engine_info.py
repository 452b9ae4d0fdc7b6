"""protocol/engine_info.py: the engine facts both ends read, without the server's engine interface."""

from __future__ import annotations

import subprocess
import sys

import msgspec

from indextts_sidecar import engines
from indextts_sidecar.protocol.doctor import DoctorReport
from indextts_sidecar.protocol.engine_info import EngineDescription, SpeedControl


def test_the_shared_layer_imports_no_engine_code_and_no_numpy() -> None:
    code = (
        "import sys; import indextts_sidecar.protocol.doctor, indextts_sidecar.protocol.engine_info; "
        "print(sorted(m for m in sys.modules if m.startswith('indextts_sidecar.engines') or m == 'numpy'))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"


def test_the_engine_interface_still_names_them() -> None:
    assert engines.EngineDescription is EngineDescription and engines.SpeedControl is SpeedControl


def test_a_report_embeds_a_description_with_its_speed_control() -> None:
    speed = SpeedControl(option="rate", normal=175, minimum=80, maximum=450, integer=True)
    report = DoctorReport(engine="espeak", engine_info=EngineDescription(name="espeak", available=True, speed=speed))
    decoded = msgspec.json.decode(msgspec.json.encode(report), type=DoctorReport)
    assert decoded.engine_info is not None and decoded.engine_info.speed == speed
    assert decoded.engine_info.speed.value(2.0) == 350
