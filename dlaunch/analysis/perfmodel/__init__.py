"""Performance model v3: step time, throughput, E_G, NCCL kernel shares and run time from one model (`dlaunch predict`).

The machine (nccl.py: NCCL's cost model, the ranks' timing noise, the storage; inside a node the site's own figure)
is kept apart from the workload (compute, data and other time per step, gradient bytes, framework, the loader's
rate). A machine is fitted once per site, from published data (`--calibrated`, the default on the machine it was
fitted on) or the user's own runs (`--from-runs`, of that site, GPU kind and model), and then applied unchanged to
every model, batch and framework. Every figure names its source: the compute time a row of a shipped table carried by
stated rules (compute.py), the machine's figures the site profile's.

One step on p GPUs, timed from the end of the previous step's last collective (all ranks leave it
together):

    busy      other + data + compute (forward, then back-propagation = 2/3 of compute): the step's
              work on one rank, without communication. `compute` is all the GPU's kernel time other
              than NCCL's (cuDNN, element-wise, optimizer, and a GPU loader's I/O kernels).
    messages  DDP: gradient buckets (1 MiB first, then 25 MiB), ready one after another during
              back-propagation (by gradient bytes) and all-reduced in order, overlapping it; Horovod:
              buffers of the fusion threshold, likewise; DeepSpeed ZeRO-0: all-reduce after
              back-propagation; ZeRO-1/2: reduce-scatter of the gradients plus all-gather of the
              updated parameters, after back-propagation.
    lag(t)    how much later than the others the slowest rank reaches time t of the step:
              sqrt(noise_s * t) * S_p, the host and OS delays it accumulated since the step began
              (S_p = straggler_factor(p), nccl.py), plus data * S_p / sqrt(batch) for a
              loader that cannot keep up (`loader_spread`: a batch's samples are read one after
              another, each with an exponential delay).
    kernel    NCCL kernel time per step (what NSys profiles count, Aach et al. 2023 Table 2a): the
              transfers, plus each message's wait for its slowest peer, lag(ready) (its kernel
              starts when the own rank is ready and spins until every rank has joined, while
              back-propagation goes on beside it; kernels run one after another on one NCCL stream,
              so a wait ends at the latest when the next message is ready), plus beside_compute x
              the back-propagation the messages overlap (kernels waiting for the next bucket and
              slowed by sharing the GPU). comm share = kernel / (kernel + compute).
    exposed   what the step waits for beyond its work: the transfers left over after
              back-propagation and the last message's wait, lag(busy) (and a storage stall, below).
              The earlier waits are hidden behind back-propagation: kernel time counts every
              message's wait, the step only the last one.
    step      busy + exposed.
    epoch     steps = ceil(images / (p * batch)) per epoch (ImageNet-1k's 1,281,167 training images unless
              given another size), and the epoch's overhead outside its steps, O(p) seconds (loader start,
              validation, checkpoint, barriers, logging: `--epoch-overhead`, the runs' measured mean with
              `--from-runs`, or Aach et al.'s setup with `--calibrated`, `PaperOverhead`), shared by its steps
              as metrics-v4's reader shares it:  X = p * batch / (step + O / steps);
              E_G = (X_G / X_ref) / (G / G_ref). A run of E epochs: E * (steps * step + O) (start-up left out).
    storage   a loader that reads every sample as a file (native) on a file system that sustains R
              images/s: p GPUs cannot step faster than p * batch / R. The stall is every rank's extra
              data wait, with the spread of any data wait: the slowest rank's adds to lag, so the
              others' kernels wait for it at every message.
    input     a loader decodes and augments at a rate (images/s per GPU: the site's [[predict.input]] row, measured
              with `python -m dlaunch.train.loaderbench`; calibrated, the paper's 8 threads at the rate measured
              here): it prefetches beside the step, so a step is at least batch / rate (`input_bound`); the
              GPU's wait is the input wait, and `bound` says what set the step: compute, input or storage.
    precision the published compute time is a row of the precision asked, one the site's GPU has (the
              A100's TF32 or mixed-precision figure); Aach et al.'s DeepSpeed runs are assumed fp16 (`paper_precision`, printed by `predict`), which gives
              DeepSpeed a faster one-node reference behind the same file system, hence a lower E_G.
    profiled  what the trainer's `--profile-steps` measures (un-overlapped timers): one ring
              all-reduce of all gradients after compute, which waits lag(busy) for the slowest
              rank; profiled comm share = comm / (comm + compute + data).

The timing noise is a machine property in seconds (the variance of a rank's delay per second of
work), so a model with more work per step loses a smaller fraction of it to stragglers.

Fits (fit.py). `fit_machine`: noise_s and beside_compute from kernel-time comm shares; `fit_loader_stall`: the
data wait of a loader that cannot keep up; `fit_runs`: the network and the noise from the user's runs (their
profiled all-reduce and wall-clock step time), with a leave-one-out error of step time and profiled comm share
(`leave_one_out`); paper.py's `fit_storage`: the file system's images/s from published E_G statements (each
framework with the paper's workload, `paper_workload`). All fits are a few parameters solved in pure Python
(`dlaunch predict` starts without numpy).

The modules, each importing only those above it: nccl.py (the machine: NCCL's cost per collective, the ranks'
timing noise), model.py (the workload, one step on p GPUs, the epoch, `predict`), compute.py (a step's compute time
from a published row and the rules that carry it; the GPUs, their precisions, the collective library), overhead.py
(an epoch's time outside its steps: stated, measured, or Aach et al.'s setup), fit.py (the machine fitted to
kernel-time shares or to the user's runs, and where those runs were made), paper.py (Aach et al.'s published tables
and statements, the fit on them, the file system's ceiling, the paper's loaders), prediction.py (`prediction`: what
`dlaunch predict` computes from its options, all the numbers; dlaunch/cli/predict.py prints them).
"""
