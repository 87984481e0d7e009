"""Session fixtures: the throw-away Slurm cluster (scripts/slurm-cluster.sh) and its site profile."""
import os
from pathlib import Path
from typing import Iterator

import pytest

import slurm
from prerequisites import require


def pytest_collection_modifyitems(config, items) -> None:
    """Every test that uses the cluster carries the `slurm` marker (`-m "not slurm"` deselects them).
    Tests marked `apptainer` run only when `-m` names them: Apptainer cannot be installed here."""
    for item in items:
        if "slurm_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slurm)
    if "apptainer" not in (config.option.markexpr or ""):
        deselected = [item for item in items if item.get_closest_marker("apptainer")]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = [item for item in items if not item.get_closest_marker("apptainer")]


@pytest.fixture(autouse=True)
def results_db(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test's own results database ($DLAUNCH_RESULTS_DB, inherited by the dlaunch and Slurm
    processes it starts), outside its tmp_path: runs a test ends never reach the working directory's
    runs/results.sqlite, and tests that look at their tmp_path see only their own files."""
    path = tmp_path_factory.mktemp("results-db") / "results.sqlite"
    monkeypatch.setenv("DLAUNCH_RESULTS_DB", str(path))
    return path


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[slurm.Cluster]:
    """A 2-node cluster with a second network started once per session, each node on a core of its own (as the nodes
    of a real cluster do not share cores: a per-node speed says something), or the one $SLURM_CONF names (left running)."""
    missing = slurm.missing_prerequisite()
    require(missing is None, missing or "")
    given = os.environ.get("SLURM_CONF")
    if given:
        yield slurm.cluster_at(Path(given), owned_dir=None)
        return
    slurm.stop_cluster(slurm.SESSION_DIR)  # what a crashed session left behind
    yield slurm.start_cluster(slurm.SESSION_DIR, slurm.SESSION_NODES, slurm.SESSION_SECOND_NETWORK, pin_cores=True)
    slurm.stop_cluster(slurm.SESSION_DIR)


@pytest.fixture(scope="session")
def slurm_site(slurm_cluster: slurm.Cluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A launcher site profile (TOML) for the session's cluster."""
    return slurm_cluster.site_profile(tmp_path_factory.mktemp("sites") / "slurm-test.toml")


@pytest.fixture
def two_nodes(slurm_cluster: slurm.Cluster) -> slurm.Cluster:
    """The session's cluster, for tests that need two nodes."""
    if slurm_cluster.nodes < 2:
        pytest.skip("the cluster given by $SLURM_CONF has %d node(s); these tests need 2" % slurm_cluster.nodes)
    return slurm_cluster
