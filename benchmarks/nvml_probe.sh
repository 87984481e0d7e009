set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 - <<'PY'
import pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
print("driver", n.nvmlSystemGetDriverVersion(), "nvml-py", getattr(n, "__version__", "?"))
for name, call in [("remapped_rows", lambda: n.nvmlDeviceGetRemappedRows(h)),
                   ("retired_pending", lambda: n.nvmlDeviceGetRetiredPagesPendingStatus(h)),
                   ("ecc_unc_volatile", lambda: n.nvmlDeviceGetTotalEccErrors(h, 1, 0)),
                   ("ecc_mode", lambda: n.nvmlDeviceGetEccMode(h))]:
    try:
        print(name, repr(call()))
    except n.NVMLError as e:
        print(name, "NVMLError", type(e).__name__, e)
PY
timeout 120 python3 -m dlaunch.train.nodecheck check --dir /tmp/nc --attempt probe && python3 -c "
import json,glob; r=json.load(open(glob.glob('/tmp/nc/*.json')[0])); print(json.dumps(r['devices']))"
