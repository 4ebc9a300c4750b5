from __future__ import annotations

import pytest

from protos import names
from protos.gpufleet.v1 import findings_pb2


def test_cause_names_round_trip() -> None:
    assert names.cause_name(findings_pb2.CAUSE_THERMAL_THROTTLE) == "thermal_throttle"
    for name in names.CAUSES:
        assert names.cause_name(names.cause_value(name)) == name
    assert "slow_unknown" in names.CAUSES
    assert names.cause_name(findings_pb2.CAUSE_UNSPECIFIED) == ""


def test_unknown_name_lists_choices() -> None:
    with pytest.raises(ValueError, match="thermal_throttle"):
        names.cause_value("melted")
    with pytest.raises(ValueError):
        names.cause_value("")


def test_clock_event_reasons_decode_including_unknown_bits() -> None:
    assert names.clock_event_reason_names(0) == []
    assert names.clock_event_reason_names(0x40 | 0x8) == ["hw_slowdown", "hw_thermal_slowdown"]
    assert names.clock_event_reason_names(0x4 | 0x400) == ["sw_power_cap", "bit_0x400"]
    assert names.clock_event_reason_bit("hw_power_brake_slowdown") == 0x80


def test_reason_bits_match_nvml() -> None:
    import pynvml

    assert names.clock_event_reason_bit("gpu_idle") == pynvml.nvmlClocksEventReasonGpuIdle
    assert (
        names.clock_event_reason_bit("applications_clocks_setting")
        == pynvml.nvmlClocksEventReasonApplicationsClocksSetting
    )
    assert names.clock_event_reason_bit("sw_power_cap") == pynvml.nvmlClocksEventReasonSwPowerCap
    assert names.clock_event_reason_bit("hw_slowdown") == pynvml.nvmlClocksEventReasonHwSlowdown
    assert names.clock_event_reason_bit("sync_boost") == pynvml.nvmlClocksEventReasonSyncBoost
    assert (
        names.clock_event_reason_bit("sw_thermal_slowdown") == pynvml.nvmlClocksEventReasonSwThermalSlowdown
    )
    assert (
        names.clock_event_reason_bit("hw_thermal_slowdown") == pynvml.nvmlClocksEventReasonHwThermalSlowdown
    )
    assert (
        names.clock_event_reason_bit("hw_power_brake_slowdown")
        == pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
    )
    assert (
        names.clock_event_reason_bit("display_clock_setting")
        == pynvml.nvmlClocksEventReasonDisplayClockSetting
    )
