"""Typed pipeline configuration: YAML -> dataclasses, with defaults and a docstring per field.

The dataclasses of `sections.py` are the single source of truth; `loading.py` reads YAML or JSON into them
(unknown keys and bad values fail at load, naming the key) and `schema.py` generates `configs/schema.yaml`, which
Snakemake validates before any job runs (`python -m pipeline schema > configs/schema.yaml`; a test checks the
committed schema is current). Everything a caller needs is importable from `pipeline.plan.config`.
"""

from pipeline.plan.config.loading import (  # noqa: F401 (the package's interface)
    from_dict, to_dict, load_config, config_from_json, deep_merge,
)
from pipeline.plan.config.schema import (  # noqa: F401 (the package's interface)
    schema_for_dataclass, pipeline_schema, pipeline_schema_yaml, print_schema_main,
)
from pipeline.plan.config.sections import (  # noqa: F401 (the package's interface)
    ConfigError, option, section, SyntheticConfig, DataConfig, TokenizerConfig, TrainConfig,
    TeacherArchitectureConfig, TeacherConfig, SquadConfig, StudentConfig, DistillPretrainConfig,
    DistilBertObjectiveConfig, PKDObjectiveConfig, TinyBERTObjectiveConfig, SquadAugmentationConfig,
    DistillSquadConfig, QuantizeConfig, CoreMLConfig, NpuConfig, GatesConfig, FullSizeConfig, ExportConfig,
    BenchmarkConfig, ComputeConfig, STUDY_VARIANTS, StudyConfig, DeployConfig, PipelineConfig,
)
