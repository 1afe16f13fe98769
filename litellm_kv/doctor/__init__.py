"""``litellm-kv doctor``: checks a running deployment end to end from its LiteLLM config file."""

from litellm_kv.doctor.report import Finding, Report, Status
from litellm_kv.doctor.runner import DoctorOptions, run_doctor

__all__ = ["DoctorOptions", "Finding", "Report", "Status", "run_doctor"]
