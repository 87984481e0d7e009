"""Launch modes a profile chooses per framework (`[launch]`), and the schema items that go with them:
GPU requests following --gpus, step options per framework, environment by node count, directives per
partition row, the rendezvous address from a command, GPUs made visible to a per-node launcher."""
import subprocess
from pathlib import Path

import pytest

from dlaunch.errors import DlaunchError
from dlaunch.jobs.request import LaunchRequest
from dlaunch.jobs.sites import SHIPPED_SITES_DIR, load_site
from test_launcher_fakes import FAKES, fake_env, install_fakes, plan_for, read_args, script_for

BASE = (SHIPPED_SITES_DIR / "generic-slurm.toml").read_text()
LAUNCH = '''
[launch]
rendezvous_command = ["hostname", "-i"]

[launch.ddp]
mode = "task-per-gpu"
step_options = ["--gpus-per-task=1", "--gpu-bind=closest"]

[launch.horovod]
mode = "mpirun"
step_options = ["--bind-to", "core"]

[[env_by_nodes]]
min_nodes = 64
env = { NCCL_DEBUG = "INFO", FI_CXI_RDZV_THRESHOLD = "16384" }
'''


def profile(tmp_path: Path, text: str, name: str = "site.toml"):
    (tmp_path / name).write_text(text)
    return load_site(tmp_path / name)


def request(framework: str = "ddp", **fields) -> LaunchRequest:
    fields.setdefault("nodes", 2)
    return LaunchRequest(site="generic-slurm", framework=framework, account="proj42", experiment="exp", **fields)


def run_with_fakes(tmp_path: Path, script: str, **scripts: str):
    """The script run with fake srun/mpirun/hostname/apptainer (named as such: they record their argv)."""
    fakes = dict(FAKES, **scripts)
    (tmp_path / "job.sh").write_text(script)
    bin_dir = install_fakes(tmp_path / "bin", fakes)
    subprocess.run(["bash", str(tmp_path / "job.sh")], env=fake_env(bin_dir, tmp_path), check=True)


def test_task_per_gpu_starts_one_task_per_gpu_without_torchrun(tmp_path):
    site = profile(tmp_path, BASE + LAUNCH)
    script = script_for(site, request())
    lines = script.splitlines()
    assert "#SBATCH --ntasks-per-node=4" in lines and "#SBATCH --cpus-per-task=8" in lines
    assert "srun --ntasks-per-node=4 --kill-on-bad-exit=1 --gpus-per-task=1 --gpu-bind=closest \\" in lines
    assert "torchrun" not in script and "  python -m dlaunch.train \\" in lines
    deepspeed = script_for(site, request("deepspeed"))  # no [launch.deepspeed]: the table's torchrun per node
    assert "ignore-usr1 torchrun " in deepspeed and "--gpu-bind" not in deepspeed


def test_the_rendezvous_address_is_the_first_word_of_the_command_on_the_first_node(tmp_path):
    site = profile(tmp_path, BASE + LAUNCH)
    script = script_for(site, request(), str(tmp_path))
    assert 'MASTER_ADDR="$(hostname -i)"\nMASTER_ADDR="${MASTER_ADDR%% *}"\nexport MASTER_ADDR\n' in script
    # fake hostname (two addresses, as on a multi-homed node); fake srun records MASTER_ADDR as the tasks get it
    run_with_fakes(tmp_path, script, hostname='echo "10.1.0.7 10.2.0.7"\n',
                   srun='printf "%s" "$MASTER_ADDR:$MASTER_PORT" > "$FAKE_LOG/master"\n')
    assert (tmp_path / "master").read_text() == "10.1.0.7:29500"


def test_horovod_through_mpirun_instead_of_the_mpi_plugin(tmp_path):
    script = script_for(profile(tmp_path, BASE + LAUNCH), request("horovod"), str(tmp_path))
    assert "srun" not in script.split("set -eo pipefail")[1]
    run_with_fakes(tmp_path, script, mpirun='printf "%s\\0" "$@" > "$FAKE_LOG/mpirun.args"\n')
    args = read_args(tmp_path / "mpirun.args")
    assert args[:7] == ["-np", "8", "--map-by", "ppr:4:node", "--bind-to", "core", "apptainer"]
    assert args[args.index("python"):][:3] == ["python", "-m", "dlaunch.train"]


def test_environment_by_node_count(tmp_path):
    site = profile(tmp_path, BASE + LAUNCH)
    small, large = plan_for(site, request(nodes=2)), plan_for(site, request(nodes=64))
    assert dict(small.env)["NCCL_DEBUG"] == "WARN" and "FI_CXI_RDZV_THRESHOLD" not in dict(small.env)
    assert dict(large.env)["NCCL_DEBUG"] == "INFO" and dict(large.env)["FI_CXI_RDZV_THRESHOLD"] == "16384"


def test_the_gpu_request_follows_the_gpus_used(tmp_path):
    text = BASE.replace('gres = "gpu:4"', 'gpu_request = "gres"')
    site = profile(tmp_path, text)
    assert "--gres=gpu:2" in plan_for(site, request(nodes=1, gpus=2)).directives
    assert "--gres=gpu:4" in plan_for(site, request(nodes=2)).directives
    site = profile(tmp_path, text.replace('gpu_request = "gres"', 'gpu_request = "gpus-per-node"'))
    assert "--gpus-per-node=3" in plan_for(site, request(nodes=1, gpus=3)).directives


def test_directives_of_a_partition_row_go_with_that_row_only(tmp_path):
    row = '\n[[scheduler.partitions]]\nname = "large"\npartition = "gpu"\nmin_nodes = 65\nmax_nodes = 512\n' \
          'max_time = "12:00:00"\ndirectives = ["--network=disable_rdzv_get"]\n'
    site = profile(tmp_path, BASE.replace("\n[env]", row + "\n[env]"))
    assert "--network=disable_rdzv_get" in plan_for(site, request(nodes=128)).directives
    assert "--network=disable_rdzv_get" not in plan_for(site, request(nodes=2)).directives


@pytest.mark.parametrize("vendor, variable", [("nvidia", "CUDA_VISIBLE_DEVICES"), ("amd", "ROCR_VISIBLE_DEVICES")])
def test_a_site_binding_one_gpu_per_task_shows_every_task_the_nodes_gpus(tmp_path, vendor, variable):
    """The per-node launcher needs them all; a task per GPU takes its local rank's among them, so that NCCL can
    reach the others through CUDA IPC (JSC's scripts export them for both; psslurm keeps the script's value)."""
    text = BASE.replace('gpu_vendor = "nvidia"', 'gpu_vendor = "%s"' % vendor).replace('flags = ["--nv"]', 'flags = ["--rocm"]\nstack = "rocm"' if vendor == "amd" else 'flags = ["--nv"]')
    site = profile(tmp_path, text + "\n[launch]\nbinds_gpu_per_task = true\n")
    assert "export %s=0,1,2,3\n" % variable in script_for(site, request())
    assert "export %s=0,1\n" % variable in script_for(site, request(nodes=1, gpus=2))
    assert "export %s=0,1,2,3\n" % variable in script_for(site, request("horovod"))
    per_gpu = profile(tmp_path, text + '\n[launch]\nbinds_gpu_per_task = true\n[launch.ddp]\nmode = "task-per-gpu"\n')
    assert "export %s=0,1,2,3\n" % variable in script_for(per_gpu, request())
    assert variable not in script_for(profile(tmp_path, text), request("horovod"))  # where Slurm binds nothing


@pytest.mark.parametrize("addition, message", [
    ('[launch.ddp]\nmode = "mpirun"\n', "launch.ddp.mode: 'mpirun' is not one of torchrun-per-node, task-per-gpu"),
    ('[launch.horovod]\nmode = "task-per-gpu"\n', "launch.horovod.mode: 'task-per-gpu' is not one of mpi-per-gpu, mpirun"),
    ('[launch.ddp]\nstep_options = ["-c7"]\n', "launch.ddp.step_options: '-c7' is not an srun option"),
    ('[launch.tf-allreduce]\nmode = "task-per-gpu"\n', "launch.tf-allreduce: Extra inputs are not permitted"),
    ('[launch]\nrendezvous_command = ["hostname", "-i"]\n', "rendezvous_command and rendezvous_host_suffix both"),
    ('[[env_by_nodes]]\nmin_nodes = 8\nenv = { A = "1" }\n[[env_by_nodes]]\nmin_nodes = 4\nmax_nodes = 16\nenv = { A = "2" }\n',
     "env_by_nodes: two rows set A for 8 nodes"),
    ('[[env_by_nodes]]\nenv = { NCCL_IB_TIMEOUT = "50" }\n', "env_by_nodes: NCCL_IB_TIMEOUT = '50' is outside 1-31"),
])
def test_launch_sections_are_validated(tmp_path, addition, message):
    text = BASE.replace('rendezvous_host_suffix = ""', 'rendezvous_host_suffix = "i"') if "rendezvous_command" in addition else BASE
    with pytest.raises(DlaunchError, match="^" + str(tmp_path / "site.toml").replace(".", r"\.") + ": .*" + message.replace("(", r"\(").replace(")", r"\)")):
        profile(tmp_path, text + "\n" + addition)


def test_mpirun_cannot_carry_pyxis_step_options(tmp_path):
    text = BASE.replace('kind = "apptainer"\nflags = ["--nv"]\nbinds = []', 'kind = "pyxis"')
    site = profile(tmp_path, text + '\n[launch.horovod]\nmode = "mpirun"\n')
    with pytest.raises(DlaunchError, match="starts it with mpirun, which cannot pass the pyxis runtime's step options"):
        plan_for(site, request("horovod", image="/images/h.sqsh"))


def test_a_plugin_directory_named_by_a_module_variable_reaches_the_container(tmp_path):
    """OLCF's rccl-net-plugin module names its directory in a variable: bound and on the library path when
    the job runs, and the job stops with the field named when the module did not set it."""
    text = BASE.replace('account_required = false', 'account_required = false\n'
                        'nccl_net_plugin = { name = "aws-ofi-rccl", library_dir = "$OLCF_OFI_NCCL_ROOT/lib" }')
    script = script_for(profile(tmp_path, text), request(), str(tmp_path))
    assert ': "${OLCF_OFI_NCCL_ROOT:?is not set: nccl_net_plugin.library_dir needs it' in script
    assert 'export APPTAINERENV_LD_LIBRARY_PATH="$OLCF_OFI_NCCL_ROOT/lib""${APPTAINERENV_LD_LIBRARY_PATH:+' in script
    env_root = dict(OLCF_OFI_NCCL_ROOT="/opt/plugin")
    (tmp_path / "job.sh").write_text(script)
    bin_dir = install_fakes(tmp_path / "bin")
    subprocess.run(["bash", str(tmp_path / "job.sh")], env=dict(fake_env(bin_dir, tmp_path), **env_root), check=True)
    args = read_args(tmp_path / "srun.args")  # the fake srun records the step's argv, the container's included
    assert args[args.index("--bind") + 1] == "%s,/opt/plugin/lib" % tmp_path
    unset = subprocess.run(["bash", str(tmp_path / "job.sh")], env=fake_env(bin_dir, tmp_path), capture_output=True, text=True)
    assert unset.returncode != 0 and "OLCF_OFI_NCCL_ROOT: is not set: nccl_net_plugin.library_dir needs it" in unset.stderr


# -- what issue 32 asks of the shipped profiles ------------------------------------------------------------
def shipped(name: str):
    return load_site(SHIPPED_SITES_DIR / ("%s.toml" % name))


def test_frontier_ddp_runs_one_task_per_gcd_without_torchrun():
    """OLCF: srun -N N -n 8N -c7 --gpus-per-task=1 --gpu-bind=closest, MASTER_ADDR=$(hostname -i), no torchrun."""
    script = script_for(shipped("frontier"), LaunchRequest(site="frontier", framework="ddp", nodes=2, account="p",
                                                           experiment="exp"))
    lines = script.splitlines()
    assert "#SBATCH --ntasks-per-node=8" in lines and "#SBATCH --cpus-per-task=7" in lines
    assert "srun --ntasks-per-node=8 --kill-on-bad-exit=1 --gpus-per-task=1 --gpu-bind=closest \\" in lines
    assert "torchrun" not in script and 'MASTER_ADDR="$(hostname -i)"' in lines
    assert "module load rocm/6.4.2 rccl-net-plugin olcf-container-tools apptainer-enable-mpi" in lines


def test_perlmutter_uses_podman_hpcs_nccl_plugin_module():
    script = script_for(shipped("perlmutter"), LaunchRequest(site="perlmutter", framework="ddp", nodes=2, experiment="exp"))
    assert "podman-hpc run --rm --gpu --openmpi-pmix --nccl " in script


def test_polaris_picks_its_prod_size_rows():
    for nodes, row, time in ((12, "prod", "03:00:00"), (30, "prod-medium", "06:00:00"), (200, "prod-large", "24:00:00")):
        plan = plan_for(shipped("polaris"), LaunchRequest(site="polaris", nodes=nodes, time=time, account="p", experiment="exp"))
        assert plan.partition == row and "-q prod" in plan.directives
    with pytest.raises(DlaunchError, match="^--time: no partition of site polaris takes 12 node"):
        plan_for(shipped("polaris"), LaunchRequest(site="polaris", nodes=12, time="06:00:00", account="p", experiment="exp"))


@pytest.mark.parametrize("name", ["juwels-booster", "jureca-dc", "jupiter"])
@pytest.mark.parametrize("framework", ["ddp", "deepspeed"])
def test_jsc_jobs_make_the_nodes_gpus_visible_to_the_per_node_launcher(name, framework):
    script = script_for(shipped(name), LaunchRequest(site=name, framework=framework, nodes=2, account="p", experiment="exp"))
    assert "export CUDA_VISIBLE_DEVICES=0,1,2,3\n" in script and "--nproc_per_node=4" in script


def test_task_env_is_set_in_each_task_in_front_of_the_container(tmp_path):
    """pspmix sets PMIX_SECURITY_MODE in every task it starts, over the job script's value: JSC's CARAML puts
    `env PMIX_SECURITY_MODE=native` between srun and `apptainer exec`; a hostile value stays one quoted word."""
    site = profile(tmp_path, BASE + '\n[launch.horovod]\ntask_env = { PMIX_SECURITY_MODE = "native", X = "a b;$(id)" }\n')
    lines = script_for(site, request("horovod")).splitlines()
    assert "  env PMIX_SECURITY_MODE=native 'X=a b;$(id)' apptainer exec --nv --bind /scratch/runs/exp/run " \
           "/images/current-horovod-x86_64.sif \\" in lines
    assert not any("PMIX_SECURITY_MODE" in line for line in script_for(site, request()).splitlines())  # ddp: none
    # fake srun runs its task (options dropped) with PMIX_SECURITY_MODE set as pspmix would; fake apptainer
    # records what the task handed it
    run_with_fakes(tmp_path, script_for(site, request("horovod"), str(tmp_path)),
                   srun='while [ "${1#--}" != "$1" ]; do shift; done; PMIX_SECURITY_MODE=munge exec "$@"\n',
                   apptainer='printf "%s|%s" "$PMIX_SECURITY_MODE" "$X" > "$FAKE_LOG/task.env"\n')
    assert (tmp_path / "task.env").read_text() == "native|a b;$(id)"


def test_smt_false_asks_one_thread_per_core_and_counts_physical_cores(tmp_path):
    """JSC's one-task-per-node scripts: --hint=nomultithread and the physical cores (48 of JUWELS Booster's 96)."""
    text = BASE.replace("threads_per_core = 1", "threads_per_core = 2")
    site = profile(tmp_path, text + "\n[launch.ddp]\nsmt = false\n")
    lines = script_for(site, request()).splitlines()
    assert "#SBATCH --cpus-per-task=32" in lines and "#SBATCH --hint=nomultithread" in lines
    horovod = script_for(site, request("horovod")).splitlines()  # keeps SMT: a quarter of the 64 CPUs
    assert "#SBATCH --cpus-per-task=16" in horovod and "#SBATCH --hint=nomultithread" not in horovod


SHARED = BASE.replace('max_time = "24:00:00"\ndefault = true\n', 'max_time = "24:00:00"\ndefault = true\nshared = true\n'
                      'directives = ["--mem-per-gpu=60G"]\nwhole_node_directives = ["--exclusive"]\n') + \
    '\n[launch]\ngpu_step_options = ["--cpu-bind=mask_cpu:0x1,0x2,0x4,0x8"]\n'


@pytest.mark.parametrize("framework, tasks, cpus", [("horovod", 2, 8), ("ddp", 1, 16)])
def test_a_job_of_part_of_a_shared_node_asks_for_its_share_and_is_not_bound(tmp_path, framework, tasks, cpus):
    """LUMI's small-g: a 2-of-4-GPU job asks half the cores (billed by its GPUs), no --exclusive, and no per-GPU
    CPU masks (the cores they name are not the job's)."""
    site = profile(tmp_path, SHARED)
    lines = script_for(site, request(framework, nodes=1, gpus=2)).splitlines()
    assert "#SBATCH --ntasks-per-node=%d" % tasks in lines and "#SBATCH --cpus-per-task=%d" % cpus in lines
    assert "#SBATCH --mem-per-gpu=60G" in lines and "#SBATCH --exclusive" not in lines
    assert not any("mask_cpu" in line for line in lines)


def test_a_job_of_whole_shared_nodes_asks_them_exclusively_and_binds_each_task_to_its_gpus_cores(tmp_path):
    site = profile(tmp_path, SHARED)
    lines = script_for(site, request("horovod")).splitlines()
    assert "#SBATCH --cpus-per-task=8" in lines and "#SBATCH --exclusive" in lines and "#SBATCH --mem-per-gpu=60G" in lines
    assert any(line.startswith("srun ") and line.endswith(" --cpu-bind=mask_cpu:0x1,0x2,0x4,0x8 \\") for line in lines)
    ddp = script_for(site, request()).splitlines()  # one torchrun per node owns the node: not bound per GPU
    assert not any("mask_cpu" in line for line in ddp)
    unshared = profile(tmp_path, BASE + '\n[launch]\ngpu_step_options = ["--cpu-bind=mask_cpu:0x1,0x2,0x4,0x8"]\n')
    assert any("mask_cpu" in line for line in script_for(unshared, request("horovod", nodes=1, gpus=2)).splitlines())


def test_env_expanded_names_the_jobs_variables_and_nothing_else(tmp_path):
    """A per-user, per-job MIOpen folder (LUMI): `$NAME`s expand when the job runs; anything else the shell would
    act on is refused."""
    site = profile(tmp_path, BASE + '\n[env_expanded]\nMIOPEN_USER_DB_PATH = "/tmp/$USER-miopen-$SLURM_JOB_ID"\n')
    assert 'export MIOPEN_USER_DB_PATH="/tmp/$USER-miopen-$SLURM_JOB_ID"\n' in script_for(site, request())
    for hostile in ("/tmp/$(id)", "/tmp/$USERx", "/tmp/${USER}", "/tmp/`id`", "/tmp/$-", "/tmp/a b", "/tmp/$1"):
        with pytest.raises(DlaunchError, match="env_expanded.A"):
            profile(tmp_path, BASE + "\n[env_expanded]\nA = %r\n" % hostile)
    with pytest.raises(DlaunchError, match="env and env_expanded both set A"):
        profile(tmp_path, BASE.replace("[env]\n", '[env]\nA = "1"\n') + '\n[env_expanded]\nA = "/x"\n')


def test_a_pbs_profile_cannot_ask_for_one_thread_per_core(tmp_path):
    text = (SHIPPED_SITES_DIR / "polaris.toml").read_text().replace("[launch.deepspeed]\n", "[launch.deepspeed]\nsmt = false\n")
    with pytest.raises(DlaunchError, match="launch.deepspeed.smt: a pbs job cannot ask for one thread per core"):
        profile(tmp_path, text)
