"""Session fixtures: the throw-away Slurm cluster (scripts/slurm-cluster.sh) and its site profile, the cpu images."""
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, Iterator

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


@pytest.fixture(scope="session", autouse=True)
def build_caches() -> Iterator[None]:
    """One stable $TORCH_EXTENSIONS_DIR and $TORCHINDUCTOR_CACHE_DIR for every process the tests start (local runs,
    Slurm jobs, tests/test_frameworks.py's), kept between sessions: DeepSpeed compiles its CPU communication op in the
    first (about 1.5 min), so a fresh machine compiles it once, not once more for the runs that had torch's default
    cache; inductor's code for a `--compile` run is generated once per machine (the compiled bare loop: 47 s cold,
    8 s warm)."""
    cache = Path.home() / ".cache" / "dlaunch"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCH_EXTENSIONS_DIR", os.environ.get("TORCH_EXTENSIONS_DIR", str(cache / "torch_extensions")))
        patch.setenv("TORCHINDUCTOR_CACHE_DIR", os.environ.get("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor")))
        yield


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


@pytest.fixture(scope="session")
def cpu_image(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """`cpu_image(framework)`: the cpu stack's image of `framework`, built from containers/cpu/<framework>.def by
    scripts/build-rootfs.py (or reused from its cache, which copies %files again and reruns %test: seconds) once per
    session, whichever module asks first, as the link cpu-<framework>-<arch> in one folder (a DLAUNCH_IMAGES_DIR)."""
    require(os.geteuid() == 0, "building a root file system needs root (mmdebstrap --mode=root, chroot)")
    require(shutil.which("mmdebstrap") is not None and shutil.which("ch-run") is not None,
            "mmdebstrap or ch-run is not installed (scripts/bootstrap-containers.sh)")
    repo = Path(__file__).resolve().parent.parent
    folder = tmp_path_factory.mktemp("images")
    revision = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    built: Dict[str, Path] = {}

    def image(framework: str) -> Path:
        if framework not in built:
            link = folder / ("cpu-%s-%s" % (framework, platform.machine()))
            ran = subprocess.run([sys.executable, str(repo / "scripts" / "build-rootfs.py"),
                                  str(repo / "containers" / "cpu" / ("%s.def" % framework)),
                                  "--build-arg", "GIT_REVISION=%s" % revision, "--output", str(link)],
                                 cwd=repo, capture_output=True, text=True, timeout=3000)
            assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-5000:]
            built[framework] = link
        return built[framework]

    return image
