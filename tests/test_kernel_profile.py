"""Table 2's measure: CUDA kernel time per class (dlaunch/train/profiling.py), on kernel records shaped like the
PyTorch profiler's. No GPU here: the records are fakes, real torch FunctionEvent objects built by the
test with device_type CUDA and kernel names as NCCL, cuDNN, cuBLAS, DALI and PyTorch name their kernels;
the classification and aggregation are the trainer's own, and so is the path from the `kernel_profile`
record to `dlaunch report` and a study's published comparison."""
import json
from pathlib import Path

import pytest
import torch
from torch.autograd.profiler_util import FunctionEvent

from dlaunch.analysis.published import read_published
from dlaunch.analysis.scaling import KernelShares, load_runs, run_values
from dlaunch.train.metrics_schema import make_record, read_metrics
from dlaunch.train.profiling import KERNEL_CLASSES, KernelTimes, device_kernels, kernel_class, kernel_fields

# (name, class): names of real kernels and GPU memory operations as the profiler reports them.
KERNELS = [
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "comm"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "comm"),
    ("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4_warpsize2x2x1_g1_tensor16x8x8_execute_kernel__5x_cudnn", "compute"),
    ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1>(cudnnTensorStruct, float const*)", "compute"),
    ("ampere_scudnn_winograd_128x128_ldg1_ldg4_relu_tile148t_nt_v1", "compute"),
    ("ampere_sgemm_128x64_tn", "compute"),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4>(cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4::Params)", "compute"),
    ("Memcpy HtoD (Pinned -> Device)", "io"),
    ("void dali::kernels::SliceFlipNormalizePermutePadGpu<float, unsigned char, 3>(dali::kernels::SliceFlipNormalizeParams const*)", "io"),
    ("void nvjpeg::decodeHuffman(...)", "io"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>, at::detail::Array<char*, 3> >(int, at::native::AddFunctor<float>, at::detail::Array<char*, 3>)", "other"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<...>", "other"),
    ("Memcpy DtoH (Device -> Pageable)", "other"),
    ("Memset (Device)", "other"),
]


def fake_kernel_event(name: str, start_us: float, end_us: float, device: str = "cuda") -> FunctionEvent:
    """A fake profiler record: a real FunctionEvent as `profile.events()` holds one for a GPU kernel."""
    device_type = torch.autograd.DeviceType.CUDA if device == "cuda" else torch.autograd.DeviceType.CPU
    return FunctionEvent(id=0, name=name, thread=0, start_us=start_us, end_us=end_us, device_type=device_type)


@pytest.mark.parametrize("name, kind", KERNELS)
def test_kernels_are_classed_by_name(name, kind):
    assert kernel_class(name) == kind


def test_kernel_time_per_class_from_profiler_records_leaves_out_cpu_events():
    events = [fake_kernel_event(name, 10.0 * i, 10.0 * i + 1.0 + i) for i, (name, _) in enumerate(KERNELS)]
    events.append(fake_kernel_event("aten::conv2d", 0.0, 5000.0, device="cpu"))  # a CPU op: not kernel time
    times = KernelTimes()
    times.add(device_kernels(events))
    expected = {kind: sum(1.0 + i for i, (_, k) in enumerate(KERNELS) if k == kind) for kind in KERNEL_CLASSES}
    assert times.by_class == pytest.approx(expected)
    top = times.top(per_class=1)
    assert top["comm"] == [[KERNELS[1][0], pytest.approx(2e-6)]]  # the longer of the two NCCL kernels
    assert top["other"][0][0] == "Memset (Device)"


def test_kernel_profile_record_reaches_the_analysis_as_the_papers_shares(tmp_path):
    # two ranks' seconds per class, summed: comm 2, compute 5, io 1, other 2 of 10 s
    fields = kernel_fields([2.0, 5.0, 1.0, 2.0], steps=100, ranks=8, top={"comm": [["ncclKernel_x", 1.0]]})
    records = [make_record("header", 1.0, run_id="r", argv=["python", "-m", "dlaunch.train"], config={}, framework="ddp",
                           loader="dali", model="resnet50", device="cuda", world_size=8, nodes=2,
                           hosts=["a"] * 4 + ["b"] * 4, batch_per_worker=64, global_batch=512, lr_scaled=0.2,
                           versions={}, slurm_job_id=None, site="juwels-booster", experiment="aach2023.table2a",
                           image=None, git_revision=None),
               make_record("kernel_profile", 2.0, **fields),
               make_record("end", 3.0, status="ok", total_time_s=3.0, epochs_completed=1)]
    run_dir = tmp_path / "aach2023.table2a" / "r"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert read_metrics(str(run_dir / "metrics.jsonl")).kernel_profiles[0]["kernel_s"] == 10.0
    (run,) = load_runs([str(tmp_path)]).runs
    assert run.kernel_shares == KernelShares(0.2, 0.5, 0.1) and run.throughput is None  # a profile-only run
    assert run_values([run], "kernel_comm_share") == {8: [0.2]} and run_values([run], "comm_share") == {}


def test_published_table_2a_reads_as_fractions_of_kernel_time():
    published = read_published(Path(__file__).resolve().parents[1] / "data" / "published" / "aach2023_table2a.csv",
                               "dali_comm", [], {}, percent=True)
    assert published[0] == (4, pytest.approx(0.154)) and published[-1] == (1024, pytest.approx(0.4618))


def test_a_cpu_run_has_no_kernel_shares():
    unavailable = {k: "unavailable: no CUDA device (a cpu run)" for k in ("kernel_s", "comm_s", "compute_s", "io_s")}
    assert KernelShares.from_record(unavailable) is None
