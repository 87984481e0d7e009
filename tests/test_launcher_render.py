"""Rendering: golden scripts per site and framework, `bash -n`, validation, hostile values stay inert."""
import dataclasses
import os
import re
import string
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from dlaunch.errors import DlaunchError
from dlaunch.jobs.plan import build_plan
from dlaunch.jobs.render import render_script
from dlaunch.jobs.request import LaunchRequest
from dlaunch.train.framework_table import FRAMEWORKS
from dlaunch.jobs.sites import SHIPPED_SITES_DIR, Site, load_site
from test_launcher_fakes import fake_env, install_fakes, plan_for, read_args, script_for

GOLDEN = Path(__file__).parent / "golden"
# Frameworks of the torch trainer's launch styles (the task-per-worker engines: tests/test_backends.py)
SCRIPTED = tuple(name for name, row in FRAMEWORKS.items() if row.launch != "task-per-worker")
SITES = sorted(p.stem for p in SHIPPED_SITES_DIR.glob("*.toml"))
TRAINER = (("model", "resnet50"), ("batch-size", 64), ("steps", 200), ("warmup-steps", 20), ("channels-last", True))


def site(name: str) -> Site:
    return load_site(SHIPPED_SITES_DIR / ("%s.toml" % name))


def golden_request(site_name: str, framework: str) -> LaunchRequest:
    local = site_name == "local"
    return LaunchRequest(site=site_name, framework=framework, nodes=None if local else 2, gpus=2 if local else None,
                         account=None if local else "proj42", experiment="exp", trainer=TRAINER)


@pytest.mark.parametrize("framework", SCRIPTED)
@pytest.mark.parametrize("site_name", SITES)
def test_golden_script(site_name, framework):
    """The script for each shipped site and framework is exactly the reviewed one (DLAUNCH_UPDATE_GOLDEN=1 rewrites)."""
    script = script_for(site(site_name), golden_request(site_name, framework))
    golden = GOLDEN / ("%s-%s.sh" % (site_name, framework))
    if os.environ.get("DLAUNCH_UPDATE_GOLDEN") == "1":
        golden.write_text(script)
    assert script == golden.read_text()
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_shipped_sites_cover_the_issue():
    names = {site(n).name for n in SITES}
    assert {"juwels-booster", "jureca-dc", "perlmutter", "lumi-g", "generic-slurm", "local"} <= names
    juwels = site("juwels-booster")
    assert "juwels" in juwels.aliases and juwels.rendezvous_host_suffix == "i" and juwels.scheduler.mpi_plugin == "pspmix"


def test_juwels_script_has_the_known_good_settings():
    script = script_for(site("juwels-booster"), golden_request("juwels-booster", "ddp"))
    for line in ("#SBATCH --gres=gpu:4", "#SBATCH --partition=booster", "#SBATCH --signal=USR1@120",
                 "export NCCL_SOCKET_IFNAME=ib0", "export GLOO_SOCKET_IFNAME=ib0", "export NCCL_IB_TIMEOUT=22",
                 "export UCX_RC_TIMEOUT=4s", "export NCCL_IB_RETRY_CNT=7",
                 'export SRUN_CPUS_PER_TASK="$SLURM_CPUS_PER_TASK"', "#SBATCH --cpus-per-task=48",
                 "#SBATCH --hint=nomultithread", "export CUDA_VISIBLE_DEVICES=0,1,2,3",
                 "srun --ntasks-per-node=1 --cpu-bind=none --kill-on-bad-exit=1 \\"):
        assert line in script.splitlines()
    assert 'sed -n 1p)i"' in script
    assert "ignore-usr1 python -m torchrun_jsc " in script  # rendezvous at <host>i (pytorch/pytorch#73656)


@pytest.mark.parametrize("framework, cpus", [("ddp", 48), ("deepspeed", 48), ("horovod", 24)])
@pytest.mark.parametrize("nodes", [1, 256])
def test_juwels_scripts_keep_every_value_in_its_documented_range(framework, cpus, nodes):
    """JUWELS Booster counts SMT threads as CPUs (96 per node): a torchrun per node gets the 48 physical cores with
    --hint=nomultithread (JSC's one-task-per-node scripts), an MPI rank per GPU a quarter of the 96 (its four-task ones)."""
    script = script_for(site("juwels-booster"), LaunchRequest(site="juwels", framework=framework, nodes=nodes,
                                                               account="proj42", experiment="exp", trainer=TRAINER))
    lines = script.splitlines()
    assert "#SBATCH --nodes=%d" % nodes in lines and "#SBATCH --cpus-per-task=%d" % cpus in lines
    assert "#SBATCH --ntasks-per-node=%d" % (4 if framework == "horovod" else 1) in lines
    exported = dict(line[len("export "):].split("=", 1) for line in lines if line.startswith("export ") and "=" in line)
    assert 1 <= int(exported["NCCL_IB_TIMEOUT"]) <= 22 and 0 <= int(exported["NCCL_IB_RETRY_CNT"]) <= 7
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_sites_without_a_host_suffix_keep_plain_torchrun():
    script = script_for(site("generic-slurm"), golden_request("generic-slurm", "ddp"))
    assert "ignore-usr1 torchrun " in script and "torchrun_jsc" not in script


@pytest.mark.parametrize("name, value", [("NCCL_IB_TIMEOUT", "50"), ("NCCL_IB_TIMEOUT", "0"), ("NCCL_IB_RETRY_CNT", "10")])
def test_a_profile_value_outside_its_documented_range_is_refused(tmp_path, name, value):
    text = (SHIPPED_SITES_DIR / "juwels-booster.toml").read_text()
    text = re.sub(r'(?m)^%s = "[^"]*"' % name, '%s = "%s"' % (name, value), text)
    (tmp_path / "juwels.toml").write_text(text)
    with pytest.raises(DlaunchError, match=r"juwels.toml: env: %s = '%s' is outside \d+-\d+, the range NCCL's documentation" % (name, value)):
        load_site(tmp_path / "juwels.toml")


def test_horovod_uses_one_task_per_gpu_through_the_mpi_plugin(tmp_path):
    script = script_for(site("juwels-booster"), golden_request("juwels-booster", "horovod"), str(tmp_path))
    (tmp_path / "job.sh").write_text(script)
    fakes = install_fakes(tmp_path / "bin")
    subprocess.run(["bash", str(tmp_path / "job.sh")], env=fake_env(fakes, tmp_path), check=True)
    args = read_args(tmp_path / "srun.args")
    assert args[:2] == ["--ntasks-per-node=4", "--mpi=pspmix"]
    assert args[args.index("python"):][:4] == ["python", "-m", "dlaunch.train", "--framework"]


def test_torchrun_gets_rendezvous_from_the_host(tmp_path):
    """MASTER_ADDR is computed on the batch host (first host + `i`) and expanded before srun."""
    script = script_for(site("juwels-booster"), golden_request("juwels-booster", "ddp"), str(tmp_path))
    (tmp_path / "job.sh").write_text(script)
    fakes = install_fakes(tmp_path / "bin")
    subprocess.run(["bash", str(tmp_path / "job.sh")], env=fake_env(fakes, tmp_path), check=True)
    args = read_args(tmp_path / "srun.args")
    assert "--rdzv_endpoint=node1i:29500" in args and "--nnodes=2" in args and "--rdzv_id=42" in args
    assert args[args.index("exec") + 1:][:4] == ["--nv", "--bind", str(tmp_path), "/images/current-ddp-x86_64.sif"]


@pytest.mark.parametrize("change, message", [
    (dict(nodes=385), "--nodes: no partition of site juwels-booster takes 385 node(s) for 01:00:00; its partitions: "
                      "booster (1-384 nodes, up to 1-00:00:00), develbooster (1-4 nodes, up to 02:00:00)"),
    (dict(time="24:00:01"), "--time: no partition of site juwels-booster takes 2 node(s) for 1-00:00:01"),
    (dict(partition="booster", time="24:00:01"), "--time: 1-00:00:01 exceeds the limit 1-00:00:00 of partition booster"),
    (dict(partition="develbooster", nodes=5), "--nodes: 5 exceeds the 4 nodes of partition develbooster"),
    (dict(partition="gpus"), "--partition: 'gpus' is not a partition of site juwels-booster"),
    (dict(time="soon"), "--time: 'soon' is not a Slurm time"),
    (dict(account=None), "--account: site juwels-booster needs an account"),
    (dict(account="a b"), "--account: 'a b' may only contain"),
    (dict(nodes=None, gpus=6), "--gpus: 6 is not a multiple of the 4 GPUs per node"),
    (dict(gpus=10), "--gpus: 10 GPUs do not spread evenly over --nodes 2 with 1 to 4 per node"),
])
def test_bad_requests_are_refused(change, message):
    fields = dict(site="juwels", nodes=2, account="proj42", experiment="exp")
    fields.update(change)
    with pytest.raises(DlaunchError, match="^" + re.escape(message)):
        script_for(site("juwels-booster"), LaunchRequest(**fields))


@pytest.mark.parametrize("fields, message", [
    (dict(framework="mxnet"), "--framework: 'mxnet' is not one of ddp, horovod, deepspeed"),
    (dict(trainer=(("model", "vgg16"),)), "--model: 'vgg16' is not one of"),
    (dict(trainer=(("batch-size", "8"),)), "--batch-size: expected int"),
    (dict(trainer=(("no-such-flag", 1),)), "--no-such-flag: not a trainer option"),
    (dict(experiment="a/b"), "--experiment: 'a/b' may only contain"),
])
def test_bad_request_fields_are_refused(fields, message):
    with pytest.raises(DlaunchError, match="^" + message):
        LaunchRequest(site="local", **fields)


# Hostile values: every user-settable string either is refused or reaches the programs verbatim.
MARK = "/tmp/dlaunch-hostile-marker"
PAYLOADS = ["$(touch %s)" % MARK, "`touch %s`" % MARK, "'; touch %s; '" % MARK, '"; touch %s; "' % MARK,
            "\ntouch %s\n" % MARK, "x;touch %s" % MARK, "$(touch${IFS}%s)" % MARK, "a'b\"c\\$d"]
hostile = st.builds(lambda a, p, b: a + p + b, st.text(string.printable, max_size=6), st.sampled_from(PAYLOADS),
                    st.text(string.printable, max_size=6))
FIELDS = ["account", "partition", "time", "experiment", "run_name", "output", "image", "data", "env", "bind",
          "module", "srun_arg", "schedule", "model", "rendezvous_command", "framework_step_option", "row_directive",
          "env_by_nodes", "plugin_dir"]


def _hostile_case(field: str, value: str, site_name: str, base: Path):
    """(site, request, run_dir under `base`) with `value` in `field`."""
    profile = load_site(SHIPPED_SITES_DIR / ("%s.toml" % site_name)).model_dump(by_alias=True)
    request = dict(site=site_name, framework="ddp", account="proj42", experiment="exp", run_name="run",
                   trainer=(("data", "/data/imagenet"),))
    run_dir = str(base / "runs" / "exp" / "run")
    if field in ("account", "partition", "time", "experiment", "run_name"):
        request[field] = value
    elif field == "output":
        run_dir = str(base) + "/" + value + "/exp/run"
    elif field in ("data", "schedule", "model"):
        request["trainer"] = ((field, "/data/" + value if field == "data" else value),)
    elif field == "env":
        profile["env"] = {"HOSTILE": value}
    elif field == "bind":
        profile["container"]["binds"] = [value]
    elif field == "module":
        profile["modules"] = [value]
    elif field == "srun_arg":
        profile["scheduler"]["step_options"] = [value]
    elif field == "rendezvous_command":
        profile["rendezvous_host_suffix"] = ""
        profile["launch"] = {"rendezvous_command": ["hostname", value]}
    elif field == "framework_step_option":
        profile["launch"] = {"ddp": {"step_options": [value]}}
    elif field == "row_directive" and profile["scheduler"]["kind"] != "local":
        profile["scheduler"]["partitions"][0]["directives"] = [value]
    elif field == "env_by_nodes":
        profile["env_by_nodes"] = [{"env": {"HOSTILE": value}}]
    elif field == "plugin_dir":
        profile["nccl_net_plugin"] = {"name": "x", "library_dir": "$PLUGIN/" + value}
    image = "/images/" + value + ".sif" if field == "image" else None
    return Site.model_validate(profile), LaunchRequest(**request), run_dir, image


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    return root, install_fakes(root / "bin")


@pytest.mark.parametrize("site_name", ["juwels-booster", "local"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(FIELDS), value=hostile)
def test_hostile_values_fake_cluster_refused_or_inert(sandbox, site_name, field, value):
    """Run the rendered script with fake srun/scontrol/apptainer/module/torchrun: the marker never appears."""
    root, fakes = sandbox
    try:
        site_obj, request, run_dir, image = _hostile_case(field, value, site_name, root)
        if image is None and site_obj.container.kind != "none":
            image = "/images/current-ddp.sif"
        plan = build_plan(site_obj, request, run_dir=run_dir, git_revision="0" * 40, image=image, environ={})
        script = render_script(plan, "hostile test")
    except (DlaunchError, ValidationError):
        return  # refused with an error naming the field
    try:
        os.makedirs(run_dir, exist_ok=True)  # dlaunch makes the run directory before it submits; the job cds there
    except OSError:
        return  # a directory the file system refuses: nothing is submitted
    job = root / "job.sh"
    job.write_text(script)
    assert subprocess.run(["bash", "-n", str(job)]).returncode == 0
    for stale in root.glob("*.args"):
        stale.unlink()
    env = dict(fake_env(fakes, root), PLUGIN="/opt/plugin")  # the variable a plugin module would set
    result = subprocess.run(["bash", str(job)], env=env, capture_output=True, text=True, cwd=root)
    assert not os.path.exists(MARK), (field, value, script)
    assert result.returncode == 0, result.stderr
    launcher = "srun" if site_obj.scheduler.kind == "slurm" else "torchrun"
    argv = read_args(root / ("%s.args" % launcher))
    if field in ("data", "schedule", "model"):
        expected = "/data/" + value if field == "data" else value
        assert argv[argv.index("--" + field) + 1] == expected
    if field == "output":
        assert argv[argv.index("--metrics") + 1] == os.path.join(run_dir, "metrics.jsonl")


def test_every_trainer_setting_has_one_flag():
    """TrainConfig's fields and dlaunch.train.config.FLAGS (the one definition both parsers use) match one to one."""
    import dataclasses

    from dlaunch.train.config import FLAGS, TrainConfig, build_parser

    assert sorted(f.name for f in dataclasses.fields(TrainConfig)) == sorted(flag.attr for flag in FLAGS)
    actions = {opt: a for a in build_parser()._actions for opt in a.option_strings}
    for flag in FLAGS:
        assert tuple(actions["--" + flag.name].choices or ()) == flag.values, flag.name


@pytest.mark.parametrize("framework", SCRIPTED)
def test_rendered_trainer_argv_is_accepted_by_the_trainer(framework):
    from dlaunch.train.config import parse_config

    request = LaunchRequest(site="local", framework=framework, trainer=TRAINER + (("zero-stage", 2), ("amp", "bf16")))
    plan = build_plan(site("local"), request, run_dir="/tmp/run", git_revision=None, image=None, environ={})
    cfg = parse_config(list(plan.trainer_argv))
    assert (cfg.framework, cfg.batch_size, cfg.zero_stage, cfg.metrics) == (framework, 64, 2, "/tmp/run/metrics.jsonl")


def juwels_plan(**change):
    fields = dict(site="juwels", nodes=2, account="proj42", experiment="exp")
    fields.update(change)
    return plan_for(site("juwels-booster"), LaunchRequest(**fields))


def test_a_short_time_limit_and_an_unseen_data_folder_are_warned_about_not_refused():
    assert any(w.startswith("--time 00:03:00 leaves less than twice the 120 s warning") for w in juwels_plan(time="00:03:00").warnings)
    assert juwels_plan(time="00:04:00").warnings == ()
    unseen = juwels_plan(trainer=(("data", "/p/scratch/not-mounted-here"),))
    assert unseen.warnings == ("--data /p/scratch/not-mounted-here is not visible here; it is checked on the nodes only",)
    with pytest.raises(DlaunchError, match="^--data: /nowhere does not exist"):
        plan_for(site("local"), LaunchRequest(site="local", gpus=1, trainer=(("data", "/nowhere"),)))


def test_a_data_folder_seen_here_gets_the_trainers_full_check_before_submission(tmp_path):
    for split in ("train", "val"):
        (tmp_path / split / "cat").mkdir(parents=True)
        (tmp_path / split / "cat" / "1.JPEG").write_bytes(b"")
    (tmp_path / "train" / "dog").mkdir()
    with pytest.raises(DlaunchError, match="^trainer options: --data %s: no images in %s$" % (tmp_path, tmp_path / "train" / "dog")):
        juwels_plan(trainer=(("data", str(tmp_path)),))


def test_jobs_are_requeued_after_a_node_failure_unless_told_not_to():
    assert "--requeue" in juwels_plan().directives and "--open-mode=append" in juwels_plan().directives
    assert "--no-requeue" in juwels_plan(requeue=False).directives and "--requeue" not in juwels_plan(requeue=False).directives


def preflight_request(site_name: str, spare_nodes: int = 1, framework: str = "ddp") -> LaunchRequest:
    return dataclasses.replace(golden_request(site_name, framework), preflight=True, spare_nodes=spare_nodes)


def test_preflight_script_is_the_reviewed_one():
    """`--preflight --spare-nodes 1`: N + 1 nodes asked, every node checked in the job's image, the selection's hosts
    as DLAUNCH_NODELIST/DLAUNCH_NNODES, MASTER_ADDR their first, the training step and torchrun on those N only."""
    script = script_for(site("generic-slurm"), preflight_request("generic-slurm"))
    golden = GOLDEN / "generic-slurm-ddp-preflight.sh"
    if os.environ.get("DLAUNCH_UPDATE_GOLDEN") == "1":
        golden.write_text(script)
    assert script == golden.read_text()
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    lines = script.splitlines()
    assert "#SBATCH --nodes=3" in lines and "export DLAUNCH_NNODES=2" in lines
    assert 'MASTER_ADDR="$(scontrol show hostnames "$DLAUNCH_NODELIST" | sed -n 1p)"' in lines
    assert "--kill-on-bad-exit=1 --nodes=2 --ntasks=2 \"--nodelist=$DLAUNCH_NODELIST\"" in script
    assert "torchrun --nnodes=2 " in script and "$SLURM_JOB_NUM_NODES\" --nproc" not in script


@pytest.mark.parametrize("site_name, why", [
    ("local", "--preflight: the local scheduler (site local) cannot run it"),
    ("polaris", "--preflight: the pbs scheduler (site polaris) cannot run it"),
])
def test_preflight_is_refused_where_the_scheduler_cannot_run_it(site_name, why):
    with pytest.raises(DlaunchError) as e:
        plan_for(site(site_name), preflight_request(site_name, spare_nodes=0))
    assert str(e.value) == why


def test_spare_nodes_are_checked():
    with pytest.raises(DlaunchError, match="^--spare-nodes: needs --preflight"):
        LaunchRequest(site="generic-slurm", spare_nodes=1)
    with pytest.raises(DlaunchError, match="^--spare-nodes: must not be negative, got -1$"):
        LaunchRequest(site="generic-slurm", preflight=True, spare_nodes=-1)
    biggest = max(p.max_nodes for p in site("generic-slurm").scheduler.partitions)
    request = dataclasses.replace(golden_request("generic-slurm", "ddp"), nodes=biggest, preflight=True, spare_nodes=1)
    with pytest.raises(DlaunchError, match="^--nodes: no partition of site generic-slurm takes %d node" % (biggest + 1)):
        plan_for(site("generic-slurm"), request)


@pytest.mark.parametrize("framework", SCRIPTED)
@pytest.mark.parametrize("site_name", SITES)
def test_every_shipped_site_renders_preflight_or_refuses_it_in_one_line(site_name, framework):
    """A Slurm site's script trains on the chosen nodes only; the others (this machine, PBS, a rendezvous address
    computed on the batch host, which pre-flight may leave out) refuse --preflight naming it."""
    try:
        script = script_for(site(site_name), preflight_request(site_name, spare_nodes=0))
    except DlaunchError as e:
        assert str(e).startswith("--preflight: ") and "\n" not in str(e)
        assert site(site_name).scheduler.kind != "slurm" or site(site_name).launch.rendezvous_command
        return
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    assert '"--nodelist=$DLAUNCH_NODELIST"' in script and "nodecheck check" in script and "nodecheck select" in script
    assert "$SLURM_JOB_NUM_NODES\" --nproc" not in script and "export DLAUNCH_NNODES=2\n" in script
