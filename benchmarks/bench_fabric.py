"""Pre-flight's fabric check on a 3-node test cluster (issue 44 item 3): a node whose link is slowed is named and left
out, on a cluster of its own (scripts/slurm-cluster.sh, 3 nodes, /tmp/dlaunch-slurm-fabric).

  flock /tmp/dlaunch-heavy.lock .venv/bin/python benchmarks/bench_fabric.py [--rate 20mbit]

Two jobs, each `dlaunch run --nodes 1 --preflight --spare-nodes 2` (3 nodes checked, 1 trained on): first with every
link as it is, then with dl-node3's link limited to `--rate` (a token bucket on its interface, `tc qdisc ... tbf`,
in its network namespace: a NIC that came up at a fraction of its speed). Prints each job's pairs, the threshold and
who was left out; writes benchmarks/results/bench_fabric.json. Needs root and no other test cluster running (the
nodes' namespaces have fixed names): run it under the heavy lock.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import slurm  # noqa: E402  (tests/slurm.py: the cluster's helpers)

DIR = Path("/tmp/dlaunch-slurm-fabric")
DLAUNCH = os.path.join(os.path.dirname(sys.executable), "dlaunch")
TINY = ["--model", "resnet18", "--image-size", "32", "--num-classes", "10", "--batch-size", "4", "--threads", "1",
        "--device", "cpu", "--data", "synthetic", "--workers", "0", "--warmup-steps", "1", "--steps-per-epoch", "2"]


def limit(node: str, rate: str) -> None:
    subprocess.run(["ip", "netns", "exec", node, "tc", "qdisc", "replace", "dev", "dl0", "root", "tbf", "rate", rate,
                    "burst", "32kbit", "latency", "400ms"], check=True)


def lift(node: str) -> None:
    subprocess.run(["ip", "netns", "exec", node, "tc", "qdisc", "del", "dev", "dl0", "root"], check=False,
                   stderr=subprocess.DEVNULL)


def job(cluster: "slurm.Cluster", work: Path, site: Path, name: str) -> dict:
    env = cluster.env(PYTHONPATH=str(REPO))
    started = time.monotonic()
    ran = subprocess.run([DLAUNCH, "run", "--site", str(site), "--experiment", "fabric", "--run-name", name, "--time",
                          "00:10:00", *TINY, "--nodes", "1", "--preflight", "--spare-nodes", "2", "--steps", "2"],
                         cwd=work, env=env, capture_output=True, text=True)
    if ran.returncode != 0:
        raise SystemExit("dlaunch run failed: %s" % ran.stderr)
    run_dir = work / "runs" / "fabric" / name
    state = cluster.wait_job((run_dir / "job_id").read_text().strip(), 600)
    record = json.loads((run_dir / "preflight.json").read_text())
    return {"state": state, "seconds": time.monotonic() - started, "fabric": record["fabric"],
            "chosen": record["chosen"], "left_out": record["left_out"]}


def show(name: str, found: dict) -> None:
    fabric = found["fabric"]
    print("\n%s: job %s in %.0f s; all-reduce over 3 nodes %.3g GB/s; threshold %.3g GB/s (%g x the nodes' median "
          "best pair %.3g)" % (name, found["state"], found["seconds"], fabric["all_gbps"], fabric["min_gbps"],
                               fabric["min_fraction"], fabric["median_best_pair_gbps"]))
    for pair in fabric["pairs"]:
        print("  %-22s %8.3g GB/s" % (" - ".join(pair["hosts"]), pair["gbps"]))
    print("  chosen: %s; left out: %s" % (", ".join(found["chosen"]), "; ".join(
        "%s (%s)" % (n["host"], "; ".join(n["reasons"])) for n in found["left_out"]) or "none"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", default="20mbit")
    args = parser.parse_args()
    slurm.stop_cluster(DIR)
    cluster = slurm.start_cluster(DIR, 3, pin_cores=True)
    results = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            site = cluster.site_profile(work / "fabric.toml", extra={"preflight": {"min_fraction": 0.5}})
            results["healthy"] = job(cluster, work, site, "healthy")
            show("every link as it is", results["healthy"])
            limit("dl-node3", args.rate)
            try:
                results["slowed"] = job(cluster, work, site, "slowed")
            finally:
                lift("dl-node3")
            show("dl-node3 limited to %s" % args.rate, results["slowed"])
    finally:
        slurm.stop_cluster(DIR)
    out = REPO / "benchmarks" / "results" / "bench_fabric.json"
    out.write_text(json.dumps(dict(results, rate=args.rate, date=time.strftime("%Y-%m-%d")), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
