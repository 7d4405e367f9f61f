"""Per-device autotuning: MetaSchedule + XGBoost, device-keyed JSON databases, RPC measurement.

`tune_model` lives in `nxrt_tvm.tuning.tune` (it builds on the providers, which read databases from here).
"""

from .database import TuningDatabase, open_database
from .device import device_key

__all__ = ["TuningDatabase", "open_database", "device_key"]
