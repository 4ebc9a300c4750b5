"""The chart's controller config (accepted by the controller's own loader) and its store: the SQLite
file on a claim the chart keeps, or PostgreSQL through a Secret, the password nowhere else.
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml

from controller import config as controller_config
from controller.cli.run_controller import DB_ENV
from tests.deploy.chart import (
    DB_URL,
    FULLNAME,
    PASSWORD,
    RECORD_ON_VOLUME,
    ROLLING_UPDATE,
    TLS_SECRETS,
    VALUE_SETS,
    Doc,
    config_file,
    controller_env,
    controller_pod,
    install_notes,
    mount_of,
    one,
    render,
    rendered,
)

# The controller's config


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_the_controllers_config_loads_with_the_controllers_own_loader(value_set: str, tmp_path: Path) -> None:
    docs = rendered(value_set)
    loaded = controller_config.load(config_file(docs, "controller", tmp_path))
    deployment = one(docs, "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert loaded.listen == f"0.0.0.0:{ports['grpc']}"
    assert loaded.metrics_address == f"0.0.0.0:{ports['metrics']}"
    env = {e["name"]: e for e in container.get("env", [])}
    if DB_ENV in env:  # PostgreSQL: the file has no db; `gpufleet controller` takes $GPUFLEET_DB
        assert "db" not in yaml.safe_load(config_file(docs, "controller", tmp_path).read_text())
        url = secret_value(docs, env[DB_ENV]["valueFrom"]["secretKeyRef"])
        assert controller_config.load(config_file(docs, "controller", tmp_path), {"db": url}).db == url
        assert deployment["spec"]["strategy"] == ROLLING_UPDATE
    else:
        data = next(m for m in container["volumeMounts"] if m["name"] == "data")
        assert Path(loaded.db).parent == Path(data["mountPath"])
        assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    if value_set == "tuning":
        assert loaded.tuning.mode("power_cap") == "auto"
    if value_set == "drain":
        assert loaded.kubernetes.taint_unhealthy and loaded.kubernetes.mode("nvlink_down") == "auto"
    if value_set == "fronts":
        assert loaded.ingest_fronts == 2 and loaded.operator_listen == f"0.0.0.0:{ports['operators']}"
    else:
        assert loaded.ingest_fronts == 0 and "operators" not in ports
    assert loaded.replica_ingest == (value_set == "replica-ingest")


def test_the_sqlite_file_is_on_a_claim_the_chart_keeps() -> None:
    docs = rendered("default")
    claim = one(docs, "PersistentVolumeClaim")
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    volumes = one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    data = next(v for v in volumes if v["name"] == "data")
    assert data["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    bmc = rendered("bmc")  # an existing claim: none created
    assert not [d for d in bmc if d["kind"] == "PersistentVolumeClaim"]


# The controller's store: the SQLite file on its volume, or PostgreSQL through a Secret


def secret_value(docs: list[Doc], ref: Doc) -> str:
    """The value a secretKeyRef names, from a Secret the chart rendered."""
    secret = one(docs, "Secret", ref["name"])
    if ref["key"] in secret.get("stringData", {}):
        return str(secret["stringData"][ref["key"]])
    return base64.b64decode(secret["data"][ref["key"]]).decode()


def data_volume(docs: list[Doc]) -> Doc:
    volume: Doc = next(v for v in controller_pod(docs)["volumes"] if v["name"] == "data")
    return volume


def assert_no_password_outside_secrets(docs: list[Doc]) -> None:
    """Nothing but a Secret holds the password, plain or base64: no ConfigMap, no container's
    arguments, command or environment, no annotation."""
    secrets = (PASSWORD, base64.b64encode(DB_URL.encode()).decode())
    for doc in docs:
        if doc["kind"] != "Secret":
            text = yaml.safe_dump(doc)
            assert not [s for s in secrets if s in text], f"{doc['kind']} {doc['metadata']['name']}"
    for configmap in (d for d in docs if d["kind"] == "ConfigMap"):
        assert "postgres" not in yaml.safe_dump(configmap["data"])
    for container in controller_pod(docs)["containers"]:
        assert not [a for a in container.get("args", []) + container["command"] if "postgres" in a]


def test_by_default_the_store_is_the_sqlite_file_on_the_controllers_claim(tmp_path: Path) -> None:
    docs = rendered("default")
    assert DB_ENV not in controller_env(docs)
    assert not [d for d in docs if d["kind"] == "Secret"]
    loaded = controller_config.load(config_file(docs, "controller", tmp_path))
    assert loaded.db == "/var/lib/gpufleet/gpufleet.db"
    mount = mount_of(controller_pod(docs)["containers"][0], loaded.db)
    assert mount["name"] == "data" and not mount.get("readOnly")
    claim = one(docs, "PersistentVolumeClaim")["metadata"]["name"]
    assert data_volume(docs)["persistentVolumeClaim"]["claimName"] == claim
    assert "checksum/db-secret" not in one(docs, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    notes = install_notes(*TLS_SECRETS)
    assert (
        f"store: SQLite, /var/lib/gpufleet/gpufleet.db on its volume (PersistentVolumeClaim {claim})" in notes
    )


def test_postgresql_url_reaches_the_controller_only_through_the_secret_the_chart_makes(
    tmp_path: Path,
) -> None:
    docs = render(*TLS_SECRETS, "--set", f"postgresql.url={DB_URL}")
    secret = one(docs, "Secret")
    assert secret["metadata"]["name"] == f"{FULLNAME}-controller-db" and secret["type"] == "Opaque"
    ref = controller_env(docs)[DB_ENV]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": f"{FULLNAME}-controller-db", "key": "url"}
    assert secret_value(docs, ref) == DB_URL
    # The file has no db: the variable gives it, as `gpufleet controller` reads it (beats the file).
    path = config_file(docs, "controller", tmp_path)
    assert "db" not in yaml.safe_load(path.read_text())
    assert controller_config.load(path, {"db": secret_value(docs, ref)}).db == DB_URL
    assert_no_password_outside_secrets(docs)
    # A changed URL restarts the controller (its environment is read at start).
    annotations = one(docs, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    changed = render(*TLS_SECRETS, "--set", f"postgresql.url={DB_URL}x")
    assert (
        annotations["checksum/db-secret"]
        != one(changed, "Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/db-secret"]
    )
    # No claim for the database: the volume is scratch for anything controller.config puts there.
    assert not [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    assert data_volume(docs) == {"name": "data", "emptyDir": {}}
    notes = install_notes(*TLS_SECRETS, "--set", f"postgresql.url={DB_URL}")
    assert f"store: PostgreSQL (from Secret {FULLNAME}-controller-db, key url, as GPUFLEET_DB)" in notes
    assert PASSWORD not in notes


def test_postgresql_from_an_existing_secret_renders_no_secret(tmp_path: Path) -> None:
    args = [*TLS_SECRETS, "--set", "postgresql.existingSecret=gpufleet-db,postgresql.secretKey=dsn"]
    for extra in ([], ["--set", f"postgresql.url={DB_URL}"]):  # existingSecret beats url
        docs = render(*args, *extra)
        assert not [d for d in docs if d["kind"] == "Secret"]
        assert controller_env(docs)[DB_ENV]["valueFrom"] == {
            "secretKeyRef": {"name": "gpufleet-db", "key": "dsn"}
        }
        assert "db" not in yaml.safe_load(config_file(docs, "controller", tmp_path).read_text())
        assert not [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
        annotations = one(docs, "Deployment")["spec"]["template"]["metadata"]["annotations"]
        assert "checksum/db-secret" not in annotations
        assert_no_password_outside_secrets(docs)
        notes = install_notes(*args, *extra)
        assert "store: PostgreSQL (from Secret gpufleet-db, key dsn, as GPUFLEET_DB)" in notes
        assert ("postgresql.url is ignored" in notes) == bool(extra) and PASSWORD not in notes


@pytest.mark.parametrize(
    ("values", "claim"),
    [
        (["--set", RECORD_ON_VOLUME], f"{FULLNAME}-controller"),
        (
            ["--set", f"{RECORD_ON_VOLUME},controller.persistence.existingClaim=gpufleet-record"],
            "gpufleet-record",
        ),
        (["--set", "controller.config.record=/tmp/frames.jsonl"], None),
        (["--set", "controller.persistence.existingClaim=gpufleet-db"], None),
        (["--set", f"{RECORD_ON_VOLUME},controller.persistence.enabled=false"], None),
    ],
    ids=[
        "record-on-the-volume",
        "record-on-an-existing-claim",
        "record-elsewhere",
        "claim-unused",
        "no-persistence",
    ],
)
def test_with_postgresql_a_claim_holds_only_a_record_file(
    values: list[str], claim: str | None, tmp_path: Path
) -> None:
    docs = render(*TLS_SECRETS, "--set", f"postgresql.url={DB_URL}", *values)
    made = [d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"]
    assert made == ([claim] if claim == f"{FULLNAME}-controller" else [])
    volume = data_volume(docs)
    assert volume.get("persistentVolumeClaim", {}).get("claimName") == claim
    assert ("emptyDir" in volume) == (claim is None)
    loaded = controller_config.load(config_file(docs, "controller", tmp_path), {"db": DB_URL})
    if loaded.record:  # wherever it is, it is writable
        assert not mount_of(controller_pod(docs)["containers"][0], loaded.record).get("readOnly")
