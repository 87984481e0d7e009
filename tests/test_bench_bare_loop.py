"""benchmarks/bare_loop_gpu.py, the bare loop the trainer is measured against, on the CPU (no GPU here): it takes
the trainer's workload options (--compile, --cuda-graphs, --optimizer-impl, --host-syncs) and refuses the
combinations it cannot run in one line. Its GPU figures: benchmarks/gpu_validate.sh and benchmarks/README.md."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bare_loop_gpu.py"
SMALL = ["--device", "cpu", "--model", "resnet18", "--image-size", "32", "--batch-size", "4"]


def load_bare_loop():
    spec = importlib.util.spec_from_file_location("bare_loop_gpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # ~47 s where inductor's cache (tests/conftest.py: build_caches) is cold, ~8 s where it is warm
def test_compiled_bare_loop_trains_on_the_cpu_and_reports_compile_time_apart():
    done = subprocess.run([sys.executable, str(SCRIPT)] + SMALL + ["--compile", "default", "--steps", "5",
                                                                  "--warmup-steps", "3"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    [line] = done.stdout.splitlines()
    result = json.loads(line)
    assert result["compile"] == "default" and result["model"] == "resnet18" and result["device"] == "cpu"
    assert result["compiled_graphs"] >= 1 and result["graph_breaks"] == 0  # ResNet compiles whole
    assert result["images_per_s"] > 0 and 0 < result["first_step_s"] <= result["warmup_s"]
    assert any(Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]).rglob("*.py"))  # inductor's code for the model


def test_fused_optimizer_with_minimal_host_syncs_runs_bf16_channels_last_on_the_cpu(capsys):
    argv = SMALL + ["--amp", "bf16", "--channels-last", "--optimizer-impl", "fused", "--host-syncs", "minimal",
                    "--steps", "3", "--warmup-steps", "1"]
    assert load_bare_loop().main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert {k: result[k] for k in ("amp", "channels_last", "optimizer_impl", "host_syncs", "compile", "cuda_graphs")} == \
        {"amp": "bf16", "channels_last": True, "optimizer_impl": "fused", "host_syncs": "minimal", "compile": "off",
         "cuda_graphs": False}
    assert result["images_per_s"] > 0 and result["compiled_graphs"] == 0
    assert result["host_syncs_checked"] is False  # torch's sync check exists on CUDA only


@pytest.mark.parametrize("options, flag", [
    (["--cuda-graphs", "--amp", "bf16"], "--cuda-graphs needs --device cuda"),
    (["--amp", "fp16"], "--amp fp16 needs --device cuda"),
    (["--host-syncs", "minimal", "--amp", "fp16", "--optimizer-impl", "foreach"],
     "--host-syncs minimal with --amp fp16 needs --optimizer-impl fused"),
    (["--cuda-graphs", "--amp", "fp16"], "--cuda-graphs with --amp fp16 needs --optimizer-impl fused"),
    (["--cuda-graphs", "--compile", "reduce-overhead"], "--cuda-graphs with --compile reduce-overhead"),
    (["--cuda-graphs", "--warmup-steps", "3"], "--cuda-graphs needs --warmup-steps > 3"),
    (["--steps", "5", "--warmup-steps", "5"], "--warmup-steps 5 leaves none of the --steps 5"),
    (["--compile", "fast"], "argument --compile: invalid choice: 'fast'"),
])
def test_options_it_cannot_run_are_refused_in_one_line_naming_the_flag(options, flag, capsys):
    with pytest.raises(SystemExit) as exit_:
        load_bare_loop().main(SMALL + options)
    captured = capsys.readouterr()
    assert exit_.value.code == 2 and captured.out == ""
    assert captured.err.startswith("bare_loop_gpu.py: error: " + flag) and captured.err.count("\n") == 1


@pytest.mark.slow  # ~30 s: two trainer runs and two bare loops of ResNet-18 at 32 px
def test_gpu_validate_rehearsed_on_the_cpu_pairs_the_halves_shows_refusals_and_skips_what_does_not_fit(tmp_path):
    """The bench group of benchmarks/gpu_validate.sh on the CPU: a pair that runs, one both halves refuse (fp16 needs
    CUDA), one whose estimate (max-autotune: 420 s) is over the whole budget, so it is skipped whatever the clock says."""
    env = dict(os.environ, GPU_VALIDATE_ONLY="bench", GPU_VALIDATE_DEVICE="cpu", GPU_VALIDATE_MODEL="resnet18",
               GPU_VALIDATE_IMAGE_SIZE="32", GPU_VALIDATE_STEPS="5 2", GPU_VALIDATE_BUDGET_S="300",
               GPU_VALIDATE_WORK=str(tmp_path / "work"), GPU_VALIDATE_PYTHON=sys.executable,
               GPU_VALIDATE_PAIRS="8:none;8:fp16;8:none --compile max-autotune-no-cudagraphs")
    done = subprocess.run(["bash", str(SCRIPT.parent / "gpu_validate.sh"), str(tmp_path / "out")], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert done.returncode == 0, done.stdout
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    ran, refused, skipped = results["pairs"]
    assert (ran["bare"], ran["trainer"], ran["status"]) == ("ok", "ok", "ran")
    assert ran["trainer_over_bare"] == ran["trainer_images_per_s"] / ran["bare_images_per_s"] > 0
    assert (refused["bare"], refused["trainer"]) == ("refused", "refused")
    assert refused["notes"] == ["bare loop refused: bare_loop_gpu.py: error: --amp fp16 needs --device cuda "
                                "(use --amp bf16 on the CPU)",
                                "trainer refused: train: error: --amp fp16 needs --device cuda (use --amp bf16 on CPU)"]
    assert (skipped["status"], skipped["bare"], skipped["trainer"]) == ("skipped", None, None)
    assert results["best"]["trainer"]["pair"] == "p1-r1"
    assert results["best"]["trainer"]["fraction_of_mlperf"] == ran["trainer_images_per_s"] / 7160
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "## Best configuration on this device" in summary and "skipped: its estimate (420 s)" in summary
    assert (tmp_path / "out" / "logs.tar.gz").stat().st_size > 0
