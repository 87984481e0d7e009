"""Two real gloo ranks (torchrun) against a single-process replay of the same data-parallel maths."""
import pytest
import torch

from helpers_train import TINY, assert_ok, load_model_state, run_trainer
from dlaunch.train.config import parse_config
from dlaunch.train.data.synthetic import synthetic_batch
from dlaunch.train.loop import build_optimizer
from dlaunch.train.metrics_schema import read_metrics
from dlaunch.train.models import build_model
from dlaunch.train.schedule import LRSchedule

pytestmark = pytest.mark.slow  # real multi-process / multi-epoch training runs

STEPS, WARMUP_STEPS, PROFILE_STEPS, KERNEL_PROFILE_STEPS, WORLD = 4, 1, 1, 1, 2
# lr_max = 0.05 * 8 / 4 = 0.1; warm-up 0.05 -> 0.1 over 2 steps, then cosine to 0 over 2 steps.
ARGS = TINY + ["--num-classes", "5", "--steps", str(STEPS), "--steps-per-epoch", str(STEPS),
               "--warmup-steps", str(WARMUP_STEPS), "--profile-steps", str(PROFILE_STEPS),
               "--kernel-profile-steps", str(KERNEL_PROFILE_STEPS),
               "--lr", "0.05", "--reference-batch", "4", "--warmup-epochs", "0.5", "--schedule", "cosine",
               "--seed", "3"]
PROVENANCE = {"DLAUNCH_SITE": "testsite", "DLAUNCH_EXPERIMENT": "exp-1", "DLAUNCH_IMAGE": "/images/t.sif",
              "DLAUNCH_GIT_REVISION": "abc123", "DLAUNCH_JOB_ID": "4242"}


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ddp")
    result = run_trainer(ARGS + ["--checkpoint-dir", str(run_dir)], nproc=WORLD, env=PROVENANCE)
    assert_ok(result)
    return run_dir


@pytest.fixture(autouse=True)
def one_thread():
    """The ranks ran with 1 thread each; so does the replay (tiny BN batches amplify rounding)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def replay(shards):
    """One process: per step, each shard's gradient (train-mode BN per shard), averaged, one SGD step."""
    cfg = parse_config(ARGS)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, cfg.num_classes)
    optimizer = build_optimizer(model, cfg)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing)
    schedule = LRSchedule(cfg.lr, cfg.reference_batch, cfg.batch_size * WORLD, STEPS, STEPS, cfg.schedule,
                          cfg.warmup_epochs, cfg.lr_min, cfg.gamma)
    batches = [synthetic_batch(cfg, rank) for rank in shards]
    for step in range(STEPS):
        grads = []
        for images, labels in batches:
            model.zero_grad()
            criterion(model(images), labels).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for p, *per_shard in zip(model.parameters(), *grads):
            p.grad = torch.stack(per_shard).mean(dim=0)
        for group in optimizer.param_groups:
            group["lr"] = schedule(step)
        optimizer.step()
    return dict(model.named_parameters())


def test_ranks_end_bit_identical(ddp_run):
    end = read_metrics(str(ddp_run / "metrics.jsonl")).end
    assert end["status"] == "ok"
    digests = end["param_digests"]
    assert len(digests) == WORLD and len(set(digests)) == 1


def test_parameters_equal_a_replay_of_averaged_per_shard_gradients(ddp_run):
    trained = load_model_state(str(ddp_run))
    expected = replay(shards=range(WORLD))
    rank0_only = replay(shards=[0])
    torch.manual_seed(parse_config(ARGS).seed)
    initial = dict(build_model("resnet18", 5).named_parameters())
    moved = far_from_rank0_only = 0
    for name, value in expected.items():
        torch.testing.assert_close(trained[name], value.detach(), rtol=1e-4, atol=1e-5, msg=name)
        moved += not torch.allclose(value, initial[name], rtol=1e-3, atol=1e-4)
        far_from_rank0_only += not torch.allclose(value, rank0_only[name], rtol=1e-3, atol=1e-4)
    assert moved > len(expected) // 2  # training really changed the parameters
    assert far_from_rank0_only > len(expected) // 2  # and rank 1's gradients really took part


def test_metrics_header_throughput_profile_and_lr(ddp_run):
    metrics = read_metrics(str(ddp_run / "metrics.jsonl"))
    header = metrics.header
    assert (header["world_size"], header["nodes"], len(header["hosts"])) == (WORLD, 1, WORLD)
    assert (header["batch_per_worker"], header["global_batch"]) == (4, 8)
    assert header["lr_scaled"] == pytest.approx(0.1)
    assert header["versions"]["torch"] == torch.__version__
    assert (header["site"], header["experiment"], header["image"], header["git_revision"], header["slurm_job_id"]) \
        == ("testsite", "exp-1", "/images/t.sif", "abc123", "4242")
    [epoch] = metrics.epochs
    assert epoch["steps"] == STEPS
    assert epoch["images"] == (STEPS - WARMUP_STEPS - PROFILE_STEPS - KERNEL_PROFILE_STEPS) * 8  # only measured steps
    assert epoch["images_per_s"] > 0
    # The last step (3) is 1 of 2 steps into the cosine: 0.5 * 0.1 * (1 + cos(pi / 2)).
    assert epoch["lr"] == pytest.approx(0.05)
    [profile] = metrics.profiles
    assert profile["steps"] == PROFILE_STEPS and profile["method"] == "unoverlapped-timers"
    assert 0 < profile["compute_s"] < profile["step_s"] and 0 < profile["comm_s"] < profile["step_s"]
    # The kernel profile is a separate measure; a CPU run has no CUDA kernels and says so.
    [kernels] = metrics.kernel_profiles
    assert (kernels["steps"], kernels["ranks"], kernels["method"]) == (KERNEL_PROFILE_STEPS, WORLD, "cuda-kernel-time")
    assert kernels["comm_s"] == kernels["kernel_s"] == "unavailable: no CUDA device (a cpu run)"
    assert metrics.end["epochs_completed"] == 1
