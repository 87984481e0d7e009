"""`dlaunch doctor`: real interfaces, name resolution, Charliecloud-style image trees and exit codes on this machine.

Sites are written as schema-v2 TOML files and read by dlaunch.jobs.sites.load_site (tests marked `needs_v2`
skip until the lead's "backends:" commit makes load_site accept them). Fakes, named as such: an aarch64 ELF
header and a SIF header (no aarch64 binary and no apptainer here).
"""
import json
import os
import platform
import shutil
import socket
from pathlib import Path

import pytest

from dlaunch import cli, preflight
from dlaunch.runtimes import imagearch
from dlaunch.runtimes.apptainer import Apptainer
from dlaunch.runtimes.charliecloud import Charliecloud
from dlaunch.schedulers import scheduler_for
from dlaunch.jobs.sites import Site, load_site

needs_v2 = pytest.mark.skipif("arch" not in Site.model_fields, reason="site schema v2 (lead's 'backends:' commit) not landed")
HOST_SH = Path("/bin/sh").resolve()
# The ELF identification and header up to e_machine: 64-bit, little-endian, ET_EXEC, EM_AARCH64 (183).
FAKE_AARCH64_ELF = b"\x7fELF\x02\x01\x01" + b"\0" * 9 + (2).to_bytes(2, "little") + (183).to_bytes(2, "little") + b"\0" * 44
NOT_A_HOST = "nosuchhost-dlaunch.invalid"  # RFC 6761: .invalid never resolves


def write_site(tmp_path: Path, scheduler: str = "local", container: str = "none", env=None, stack: str = "current",
               **top) -> Path:
    """A schema-v2 profile; `top` adds top-level keys (arch, driver, gpu_vendor, rendezvous_host_suffix)."""
    fields = {"name": "doctor-test", "description": "doctor test site", "based_on": ["unverified"], "gpus_per_node": 1,
              "cores_per_node": 2, "gpu_vendor": "none", **top}
    lines = ["%s = %s" % (k, json.dumps(v)) for k, v in fields.items()]
    lines += ["[scheduler]", "kind = %s" % json.dumps(scheduler)]
    if scheduler != "local":
        lines += ["[[scheduler.partitions]]", 'name = "debug"', "max_nodes = 2", 'max_time = "01:00:00"', "default = true"]
    lines += ["[container]", "kind = %s" % json.dumps(container)] + (['stack = "%s"' % stack] if container != "none" else [])
    lines += ["[env]"] + ["%s = %s" % (k, json.dumps(v)) for k, v in (env or {}).items()]
    path = tmp_path / "doctor-test.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def charliecloud_tree(root: Path, sh_bytes: bytes = b"", absolute_link: bool = False) -> Path:
    """An unpacked image tree laid out like Debian's (merged /usr, /bin/sh -> dash); dash is the host's
    real one unless `sh_bytes` replaces it."""
    (root / "usr" / "bin").mkdir(parents=True)
    dash = root / "usr" / "bin" / "dash"
    if sh_bytes:
        dash.write_bytes(sh_bytes)
    else:
        shutil.copy(HOST_SH, dash)
    (root / "bin").symlink_to("usr/bin")
    (root / "usr" / "bin" / "sh").symlink_to("/usr/bin/dash" if absolute_link else "dash")
    return root


@pytest.fixture
def outside_allocation(monkeypatch):
    for name in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "PBS_NODEFILE"):
        monkeypatch.delenv(name, raising=False)


def run_doctor(monkeypatch, *args: str) -> int:
    """`dlaunch doctor ...` through the real CLI, on a console wide enough that no cell wraps."""
    monkeypatch.setattr(cli.out, "width", 200)
    return cli.main(["doctor", *args])


# NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME syntax


@pytest.mark.parametrize("spec, selected", [
    ("eth", ["eth0", "eth1"]),          # prefixes
    ("eth,ib", ["eth0", "eth1", "ib0"]),
    ("=eth0", ["eth0"]),                # exact names
    ("=eth", []),
    ("^eth", ["ib0", "lo"]),            # every interface but these prefixes
    ("^=eth0", ["eth1", "ib0", "lo"]),  # every interface but these exact names
])
def test_nccl_interface_syntax(spec, selected):
    assert preflight.matching_interfaces(spec, ["eth0", "eth1", "ib0", "lo"], "NCCL_SOCKET_IFNAME") == selected


def test_gloo_names_are_exact():
    assert preflight.matching_interfaces("eth", ["eth0", "lo"], "GLOO_SOCKET_IFNAME") == []
    assert preflight.matching_interfaces("lo,eth0", ["eth0", "lo"], "GLOO_SOCKET_IFNAME") == ["lo", "eth0"]


def test_interface_addresses_of_this_machine():
    found = preflight.interface_addresses()
    assert "127.0.0.1" in found["lo"]
    assert "nosuchif0" not in found


# Image architecture


def test_charliecloud_tree_of_the_host_shell_is_the_host_architecture(tmp_path):
    tree = charliecloud_tree(tmp_path / "img")
    assert imagearch.resolve_in_root(tree, "/bin/sh") == tree / "usr" / "bin" / "dash"
    assert imagearch.elf_machine(imagearch.resolve_in_root(tree, "/bin/sh")) == platform.machine()


def test_absolute_links_resolve_inside_the_image_not_on_the_host(tmp_path):
    """Fake aarch64 ELF header: an absolute /usr/bin/dash link must read the image's dash, not the host's."""
    tree = charliecloud_tree(tmp_path / "img", sh_bytes=FAKE_AARCH64_ELF, absolute_link=True)
    assert preflight.image_arch(Charliecloud(kind="charliecloud"), str(tree)) == "aarch64"


def test_a_link_cycle_in_the_image_is_an_error_not_a_hang(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "sh").symlink_to("sh")
    with pytest.raises(OSError, match="too many symbolic links"):
        imagearch.resolve_in_root(tmp_path, "/bin/sh")


def test_sif_header_architecture(tmp_path):
    """Fake SIF image: only the global header (launch line, magic, version "01", arch "04" = aarch64)."""
    image = tmp_path / "fake.sif"
    image.write_bytes(b"#!/usr/bin/env run-singularity\n".ljust(32, b"\0") + b"SIF_MAGIC\0" + b"01\0" + b"04\0" + b"\0" * 64)
    assert imagearch.sif_arch(image) == "aarch64"
    assert preflight.image_arch(Apptainer(kind="apptainer"), str(image)) == "aarch64"
    with pytest.raises(ValueError, match="not a SIF image"):
        imagearch.sif_arch(Path(shutil.which("python3")))


def test_an_apptainer_sandbox_directory_reads_as_a_root_file_system(tmp_path):
    """Fake aarch64 /bin/sh in a sandbox directory (`apptainer build --sandbox`); a squashfs file reads as unknown."""
    tree = charliecloud_tree(tmp_path / "sandbox", sh_bytes=FAKE_AARCH64_ELF)
    assert preflight.image_arch(Apptainer(kind="apptainer"), str(tree)) == "aarch64"
    (tmp_path / "image.sqsh").write_bytes(b"hsqs")
    assert preflight.image_arch(Apptainer(kind="apptainer"), str(tmp_path / "image.sqsh")) is None


@needs_v2
def test_charliecloud_image_of_another_architecture_fails_with_the_fix(tmp_path):
    """Real x86_64 tree passes on an x86_64 site; a fake aarch64 one fails, naming the site's architecture."""
    site = load_site(write_site(tmp_path, "slurm", "charliecloud", arch="x86_64"))
    real = charliecloud_tree(tmp_path / "real")
    assert [c.result for c in preflight.check_image(site, str(real), "ddp")] == ["pass", "pass"]
    fake = charliecloud_tree(tmp_path / "fake", sh_bytes=FAKE_AARCH64_ELF)
    present, arch = preflight.check_image(site, str(fake), "ddp")
    assert present.result == "pass" and arch.result == "fail"
    assert "aarch64 image on x86_64 nodes" in arch.found and "x86_64" in arch.fix
    missing = preflight.check_image(site, str(tmp_path / "absent"), "ddp")
    assert [c.result for c in missing] == ["fail"] and "does not exist" in missing[0].found


# Scheduler, runtime, rendezvous, interfaces, driver


@needs_v2
def test_scheduler_commands_are_looked_up_on_path(tmp_path):
    slurm = preflight.check_scheduler_commands(load_site(write_site(tmp_path, "slurm")))
    assert slurm.result == ("pass" if all(shutil.which(c) for c in scheduler_for("slurm").commands) else "fail")
    if shutil.which("qsub") is None:  # no PBS here: the check must say so
        pbs = preflight.check_scheduler_commands(load_site(write_site(tmp_path, "pbs")))
        assert pbs.result == "fail" and "qsub" in pbs.found
        assert preflight.check_submission(load_site(write_site(tmp_path, "pbs")), "x", None, None, None).result == "skip"


@needs_v2
def test_charliecloud_runtime_missing_names_the_binary(tmp_path):
    site = load_site(write_site(tmp_path, "slurm", "charliecloud"))
    check = preflight.check_runtime(site)
    if shutil.which("ch-run"):
        assert check.result == "pass"
    else:
        assert check.result == "fail" and "ch-run" in check.found


@needs_v2
def test_rendezvous_name_resolves_to_this_first_node(tmp_path):
    site = load_site(write_site(tmp_path, "slurm"))
    first = preflight.Node(("localhost",), on_node=True, first=True)
    check = preflight.check_rendezvous(site, first)
    assert check.result == "pass" and "127.0.0.1" in check.found and "lo" in check.found
    other = preflight.Node(("localhost", socket.gethostname()), on_node=True, first=False)
    assert preflight.check_rendezvous(site, other).result == "pass"


@needs_v2
def test_rendezvous_name_that_does_not_resolve_names_the_suffix(tmp_path):
    site = load_site(write_site(tmp_path, "slurm", rendezvous_host_suffix=".invalid"))
    check = preflight.check_rendezvous(site, preflight.Node(("nosuchhost-dlaunch",), on_node=True, first=True))
    assert check.result == "fail" and NOT_A_HOST in check.found and "rendezvous_host_suffix" in check.fix


@needs_v2
def test_rendezvous_is_skipped_outside_an_allocation(tmp_path, outside_allocation):
    site = load_site(write_site(tmp_path, "slurm"))
    node = preflight.where(site, {})
    assert not node.on_node and preflight.check_rendezvous(site, node).result == "skip"


@needs_v2
@pytest.mark.skipif(shutil.which("scontrol") is None, reason="no scontrol here")
def test_inside_an_allocation_this_host_is_its_first_node(tmp_path):
    """Slurm's own `scontrol show hostnames` (a slurm.conf, no controller) expands the job's node list."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=t\nSlurmctldHost=localhost\nNodeName=%s CPUs=1\n" % socket.gethostname())
    site = load_site(write_site(tmp_path, "slurm"))
    here = socket.gethostname().split(".")[0]
    environ = {"PATH": os.environ["PATH"], "SLURM_CONF": str(conf), "SLURM_JOB_ID": "7"}
    node = preflight.where(site, {**environ, "SLURM_JOB_NODELIST": "%s,other[1-2]" % here})
    assert node == preflight.Node([here, "other1", "other2"], on_node=True, first=True)
    node = preflight.where(site, {**environ, "SLURM_JOB_NODELIST": "other[1-2],%s" % here})
    assert node.on_node and not node.first
    assert not preflight.where(site, {**environ, "SLURM_JOB_NODELIST": "other[1-2]"}).on_node  # salloc's shell on a login node


@needs_v2
def test_interfaces_of_the_profile_exist_on_this_node(tmp_path):
    site = load_site(write_site(tmp_path, env={"NCCL_SOCKET_IFNAME": "^=nosuchif0", "GLOO_SOCKET_IFNAME": "lo,nosuchif0"}))
    nccl, gloo = preflight.check_interfaces(site, preflight.Node((), on_node=True, first=True))
    assert nccl.result == "pass" and "lo" in nccl.found
    assert gloo.result == "fail" and "lo" in gloo.fix


@needs_v2
@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has nvidia-smi; the profile's driver is not used")
def test_driver_from_the_profile_against_the_default_images_cuda(tmp_path):
    """No GPU here: the profile's driver against the paper stack's CUDA (11.5 in the version lock: at least 450.80.02)."""
    def site(**top):
        return load_site(write_site(tmp_path, "slurm", "apptainer", stack="paper", gpu_vendor="nvidia", **top))

    check = preflight.check_driver(site(driver="440.33"), None, "ddp")
    assert check.result == "fail" and "450.80.02, the minimum for CUDA 11.5" in check.found and "the profile's driver" in check.found
    assert preflight.check_driver(site(driver="450.80"), None, "ddp").result == "pass"  # major.minor as profiles give it
    assert preflight.check_driver(site(driver="470.57"), None, "ddp").result == "pass"
    assert preflight.check_driver(site(), None, "ddp").result == "skip"


# The command: output and exit codes


@needs_v2
def test_all_checks_pass_exit_0(tmp_path, monkeypatch, capsys, outside_allocation):
    site = write_site(tmp_path, env={"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}, arch=platform.machine())
    assert run_doctor(monkeypatch, "--site", str(site)) == 0
    shown = capsys.readouterr().out
    assert "interface GLOO_SOCKET_IFNAME" in shown and "fail" not in shown


@needs_v2
def test_a_missing_interface_fails_exit_1_with_the_fix(tmp_path, monkeypatch, capsys, outside_allocation):
    site = write_site(tmp_path, env={"NCCL_SOCKET_IFNAME": "=nosuchif0"}, arch=platform.machine())
    assert run_doctor(monkeypatch, "--site", str(site)) == 1
    shown = capsys.readouterr().out
    row = next(line for line in shown.splitlines() if "NCCL_SOCKET_IFNAME" in line)
    assert "fail" in row and "nosuchif0" in row and "set NCCL_SOCKET_IFNAME" in row
    assert "1 check(s) failed: interface NCCL_SOCKET_IFNAME" in shown


@needs_v2
def test_architecture_mismatch_fails_exit_1(tmp_path, monkeypatch, capsys, outside_allocation):
    other = "aarch64" if platform.machine() == "x86_64" else "x86_64"
    assert run_doctor(monkeypatch, "--site", str(write_site(tmp_path, arch=other))) == 1
    assert "set arch = %r" % platform.machine() in capsys.readouterr().out


@pytest.mark.parametrize("args", [["--site", "no-such-site"], ["--site", "local", "--partition", "nosuch"],
                                  ["--site", "local", "--framework", "nosuch"]])
def test_bad_input_exit_2(args, monkeypatch, capsys):
    assert run_doctor(monkeypatch, *args) == 2
    assert capsys.readouterr().err.count("\n") == 1  # one line naming what was wrong


@needs_v2
def test_an_image_reference_the_runtime_refuses_is_bad_input(tmp_path, monkeypatch, capsys):
    site = write_site(tmp_path, "slurm", "charliecloud")
    assert run_doctor(monkeypatch, "--site", str(site), "--image", "relative/dir") == 2
    assert "--image" in capsys.readouterr().err


# The controller, MPI plugin, modules, bind sources, GPUs per task


@pytest.fixture
def dead_controller(tmp_path, monkeypatch):
    """A slurm.conf whose controller port nobody listens on (a controller that is down or unreachable)."""
    if shutil.which("scontrol") is None or shutil.which("srun") is None:
        pytest.skip("no Slurm client here (scripts/bootstrap.sh full installs it)")
    with socket.socket() as s:  # a free port, closed again
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=gone\nSlurmctldHost=localhost\nSlurmctldPort=%d\nNodeName=n1 State=CLOUD\n"
                    "PartitionName=debug Nodes=n1 Default=YES\n" % port)
    monkeypatch.setenv("SLURM_CONF", str(conf))
    return conf


@needs_v2
def test_an_unreachable_controller_is_not_blamed_on_the_account(tmp_path, monkeypatch, capsys, outside_allocation, dead_controller):
    site = write_site(tmp_path, "slurm", arch=platform.machine())
    assert run_doctor(monkeypatch, "--site", str(site), "--account", "nosuch") == 1
    rows = {line.split("  ")[0]: line for line in capsys.readouterr().out.splitlines()}
    assert " fail " in rows["scheduler controller"] and "is DOWN" in rows["scheduler controller"]
    assert "account and partition are not the problem" in rows["scheduler controller"]
    assert " skip " in rows["account and partition"] and "sacctmgr" not in rows["account and partition"]


@needs_v2
@pytest.mark.parametrize("plugin, result", [("pmi2", "pass"), ("pspmix", "fail")])
def test_the_mpi_plugin_is_one_srun_offers(tmp_path, dead_controller, plugin, result):
    """srun --mpi=list answers without a controller (Debian's Slurm offers pmi2 and pmix, not ParaStation's pspmix)."""
    text = write_site(tmp_path, "slurm").read_text().replace('kind = "slurm"', 'kind = "slurm"\nmpi_plugin = "%s"' % plugin)
    (tmp_path / "mpi.toml").write_text(text)
    check = preflight.check_mpi_plugin(load_site(tmp_path / "mpi.toml"))
    assert check.result == result and plugin in check.found and "pmi2" in check.found


@needs_v2
def test_a_failing_srun_mpi_list_is_shown_in_its_own_words(tmp_path, monkeypatch):
    """A fake srun (it is Slurm's client that fails here, whatever the machine has) that refuses its configuration."""
    fake = tmp_path / "bin" / "srun"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "srun: error: s_p_parse_file: unable to read slurm.conf" >&2\n'
                    'echo "srun: fatal: Unable to process configuration file" >&2\nexit 1\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (fake.parent, os.environ["PATH"]))
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    text = write_site(tmp_path, "slurm").read_text().replace('kind = "slurm"', 'kind = "slurm"\nmpi_plugin = "pmi2"')
    (tmp_path / "mpi.toml").write_text(text)
    check = preflight.check_mpi_plugin(load_site(tmp_path / "mpi.toml"))
    assert (check.result, check.found) == (
        "skip", "srun --mpi=list: srun: fatal: Unable to process configuration file (%s)" % (tmp_path / "slurm.conf"))


@needs_v2
def test_without_a_controller_the_mpi_plugin_is_not_blamed(tmp_path, monkeypatch, capsys, outside_allocation):
    """No slurm.conf: the client asks DNS for a controller (configless Slurm), finds none and fails at
    once; `srun --mpi=list` then fails for the controller's reason (issue 37). The controller fails, the
    MPI plugin is skipped with srun's own error, not failed."""
    if shutil.which("scontrol") is None or shutil.which("srun") is None:
        pytest.skip("no Slurm client here (scripts/bootstrap.sh full installs it)")
    if Path("/etc/slurm/slurm.conf").exists():
        pytest.skip("this machine has a default slurm.conf")
    monkeypatch.delenv("SLURM_CONF", raising=False)
    text = write_site(tmp_path, "slurm", arch=platform.machine()).read_text()
    (tmp_path / "mpi.toml").write_text(text.replace('kind = "slurm"', 'kind = "slurm"\nmpi_plugin = "pmi2"'))
    assert run_doctor(monkeypatch, "--site", str(tmp_path / "mpi.toml")) == 1
    rows = {line.split("  ")[0]: line for line in capsys.readouterr().out.splitlines()}
    assert " fail " in rows["scheduler controller"]
    assert " skip " in rows["MPI plugin"]
    assert "srun --mpi=list: srun: fatal: Could not establish a configuration source" in rows["MPI plugin"]
    assert "set [scheduler] mpi_plugin" not in rows["MPI plugin"]
    assert "checked once `scheduler controller` passes" in rows["MPI plugin"], rows["MPI plugin"]  # not "run doctor where
    # the Slurm commands are": they are here (`scheduler commands` passes)


def test_a_cpu_site_has_no_gpus_to_check_a_driver_of(tmp_path):
    check = preflight.check_driver(load_site(write_site(tmp_path, "slurm")), None, "ddp")  # gpu_vendor = "none"
    assert check.result == "skip" and check.found == "no GPUs (a CPU site)"


@needs_v2
def test_modules_are_asked_of_the_module_command(tmp_path, monkeypatch):
    """A fake `module` shell function (exported the way Lmod exports it) that knows one module."""
    monkeypatch.setenv("BASH_FUNC_module%%", '() { [ "$1" = use ] || [ "$2" = rocm/6.4.2 ]; }')
    site = write_site(tmp_path, "slurm", modules=["rocm/6.4.2", "rccl-net-plugin"])
    check = preflight.check_modules(load_site(site))
    assert check.result == "fail" and check.found == "not available: rccl-net-plugin" and "module spider" in check.fix
    assert preflight.check_modules(load_site(write_site(tmp_path, "slurm", modules=["rocm/6.4.2"]))).result == "pass"


@needs_v2
def test_bind_sources_must_exist_on_the_node(tmp_path):
    text = write_site(tmp_path, "slurm", "apptainer").read_text().replace(
        'kind = "apptainer"', 'kind = "apptainer"\nbinds = ["%s", "/nonexistent-dlaunch:/opt/x"]' % tmp_path)
    (tmp_path / "binds.toml").write_text(text)
    site = load_site(tmp_path / "binds.toml")
    on_node = preflight.Node(("here",), on_node=True, first=True)
    check = preflight.check_bind_sources(site, on_node, {})
    assert check.result == "fail" and check.found == "missing on this node: /nonexistent-dlaunch"
    assert preflight.check_bind_sources(site, preflight.Node((), False, False), {}).result == "skip"


@needs_v2
@pytest.mark.parametrize("launch, result", [("", "fail"), ("[launch]\nbinds_gpu_per_task = true\n", "pass"),
                                            ('[launch.ddp]\nmode = "task-per-gpu"\n', "pass")])
def test_the_gpus_each_task_sees_against_the_launch_mode(tmp_path, launch, result):
    """A task bound to one GPU (CUDA_VISIBLE_DEVICES=0, as psslurm sets it) cannot host a 4-worker torchrun."""
    text = write_site(tmp_path, "slurm", gpus_per_node=4, gpu_vendor="nvidia").read_text() + launch
    (tmp_path / "gpus.toml").write_text(text)
    check = preflight.check_gpus(load_site(tmp_path / "gpus.toml"), preflight.Node(("here",), True, True), "ddp",
                              {"CUDA_VISIBLE_DEVICES": "0"})
    assert check.result == result and check.found.startswith("1 (CUDA_VISIBLE_DEVICES=0)")
    if result == "fail":
        assert "binds_gpu_per_task = true" in check.fix
