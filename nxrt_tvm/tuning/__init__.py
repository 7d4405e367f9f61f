"""Per-device autotuning: MetaSchedule + XGBoost search, RPC measurement (`nxrt_tvm.tuning.tune`).

What tuning writes is read and applied at compile time by `nxrt_tvm.lower.tuned`, under the device
keys of `nxrt_tvm.lower.device_key`; both are re-exported here for tuning users.
"""

from ..lower.device_key import device_key
from ..lower.tuned import TuningDatabase, open_database

__all__ = ["TuningDatabase", "open_database", "device_key"]
