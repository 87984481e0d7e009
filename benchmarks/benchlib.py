"""What every benchmark script shares: writing its results atomically, with date and machine."""
import datetime
import json
import os
import platform
from typing import Any, Dict

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def save_results(name: str, data: Dict[str, Any]) -> str:
    """Write benchmarks/results/<name>.json (tmp file + fsync + rename); return its path."""
    record = {"benchmark": name, "date": datetime.date.today().isoformat(),
              "machine": {"host": platform.node(), "cpus": os.cpu_count(),
                          "processor": platform.processor() or platform.machine()}}
    record.update(data)
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, name + ".json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path
