"""A fake of NVML (nvidia-ml-py's `pynvml` calls that dlaunch/train/energy.py and dlaunch/train/gpuhealth.py make):
this machine has no NVIDIA GPU, so the tests feed those modules this object instead of the real binding."""
from types import SimpleNamespace


class FakeNvml:
    """One fake GPU: an energy counter in mJ, a utilisation, an SM clock and its maximum, clock event reasons
    (bits as in nvml.h) and a temperature, each set by the test. `event_reasons=False` fakes an nvidia-ml-py
    before 12.535, which names the reasons call nvmlDeviceGetCurrentClocksThrottleReasons."""

    class NVMLError(Exception):
        pass

    def __init__(self, sm_clock_mhz: float = 1410, max_sm_clock_mhz: float = 1410, reasons: int = 0,
                 temperature_c: float = 55, event_reasons: bool = True, remapped_rows=(0, 0, 0, 0),
                 pages_pending=None, ecc_uncorrected=0):
        # remapped_rows: (corrected, uncorrected, pending, failure) as nvmlDeviceGetRemappedRows returns them (an H200
        # with driver 580.159.04 answered (0, 0, 0, 0), retired pages "Not Supported", volatile ECC 0), None:
        # not supported (a GPU before the A100), then pages_pending (0/1; None: not supported); ecc_uncorrected None:
        # ECC off
        self.remapped_rows, self.pages_pending, self.ecc_uncorrected = remapped_rows, pages_pending, ecc_uncorrected
        self.mj, self.by = 5_000, []
        self.sm_clock_mhz, self.max_sm_clock_mhz = sm_clock_mhz, max_sm_clock_mhz
        self.reasons, self.temperature_c = reasons, temperature_c
        name = "nvmlDeviceGetCurrentClocksEventReasons" if event_reasons else "nvmlDeviceGetCurrentClocksThrottleReasons"
        setattr(self, name, lambda handle: self.reasons)

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, index):
        self.by.append(("index", index))
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.by.append(("uuid", uuid))
        return uuid

    def nvmlDeviceGetName(self, handle):
        return b"Fake H100"

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        return self.mj

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetClockInfo(self, handle, clock):
        if clock != 1:  # NVML_CLOCK_SM
            raise self.NVMLError("the fake knows the SM clock only")
        return self.sm_clock_mhz

    def nvmlDeviceGetMaxClockInfo(self, handle, clock):
        if clock != 1:
            raise self.NVMLError("the fake knows the SM clock only")
        return self.max_sm_clock_mhz

    def nvmlDeviceGetRemappedRows(self, handle):
        if self.remapped_rows is None:
            raise self.NVMLError("Not Supported")
        return self.remapped_rows

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle):
        if self.pages_pending is None:
            raise self.NVMLError("Not Supported")
        return self.pages_pending

    def nvmlDeviceGetTotalEccErrors(self, handle, error_type, counter_type):
        if self.ecc_uncorrected is None or (error_type, counter_type) != (1, 0):  # uncorrected, volatile
            raise self.NVMLError("Not Supported")
        return self.ecc_uncorrected

    def nvmlDeviceGetTemperature(self, handle, sensor):
        if sensor != 0:  # NVML_TEMPERATURE_GPU
            raise self.NVMLError("the fake knows the GPU sensor only")
        return self.temperature_c
