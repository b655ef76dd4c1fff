"""deploy.yaml: the models, the YAML reader, byte-size units, and the on-host layout.

- ``models``     the pydantic models of deploy.yaml, ``parse_config`` / ``load_config`` (ConfigError, exit 3).
- ``units``      byte sizes ("80GiB", "40GB") parsed and formatted.
- ``yamlsource`` YAML with the source line of every key; ``yamledit`` sets one key, keeping the rest.
- ``layout``     where things live under a host's deploy_root, and the runtime's port there.

Import the models from this package (``from deployctl.config import DeployConfig``).
"""
from deployctl.config.models import (AnalysisConfig, ContainerConfig, DeployConfig, EngineConfig, HostConfig,
                                     ModelConfig, RolloutConfig, RouterConfig, ServerConfig, ServiceConfig, SloConfig,
                                     load_config, parse_config)

__all__ = ["AnalysisConfig", "ContainerConfig", "DeployConfig", "EngineConfig", "HostConfig", "ModelConfig",
           "RolloutConfig", "RouterConfig", "ServerConfig", "ServiceConfig", "SloConfig", "load_config", "parse_config"]
