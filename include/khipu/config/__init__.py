"""Khipu's settings: one typed model of every ``KHIPU_*`` variable (:mod:`khipu.config.model`), loaded
section by section from the environment and an optional settings file (:mod:`khipu.config.load`).

Importing this package loads pydantic; the tracing library imports it only when an application asks it to
read its settings.
"""

from __future__ import annotations

from khipu.config.load import (
    SETTINGS_FILE_VARIABLE,
    Loaded,
    SettingsError,
    Shown,
    Source,
    effective_settings,
    load,
    load_with_sources,
    markdown_table,
    readme_list,
    settings_file,
    unknown_variables,
    variable_names,
)
from khipu.config.model import (
    SECTIONS,
    AlertSection,
    DetectorSection,
    ExporterSection,
    HealthSection,
    KafkaSecuritySection,
    KhipuSection,
    NotifierSection,
    ReconcileSection,
    ResendSection,
    RetentionSection,
    Section,
    SparkSection,
    SupervisionSection,
    TracingSection,
    ViewSection,
    default,
    mask_url_password,
    project_root,
)

__all__ = [
    "SECTIONS",
    "SETTINGS_FILE_VARIABLE",
    "AlertSection",
    "DetectorSection",
    "ExporterSection",
    "HealthSection",
    "KafkaSecuritySection",
    "KhipuSection",
    "Loaded",
    "NotifierSection",
    "ReconcileSection",
    "ResendSection",
    "RetentionSection",
    "Section",
    "SettingsError",
    "Shown",
    "Source",
    "SparkSection",
    "SupervisionSection",
    "TracingSection",
    "ViewSection",
    "default",
    "effective_settings",
    "load",
    "load_with_sources",
    "mask_url_password",
    "markdown_table",
    "readme_list",
    "project_root",
    "settings_file",
    "unknown_variables",
    "variable_names",
]
