"""A small step of bench/controller_scale.py, so that it cannot rot: 50 simulated nodes over real gRPC
streams into a real controller process, a frame a second each for 5 s, then a reconnect storm; and
the same step (no storm) with the store in a real PostgreSQL (--db). The report's structure and
sane values are checked, not its figures against the targets."""

from __future__ import annotations

import json
import math
import re
import resource
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from controller.config import ControllerConfig
from tests.postgres_server import PostgresServer

# bench/ is a folder of scripts; the bench and its helper package are imported from there (and the
# generator's worker processes, spawned, find them on the same sys.path).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import controller_scale
from controller_scale_load import disk_writer, report, storms, target
from controller_scale_load.disk_writer import DiskWriter

NODES = 50
STEP = [
    *("--steps", str(NODES), "--hold", "5", "--interval", "1", "--ramp", "1"),
    *("--workers", "1", "--archetypes", "2", "--detect-interval", "1"),
]
ARGS = [*STEP, "--reconnect-storm", "--transport-floor", "--disk-writer", "5"]


@pytest.fixture(scope="module")
def document(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    args = controller_scale.parse_args(ARGS)
    return controller_scale.run(args, tmp_path_factory.mktemp("controller_scale"))


def _finite(value: object) -> bool:
    return isinstance(value, float | int) and math.isfinite(value) and value >= 0


def test_every_node_streams_and_is_listed(document: dict[str, Any]) -> None:
    [step] = document["steps"]
    assert step["nodes"] == step["connected"] == NODES
    assert step["list_nodes_count"] == NODES and step["list_nodes_pages"] == 1
    assert step["frames_acked"] > 0.5 * step["frames_due"], step
    assert step["errors"] == 0 and step["commands"] == 0
    assert step["frames_per_second"] > 0 and step["controller_frames_per_second"] > 0
    assert _finite(step["ack_p50_s"]) and _finite(step["ack_p99_s"])
    assert step["ack_p50_s"] <= step["ack_p99_s"] <= step["ack_max_s"]


def test_controller_figures_are_measured(document: dict[str, Any]) -> None:
    [step] = document["steps"]
    assert step["cpu_cores"] > 0 and step["cpu_ms_per_frame"] > 0
    # The event loop's thread is one of the controller process's threads (gRPC's and the store's too).
    assert 0 < step["loop_ms_per_frame"] < step["main_ms_per_frame"] < step["cpu_ms_per_frame"], step
    assert step["rss_bytes"] > 10_000_000
    assert step["detection_passes"] >= 1 and _finite(step["pass_mean_s"])
    assert _finite(step["scrape_s"]) and step["scrape_series"] > NODES
    assert _finite(step["list_nodes_s"])
    assert step["written_kb_per_frame"] is None or step["written_kb_per_frame"] >= 0
    assert step["gc_cores"] >= 0 and step["gc_longest_pause_s"] > 0  # the controller's collector, timed
    assert document["machine"]["frame_bytes"] > 8_000  # 8 GPUs, the host, the BMC now and then


def test_reconnect_storm_recovers_every_node(document: dict[str, Any]) -> None:
    storm = document["storm"]
    assert storm["nodes"] == storm["recovered"] == NODES
    assert _finite(storm["since_storm_p99_s"]) and _finite(storm["reconnect_p99_s"])
    # Every stream was dropped: every node came back on a new one, none kept its stream.
    assert storm["moved_p99_s"] == storm["since_storm_p99_s"] and storm["kept_p99_s"] is None
    assert storm["first_ack_p50_s"] <= storm["first_ack_p99_s"]
    assert 0 <= storm["answer_p50_s"] <= storm["answer_p99_s"] <= storm["reconnect_p99_s"]
    # Which side limited it: the controller's CPU per node reconnected, and each side's cores.
    assert storm["controller_ms_per_node"] > 0 and storm["controller_cores"] > 0
    assert storm["generator_cores"] > 0
    # Its event-loop thread apart: part of the controller's CPU, and at most one core.
    assert 0 < storm["loop_ms_per_node"] < storm["controller_ms_per_node"]
    assert 0 < storm["loop_cores"] < min(storm["controller_cores"], 1.1)
    # Its collector's seconds in the storm (its /metrics), a share of that thread's CPU.
    looped = storm["loop_ms_per_node"] * NODES / 1e3
    assert storm["gc_seconds"] >= 0 and storm["gc_loop_share"] == pytest.approx(storm["gc_seconds"] / looped)
    # The controller raised its soft open-file limit to the hard one it inherited; none ran out.
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    assert list(storm["open_files_limit"]) == [hard, hard] and storm["out_of_files"] == 0


def test_transport_floor_is_the_same_load_on_a_bare_server(document: dict[str, Any]) -> None:
    floor, [step] = document["floor"], document["steps"]
    assert floor["nodes"] == floor["connected"] == NODES
    assert floor["frames_acked"] > 0.5 * floor["frames_due"], floor
    assert floor["errors"] == 0 and floor["commands"] == 0
    assert _finite(floor["ack_p99_s"]) and floor["cpu_cores"] > 0
    # It only acks: less CPU per frame than the controller, which stores, checks and detects too.
    assert 0 < floor["cpu_ms_per_frame"] < step["cpu_ms_per_frame"]
    assert 0 < floor["loop_ms_per_frame"] < floor["cpu_ms_per_frame"], floor  # gRPC's threads beside it
    # The same storm against it (with the controller's listeners): every node back.
    storm = floor["storm"]
    assert storm["nodes"] == storm["recovered"] == NODES and _finite(storm["since_storm_p99_s"])
    assert storm["gc_seconds"] is None  # it has no /metrics
    assert document["settings"]["listeners"] == ControllerConfig().listeners


def test_report_has_verdicts_text_and_json(document: dict[str, Any]) -> None:
    verdicts = {v["target"]: v["verdict"] for v in document["verdicts"]}
    assert len(verdicts) == 8
    assert set(verdicts.values()) <= {"within", "over", "not measured", "not reached"}
    assert verdicts[report.P99_AT_2000_NEIGHBOUR] == "not measured"  # with --disk-writer
    assert document["growth"]["cpu_cores_per_1000_nodes"] is None  # one step: no slope
    text = report.text(document)
    assert "ms/frame" in text and "ListNodes s" in text and "verdicts:" in text
    assert "reconnect storm at 50 nodes" in text and "ms of CPU per node reconnected" in text
    assert "for the controller to accept its Hello" in text
    assert re.search(r"one core at most\), garbage collection \d+\.\d\d s of it \(\d+%\)", text), text
    assert "garbage collection" in text
    assert "transport floor at 50 nodes" in text and "the controller's own work above it" in text
    loop = re.search(r"event loop's thread: the bare server (\S+) ms per frame, the controller (\S+)", text)
    assert loop is not None and all(float(x) > 0 for x in loop.groups()), text
    assert "reconnect storm at 50 nodes against the bare server" in text
    looped = re.findall(r"of which on (the controller|the bare server)'s event-loop thread (\S+) cores", text)
    assert [who for who, _ in looped] == ["the controller", "the bare server"], text
    assert all(0 < float(cores) <= 1.1 for _, cores in looped), text
    assert "for the bare server to accept its Hello" in text
    assert "open files: the controller's soft limit" in text and "it did not run out" in text
    assert "another process wrote to the store's disk meanwhile" in text
    json.dumps(document, allow_nan=False)


def test_the_disk_writer_wrote_beside_the_store_and_cleaned_up(document: dict[str, Any]) -> None:
    neighbour = document["disk_writer"]
    assert "error" not in neighbour, neighbour
    assert neighbour["mb_per_s_asked"] == 5 and neighbour["mb_written"] > 5
    assert 0 < neighbour["mb_per_s"] <= 5 * 1.5  # spread to the rate asked
    assert neighbour["syncs"] >= 1 and 0 <= neighbour["sync_p50_s"] <= neighbour["sync_p99_s"]


def test_a_disk_writer_at_full_speed_and_its_file_removed(tmp_path: Path) -> None:
    writer = DiskWriter(tmp_path, 0)
    path = writer.path
    deadline = time.monotonic() + 30
    while (not path.exists() or path.stat().st_size < 16 << 20) and time.monotonic() < deadline:
        time.sleep(0.05)
    figures = writer.stop()
    assert figures["mb_written"] >= 16 and figures["syncs"] >= 2, figures
    assert not path.exists()
    assert "as fast as the disk took" in "\n".join(disk_writer.line(figures))
    with pytest.raises(ValueError, match=">= 0 MB/s"):
        DiskWriter(tmp_path, -1)


def test_no_process_is_left_behind(document: dict[str, Any]) -> None:
    assert document["steps"]
    # multiprocessing's resource tracker (started by spawn) lives as long as this process, and so
    # does the session's PostgreSQL server when an earlier test started it: not the bench's.
    left = [
        p
        for p in psutil.Process().children(recursive=True)
        if "resource_tracker" not in " ".join(p.cmdline()) and p.name() != "postgres"
    ]
    assert left == []


def test_the_main_thread_is_timed_apart_from_the_others() -> None:
    """target.main_thread_seconds reads the thread whose id is the pid: this test's own, busy here
    while another thread spins longer."""

    def spin(seconds: float) -> None:
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    other = threading.Thread(target=spin, args=(0.6,))
    me = psutil.Process()
    before, whole = target.main_thread_seconds(me), sum(me.cpu_times()[:2])
    other.start()
    spin(0.2)
    other.join()
    mine, all_of_it = target.main_thread_seconds(me) - before, sum(me.cpu_times()[:2]) - whole
    assert 0.15 < mine < 0.5 and all_of_it > mine + 0.4, (mine, all_of_it)


def test_bad_steps_are_refused() -> None:
    with pytest.raises(SystemExit):
        controller_scale.parse_args(["--steps", "2000,1000"])


def test_postgresql_store(
    postgres_server: PostgresServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = postgres_server.new_database()
    args = controller_scale.parse_args([*STEP, "--db", url])
    document = controller_scale.run(args, tmp_path)
    [step] = document["steps"]
    assert step["connected"] == NODES and step["frames_acked"] > 0.5 * step["frames_due"], step
    assert step["errors"] == 0
    assert step["db_kb_per_frame"] > 0  # the server's WAL grew with the frames
    assert document["store"] == {"backend": "postgresql", "db": url.replace(postgres_server.password, "***")}
    [storage] = [v for v in document["verdicts"] if v["target"].startswith("written to storage")]
    assert storage["value"] == step["db_kb_per_frame"] and "WAL" in storage["note"]
    text = report.text(document)
    assert "store: PostgreSQL postgresql://" in text and "WAL bytes of the server" in text
    printed = capsys.readouterr()
    for output in (text, json.dumps(document), printed.out, printed.err):
        assert postgres_server.password not in output
    assert postgres_server.password not in (tmp_path / "controller.log").read_text()


def test_db_must_be_a_postgresql_url(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        controller_scale.parse_args(["--db", "sqlite:///tmp/x.db"])
    with pytest.raises(SystemExit):
        controller_scale.parse_args(["--db", "postgresql://u:secret@127.0.0.1:5432/"])  # no database
    err = capsys.readouterr().err
    assert "postgresql://u:***@127.0.0.1:5432/" in err and "secret" not in err


def test_with_ingest_fronts_each_process_is_counted_and_operators_use_their_port(tmp_path: Path) -> None:
    """Two fronts and two detection processes: every process's CPU is counted, once."""
    args = controller_scale.parse_args([*STEP, "--ingest-fronts", "2", "--detect-processes", "2"])
    document = controller_scale.run(args, tmp_path)
    [step] = document["steps"]
    assert step["nodes"] == step["connected"] == step["list_nodes_count"] == NODES  # operator port
    assert step["errors"] == 0 and step["frames_acked"] > 0.5 * step["frames_due"], step
    parts = [step[f"{part}_ms_per_frame"] for part in ("main", "detection", "fronts")]
    assert all(part > 0 for part in parts), parts
    assert sum(parts) == pytest.approx(step["cpu_ms_per_frame"], rel=1e-6)  # every process once
    assert document["settings"]["ingest_fronts"] == 2 and document["settings"]["detect_processes"] == 2
    assert yaml.safe_load((tmp_path / "controller.yaml").read_text())["detect"]["processes"] == 2


def test_with_replicas_the_standbys_ingest_and_the_leader_lists_every_node(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    """Two replicas (replica_ingest) on a PostgreSQL store, one worker's streams to each: the
    standby's CPU is counted on its own, and the leader lists the whole fleet. Then the failover:
    the leader killed, every node comes back to the standby, which leads."""
    url = postgres_server.new_database()
    replicas = ["--workers", "2", "--replicas", "2", "--failover"]
    args = controller_scale.parse_args([*STEP, *replicas, "--db", url])
    document = controller_scale.run(args, tmp_path)
    [step] = document["steps"]
    assert step["connected"] == NODES and step["frames_acked"] > 0.5 * step["frames_due"], step
    assert step["errors"] == 0 and step["list_nodes_count"] == NODES
    assert step["replicas_ms_per_frame"] > 0 and step["main_ms_per_frame"] > 0
    # The leader ingested only its own worker's streams: about half of the frames.
    assert 0 < step["controller_frames_per_second"] < 0.8 * step["frames_per_second"], step
    assert "standby: ingesting" in (tmp_path / "standby1.log").read_text()
    assert document["settings"]["replicas"] == 2
    failover = document["failover"]
    # Every node had a frame acked after the kill: the killed leader's on new streams to the standby,
    # the standby's own on the streams it kept through the lead.
    assert failover["nodes"] == failover["recovered"] == NODES, failover
    assert sorted((w["leader"], w["back"]) for w in failover["by_worker"]) == [(False, 25), (True, 25)]
    assert 0 <= failover["lead_s"] <= failover["listening_s"] and failover["since_storm_p99_s"] > 0, failover
    carried = re.search(r"(\d+) agents stream on through the lead", (tmp_path / "standby1.log").read_text())
    assert carried is not None and int(carried[1]) >= NODES // 2
    assert _finite(failover["caught_up_s"]) and _finite(failover["reconnect_p99_s"])
    assert failover["listening_s"] <= failover["detecting_s"]  # it leads while the copy is made
    assert failover["heir_cores"] > 0 and failover["generator_cores"] > 0
    # The halves timed apart: the leader's agents from the kill, the kept streams' next frames from
    # their send (each waited for its slot, up to --interval, after the kill).
    assert _finite(failover["moved_p99_s"]) and _finite(failover["kept_p99_s"]), failover
    assert failover["moved_p50_s"] <= failover["since_storm_p99_s"]
    [verdict] = [v for v in document["verdicts"] if v["target"].startswith("failover:")]
    latest = max(failover["listening_s"], failover["moved_p99_s"], failover["kept_p99_s"])
    assert verdict["value"] == latest and verdict["verdict"] == "within"
    text = report.text(document)
    assert "failover at 50 nodes (the leader killed" in text and "listening as leader" in text
    assert "came back on new streams (the leader's agents)" in text
    assert f"{NODES} nodes: " in text and "the leader counted" in text  # its own streams' frames alone
    left = [p for p in psutil.Process().children(recursive=True) if "controller" in " ".join(p.cmdline())]
    assert left == []  # the standby stopped too


def test_replicas_need_as_many_workers() -> None:
    with pytest.raises(SystemExit):
        controller_scale.parse_args(["--replicas", "3", "--workers", "2"])


@pytest.mark.parametrize(
    "settings",
    [
        ["--failover"],
        ["--failover", "--replicas", "3", "--workers", "3"],
        ["--failover", "--replicas", "2", "--workers", "2", "--shared-connection"],
    ],
)
def test_a_failover_needs_two_replicas_on_connections_of_their_own(settings: list[str]) -> None:
    with pytest.raises(SystemExit):
        controller_scale.parse_args(settings)
    assert controller_scale.parse_args(["--failover", "--replicas", "2", "--workers", "2"]).failover


def test_the_takeover_is_timed_from_the_heirs_log_lines_after_the_kill(tmp_path: Path) -> None:
    log = tmp_path / "standby1.log"
    log.write_text(
        "2026-11-30 07:00:00,000 INFO gpufleet.controller: leading the store x: term 1\n"  # before
        "2026-11-30 07:00:10,250 INFO gpufleet.controller: leading the store x: term 2\n"
        "Traceback (most recent call last):\n"
        "2026-11-30 07:00:11,500 INFO gpufleet.controller.replicas: caught up: took in 3 nodes\n"
        "2026-11-30 07:00:12,000 INFO gpufleet.controller: controller listening on 127.0.0.1:1\n"
        "2026-11-30 07:00:13,000 INFO gpufleet.controller: controller listening on 127.0.0.1:2\n"
    )
    killed = datetime(2026, 11, 30, 7, 0, 10).timestamp()
    times = storms.takeover_times(log, killed)
    assert times.pop("detecting_s") is None  # not logged yet
    assert times == pytest.approx({"lead_s": 0.25, "caught_up_s": 1.5, "listening_s": 2.0})
    assert storms.takeover_times(log, killed + 60) == dict.fromkeys([*times, "detecting_s"])


def test_a_takeover_lasts_until_the_moved_nodes_are_back_and_the_kept_streams_served() -> None:
    """A kept stream's next frame waits for its slot after the kill (up to --interval): its ack
    counts from its send. Reports from before the halves were told apart: every node from the kill."""
    figures = {"listening_s": 5.0, "since_storm_p99_s": 55.0, "moved_p99_s": 12.0, "kept_p99_s": 0.3}
    assert report.takeover_seconds(figures) == 12.0
    assert report.takeover_seconds({**figures, "kept_p99_s": 20.0}) == 20.0
    assert report.takeover_seconds({**figures, "kept_p99_s": None}) == 12.0  # (no stream was kept)
    assert report.takeover_seconds({**figures, "moved_p99_s": None}) is None  # one never came back
    assert report.takeover_seconds({**figures, "listening_s": None}) is None
    assert report.takeover_seconds({"listening_s": 5.0, "since_storm_p99_s": 55.0}) == 55.0


def test_the_storm_counts_the_times_grpc_found_no_file_to_accept_with(tmp_path: Path) -> None:
    log = tmp_path / "controller.log"
    assert storms.out_of_files_lines(log) == 0 and storms.out_of_files_lines(None) == 0
    limit = "posix_engine_listener.cc:164] File descriptor limit reached. Retrying."
    log.write_text(
        f"E1202 18:18:38.300089    8300 {limit}\nINFO agent connected\n" + f"E1202 18:18:39.3 {limit}\n" * 2
    )
    assert storms.out_of_files_lines(log) == 3
    line = report.open_files_line({"out_of_files": 3, "open_files_limit": [20000, 20000]}, "the controller")
    assert line == (
        "  open files: the controller's soft limit 20000 (hard 20000); it ran out of them 3 times "
        "(gRPC: 'File descriptor limit reached')"
    )
